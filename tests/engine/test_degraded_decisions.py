"""Degraded RNICs as outcomes of `reconcile`: rebalanced by the bandwidth each has left,
failed over only where that is cheaper, back to even once the degradation has cleared.

A 16-GPU job on two 8-rail nodes, as tests/engine/test_balance_nvl.py builds it; the
desired state of one pass is the previous of the next, the commands `command_diff`.
"""

from __future__ import annotations

import math
from datetime import timedelta

from scheduler_svc.engine.degradation import plan_degraded
from scheduler_svc.engine.fabric import (
    ClearingRules,
    Evidence,
    FaultEvidence,
    FaultKind,
    Health,
    assess,
    fault_health,
)
from scheduler_svc.engine.intents import IntentKind, command_diff
from scheduler_svc.engine.job_routes import routes_of
from scheduler_svc.engine.mitigations import channel_weights
from scheduler_svc.engine.paths import plan_node
from scheduler_svc.engine.reconcile import reconcile
from scheduler_svc.engine.state import Action, CommSpec, Desired, FabricView, Mode, Options
from tests.engine.test_balance_nvl import T0, job, one_rail_comm, topo

RULES = ClearingRules(damping_s=120, quiet_s=300)
HALF = "n0/mlx5_3/1 at 200 of 400 Gb/s (port rate)"


def degraded(
    device: str = "mlx5_3",
    share: float = 0.5,
    *,
    port: int = 1,
    level: bool = True,
    restored_s: float | None = None,
    note: str = HALF,
    fid: int = 5,
    node: str = "n0",
) -> FaultEvidence:
    return FaultEvidence(
        fid,
        node,
        device,
        port,
        FaultKind.DEGRADED,
        T0 + timedelta(seconds=100),
        recovered_at=None if restored_s is None else T0 + timedelta(seconds=restored_s),
        last_error_at=T0 + timedelta(seconds=100),
        note=note,
        share=share,
        degraded_level=level,
    )


def fabric(faults: list[FaultEvidence], now_s: float) -> FabricView:
    health = assess(Evidence(faults=tuple(faults)), T0 + timedelta(seconds=now_s), RULES)
    topos = {n: topo(n, 8) for n in ("n0", "n1")}
    return FabricView(
        topologies=topos,
        plans={n: plan_node(t) for n, t in topos.items()},
        failed=health.failed,
        unhealthy=health.unhealthy,
        fabric_ports={n: frozenset((r.name, r.port) for r in t.rnics) for n, t in topos.items()},
        degraded=health.degraded,
    )


def test_shares_scale_a_degraded_rnics_share_and_give_the_rest_to_the_full_ones() -> None:
    assert channel_weights(["a", "b"], {"a": 0.5}) == (0.25, 0.75)
    assert channel_weights(["a", "b", "a", "b"], {}) == channel_weights(["a", "b", "a", "b"])
    # All degraded: in proportion to what each has left; nothing left: no weights.
    assert channel_weights(["a", "b"], {"a": 0.5, "b": 0.25}) == (2 / 3, 1 / 3)
    assert channel_weights(["a"], {"a": 0.0}) == ()


def test_a_degradation_holds_while_its_level_shows_it_and_clears_after_the_quiet_period() -> None:
    now = T0 + timedelta(seconds=10_000)
    assert fault_health(degraded(), now, RULES).health == Health.FAILED
    restored = degraded(level=False, restored_s=1000)
    assert fault_health(restored, T0 + timedelta(seconds=1299), RULES).health == Health.RECOVERING
    assert fault_health(restored, T0 + timedelta(seconds=1300), RULES).health == Health.HEALTHY
    # Not out of service: nothing is failed, the share is what is left.
    health = assess(Evidence(faults=(degraded(),)), now, RULES)
    assert not health.failed.links and not health.failed.rnics
    assert health.degraded[("n0", "mlx5_3", 1)].share == 0.5


def test_half_the_rate_rebalances_once_and_the_restored_rate_returns_even_weights() -> None:
    comm = CommSpec(77, 16)
    out = reconcile(
        T0 + timedelta(seconds=101), job(comm, Desired()), fabric([degraded()], 101), Options()
    )
    d = out.decision
    assert d is not None and d.action == Action.REBALANCE
    assert out.desired.mode == Mode.NORMAL and not out.desired.moved
    w = out.desired.weights[77]
    assert math.isclose(math.fsum(w), 1.0)
    # mlx5_3 carries channels 3 and 11: half its former eighth, the rest to the seven others.
    assert math.isclose(w[3] + w[11], 0.5 * (1 / 8))
    assert all(math.isclose(w[c] + w[c + 8], (1 - 1 / 16) / 7) for c in range(8) if c != 3)
    assert HALF in d.reason and "6.2% of the traffic (was 12.5%)" in d.reason
    assert (d.fault_key, d.trigger) == ("fault:5", "rebalance:fault:5")
    (comm_plan,) = d.plan["communicators"]
    assert d.plan == {
        "mitigation": "balance",
        "degraded": [{"fault": "fault:5", "part": "n0/mlx5_3/1", "share": 0.5, "figure": HALF}],
        "communicators": [
            {
                "comm_id": 77,
                "node": "n0",
                "channel_weights": list(w),
                "k_rebalance": comm_plan["k_rebalance"],
                "k_failover": comm_plan["k_failover"],
                "shares": {"mlx5_3/1": 0.5},
            }
        ],
    }
    # The slowest RNIC sets the pace: 15/16 of the bandwidth against 7/8 failed over.
    assert math.isclose(comm_plan["k_rebalance"], 0.7 + 0.3 / (7 / 7.5))
    assert math.isclose(comm_plan["k_failover"], 0.7 + 0.3 / (7 / 8))
    assert out.desired.mitigation == {77: "balance"}
    assert d.reason == (
        f"{HALF}: channels rebalanced by the bandwidth each RNIC has left, not failed over; "
        "communicator 77: n0/mlx5_3/1 6.2% of the traffic (was 12.5%); predicted k "
        f"{comm_plan['k_rebalance']:.3f} (failing over {comm_plan['k_failover']:.3f})"
    )
    # One switch point, to all 16 ranks, carrying the weights.
    intents = command_diff(Desired(), out.desired, job(comm, Desired()))
    assert [(i.kind, i.ranks, i.weights) for i in intents] == [
        (IntentKind.BALANCE, tuple(range(16)), w)
    ]
    # Unchanged evidence: no decision, no command.
    again = reconcile(
        T0 + timedelta(seconds=200), job(comm, out.desired), fabric([degraded()], 200), Options()
    )
    assert again.decision is None and again.desired.weights == out.desired.weights
    # Restored at 1000 s: the weights stay through the quiet period, then return to even.
    back = degraded(level=False, restored_s=1000)
    quiet = reconcile(
        T0 + timedelta(seconds=1200), job(comm, out.desired), fabric([back], 1200), Options()
    )
    assert quiet.decision is None and quiet.desired.weights == out.desired.weights
    even = reconcile(
        T0 + timedelta(seconds=1300), job(comm, out.desired), fabric([back], 1300), Options()
    )
    assert even.decision is not None and even.decision.action == Action.REBALANCE
    assert even.desired.weights == {} and even.desired.mitigation == {}
    assert even.decision.trigger == "rebalance:restored:fault:5"
    assert even.decision.reason == (
        "no RNIC the communicators use is degraded any more (fault:5 cleared): every "
        "channel back to an even share"
    )
    assert even.decision.plan == {"mitigation": "even", "degraded": [], "communicators": []}
    told = command_diff(out.desired, even.desired, job(comm, out.desired))
    assert [(i.kind, i.ranks, i.weights, i.disabled_channels) for i in told] == [
        (IntentKind.REBALANCE, tuple(range(16)), (), ())
    ]


def test_one_rail_fails_over_only_below_what_its_backup_gives() -> None:
    comm = one_rail_comm(4)  # GPU 2 of each node: mlx5_2 on n0, one rail
    mild = degraded("mlx5_2", 0.75, note="n0/mlx5_2/1 at 300 of 400 Gb/s (port rate)")
    state = job(comm, Desired())
    view = fabric([mild], 101)
    [plan] = plan_degraded(state, view, routes_of(state, view))
    assert not plan.fails_over and plan.weights == ()
    out = reconcile(T0 + timedelta(seconds=101), state, fabric([mild], 101), Options())
    assert out.decision is None and not out.desired.moved
    bad = degraded("mlx5_2", 0.25, note="n0/mlx5_2/1 at 100 of 400 Gb/s (port rate)")
    out = reconcile(T0 + timedelta(seconds=101), state, fabric([bad], 101), Options())
    d = out.decision
    assert d is not None and d.action == Action.FAILOVER
    assert out.desired.moved == {2: "mlx5_3/1"}
    assert "n0/mlx5_2/1 at 100 of 400 Gb/s" in d.reason and "cheaper than running on it" in d.reason


def test_the_node_with_the_least_bandwidth_left_sets_the_weights() -> None:
    comm = CommSpec(77, 8)
    quarter = degraded("mlx5_6", 0.25, note="n1/mlx5_6/1 at 100 of 400 Gb/s", fid=6, node="n1")
    view = fabric([degraded(), quarter], 101)
    out = reconcile(T0 + timedelta(seconds=101), job(comm, Desired()), view, Options())
    assert out.decision is not None
    (comm_plan,) = out.decision.plan["communicators"]
    assert (comm_plan["node"], comm_plan["shares"]) == ("n1", {"mlx5_6/1": 0.25})
    w = out.desired.weights[77]
    assert math.isclose(w[6], 0.25 / 8) and math.isclose(math.fsum(w), 1.0)
    # Weakest first, both named.
    assert [x["fault"] for x in out.decision.plan["degraded"]] == ["fault:6"]
    assert out.decision.reason.startswith("n1/mlx5_6/1 at 100 of 400 Gb/s: channels")
