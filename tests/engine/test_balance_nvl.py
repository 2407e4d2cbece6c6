"""R²CCL balance and NVL transit as outcomes of `reconcile`: exact weights, split and GPUs.

The stories run on the engine only, as the service runs it: the desired state of one
pass is the previous of the next, and the commands are `command_diff` from what was
commanded.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from railover_testing.cluster_shapes import hgx_node
from scheduler_svc.engine import coordination as coord
from scheduler_svc.engine.fabric import ClearingRules, Evidence, FaultEvidence, FaultKind, assess
from scheduler_svc.engine.intents import Intent, IntentKind, command_diff
from scheduler_svc.engine.mitigations import channel_weights
from scheduler_svc.engine.paths import Gpu, NodeTopology, Rnic, plan_node
from scheduler_svc.engine.reconcile import reconcile
from scheduler_svc.engine.state import CommSpec, Desired, FabricView, JobState, Mode, Options

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
RULES = ClearingRules(damping_s=120, quiet_s=300)


def topo(name: str, rails: int) -> NodeTopology:
    body: dict[str, Any] = hgx_node(rails=rails)
    return NodeTopology(
        name,
        tuple(Gpu(**g) for g in body["gpus"]),
        tuple(
            Rnic(**{k: v for k, v in r.items() if k not in ("link_layer", "netdev")})
            for r in body["rnics"]
        ),
    )


def fabric(rails: int, faults: list[FaultEvidence], now: datetime) -> FabricView:
    health = assess(Evidence(faults=tuple(faults)), now, RULES)
    topos = {n: topo(n, rails) for n in ("n0", "n1")}
    return FabricView(
        topologies=topos,
        plans={n: plan_node(t) for n, t in topos.items()},
        failed=health.failed,
        unhealthy=health.unhealthy,
        fabric_ports={n: frozenset((r.name, r.port) for r in t.rnics) for n, t in topos.items()},
    )


def job(comm: CommSpec, previous: Desired, **kw: Any) -> JobState:
    ranks = tuple((i * 8 + g, n, g) for i, n in enumerate(("n0", "n1")) for g in range(8))
    return JobState(
        job_id="j",
        mode=previous.mode,
        ranks=ranks,
        checkpoint_interval_s=3600,
        reload_s=600,
        detect_s=0,
        timeout_s=30,
        last_checkpoint_at=T0,
        communicators=(comm,),
        slowdown_k=1.5,
        previous=previous,
        **kw,
    )


def down(device: str, s: float) -> FaultEvidence:
    return FaultEvidence(1, "n0", device, 1, FaultKind.LINK_DOWN, T0 + timedelta(seconds=s))


def test_channel_weights_share_each_rnic_evenly() -> None:
    assert channel_weights(["a", "b", "a", "c"]) == (1 / 6, 1 / 3, 1 / 6, 1 / 3)
    assert channel_weights(["a", None, "a", "a"]) == (1 / 3, 0.0, 1 / 3, 1 / 3)
    assert channel_weights([None, None]) == ()


def test_balance_sends_each_channel_its_weight_and_the_allreduce_split() -> None:
    # 8 rails, 16 channels; mlx5_3 on n0 fails late in the interval: failover, and
    # balance beats DCR. Channels 3 and 11 leave through mlx5_3's backup, mlx5_2,
    # beside mlx5_2's own 2 and 10: four channels share one of the 7 RNICs left.
    comm = CommSpec(77, 16)
    now = T0 + timedelta(seconds=3000)
    out = reconcile(now, job(comm, Desired()), fabric(8, [down("mlx5_3", 3000)], now), Options())
    assert out.desired.mitigation == {77: "balance"}
    quarter = 1.0 / (7 * 4)
    full = 1.0 / (7 * 2)
    expected = tuple(quarter if c % 8 in (2, 3) else full for c in range(16))
    assert out.desired.weights == {77: expected}
    assert abs(sum(expected) - 1.0) < 1e-12
    handoff = (1 - 7 / 8) / (1 + (7 / 8) / (2 - 1))
    assert out.desired.split == {77: handoff}
    assert out.desired.disabled == {77: (3, 11)}
    assert out.decision is not None
    record = out.decision.plan["communicators"][0]
    assert (record["channel_weights"], record["allreduce_split"]) == (list(expected), handoff)
    intents = command_diff(Desired(), out.desired, job(comm, Desired()))
    assert intents[1] == Intent(
        IntentKind.BALANCE,
        77,
        tuple(range(16)),
        (3, 11),
        weights=expected,
        split_ratio=handoff,
    )
    assert intents[1].coordinated
    # Told once: the same desired state again is no command; the JSON round trip keeps it.
    again = Desired.from_json(out.desired.to_json())
    assert again == out.desired
    assert command_diff(again, out.desired, job(comm, again)) == []
    # The port comes back and stays up: one fail-back, and the plan is gone.
    later = T0 + timedelta(seconds=3500)
    healed = FaultEvidence(
        1, "n0", "mlx5_3", 1, FaultKind.LINK_DOWN, T0 + timedelta(seconds=3000),
        recovered_at=T0 + timedelta(seconds=3010),
    )  # fmt: skip
    prev = job(comm, out.desired, failed_over_at=now)
    back = reconcile(later, prev, fabric(8, [healed], later), Options())
    assert back.desired.mode == Mode.NORMAL
    assert (back.desired.weights, back.desired.split) == ({}, {})
    assert [i.kind for i in command_diff(out.desired, back.desired, prev)] == [IntentKind.FAILBACK]


def one_rail_comm(channels: int) -> CommSpec:
    # GPU 2 of each node: one rail per node, the small group NVL is for.
    return CommSpec(78, channels, (2, 10))


def test_nvl_names_each_moved_ranks_transit_gpu() -> None:
    # 4 rails: GPU 2's backup, mlx5_0, is behind another root complex, so s-Bond pays
    # for the crossing and NVL through GPU 0 (beside mlx5_0) is cheaper.
    now = T0 + timedelta(seconds=3000)
    comm = one_rail_comm(4)
    state = job(comm, Desired())
    out = reconcile(now, state, fabric(4, [down("mlx5_1", 3000)], now), Options())
    assert out.desired.mitigation == {78: "nvl"}
    assert out.desired.transit == {78: {2: 0}}
    assert (out.desired.weights, out.desired.disabled) == ({}, {})
    assert out.decision is not None
    assert out.decision.plan["communicators"][0]["transit"] == [{"rank": 2, "gpu": 0}]
    assert command_diff(Desired(), out.desired, state) == [
        Intent(IntentKind.FAILOVER, 78, (2,)),
        Intent(IntentKind.NVL_TRANSIT, 78, (2,), transit=((2, 0),)),
    ]
    assert not command_diff(Desired(), out.desired, state)[1].coordinated
    assert Desired.from_json(out.desired.to_json()) == out.desired


def test_nvl_over_the_transit_memory_cap_is_refused() -> None:
    now = T0 + timedelta(seconds=3000)
    faults = [down("mlx5_1", 3000)]
    # 13 channels x 40 MB = 520 MB: over the service's 512 MB cap.
    out = reconcile(now, job(one_rail_comm(13), Desired()), fabric(4, faults, now), Options())
    assert out.desired.mitigation == {78: "s-bond"}
    assert out.desired.transit == {}
    assert out.decision is not None
    nvl = out.decision.plan["communicators"][0]["options"][2]
    assert (nvl["mitigation"], nvl["applicable"]) == ("nvl", False)
    assert nvl["why"] == "needs 520 MB of GPU memory, over the 512 MB cap"
    # The job's own cap wins over the service's: 4 channels (160 MB) over a 120 MB cap.
    capped = job(one_rail_comm(4), Desired(), nvl_cap_mb=120.0)
    out = reconcile(now, capped, fabric(4, faults, now), Options())
    assert out.desired.transit == {}
    assert out.decision is not None
    why = out.decision.plan["communicators"][0]["options"][2]["why"]
    assert why == "needs 160 MB of GPU memory, over the 120 MB cap"
    # Two ranks through one GPU cost twice the memory.
    plan = coord.plan_mitigation(
        comm_share=0.3, rails_per_node=1, failed_rails=1, channels=4, nodes=2,
        backup_load=1, nvl_available=True, nvl_ranks_per_gpu=4,
    )  # fmt: skip
    assert plan.options[2].why == "needs 640 MB of GPU memory, over the 512 MB cap"
