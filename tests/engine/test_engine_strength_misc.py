"""Single cases the engine mutation run found untold: a warning's exact list, NCCL's
partner device when it fails too, a policy's note, a window's reason, the examples cap.
"""

from __future__ import annotations

import pytest

from scheduler_svc.engine import decision as cost
from scheduler_svc.engine.decision import DecisionInputs, Policy, decide, with_policy
from scheduler_svc.engine.fabric import Evidence, Maintenance, assess
from scheduler_svc.engine.job_routes import index_for, routes_of
from scheduler_svc.engine.paths import Gpu, NodeTopology, Rnic, plan_node
from scheduler_svc.engine.reconcile import reconcile
from scheduler_svc.engine.state import Action, Mode, Options
from tests.engine.stories import RULES, Story, at, down


def _rnic(name: str, pci: str, **kw: object) -> Rnic:
    return Rnic(
        name,
        1,
        pci,
        numa=0,
        pcie_switch="sw0",
        root_complex="rc0",
        switch="rail0",
        rail=0,
        **kw,  # type: ignore[arg-type]  # kind/physfn/members, checked by the dataclass
    )


def test_no_backup_names_every_device_sharing_a_function_and_the_primary_s_functions() -> None:
    bond = _rnic("mlx5_0", "0000:13:00.0", kind="bond", members=("0000:11:00.0", "0000:13:00.0"))
    sf = _rnic("mlx5_0a", "0000:11:00.0", kind="sf")
    vf = _rnic("mlx5_0b", "0000:13:00.1", kind="vf", physfn="0000:13:00.0")
    plan = plan_node(NodeTopology("n", (Gpu(0, "0000:10:00.0", 0, "sw0", "rc0"),), (bond, sf, vf)))
    assert (plan.gpus[0].primary, plan.gpus[0].backup) == ("mlx5_0/1", None)
    assert plan.warnings == (
        "GPU 0 has no backup RNIC: mlx5_0a, mlx5_0b share PCI functions with mlx5_0 "
        "(0000:11:00.0, 0000:13:00.0), so one failure takes both",
    )


def test_nccl_keeps_its_partner_device_only_while_that_works() -> None:
    """Policy nccl-failover-only: rank 3 stays on mlx5_2 after its primary is back; when
    mlx5_2 fails too, rank 3 is on its primary again and rank 2 moves, with or without
    the job's index."""
    s = Story(["n0", "n1"], options=Options(policy=Policy.NCCL_FAILOVER_ONLY))
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.step(3000)
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3100))
    s.step(3220)
    assert (s.mode, dict(s.desired.moved)) == (Mode.FAILED_OVER, {3: "mlx5_2/1"})
    s.faults[2] = down(2, "n0", "mlx5_2", 3300)
    job, fabric = s.job(), s.fabric(at(3300))
    indexed = reconcile(at(3300), job, fabric, s.options, index_for(job, fabric))
    out = s.step(3300)
    assert out.decision is not None and out.decision.action == Action.FAILOVER
    assert dict(out.desired.moved) == {2: "mlx5_3/1"}
    assert indexed.desired == out.desired
    # mlx5_2 back: rank 2 keeps its partner device, as NCCL does until a restart.
    s.faults[2] = down(2, "n0", "mlx5_2", 3300, recovered_at=at(3400))
    s.step(3600)
    assert dict(s.desired.moved) == {2: "mlx5_3/1"}


def test_restart_only_leaves_the_cost_model_s_own_restart_as_it_is() -> None:
    """An early fault the cost model restarts for anyway: restart-only adds no note."""
    reasons = []
    for policy in (Policy.RAILOVER, Policy.RESTART_ONLY):
        s = Story(["n0", "n1"], options=Options(policy=policy))
        s.faults[1] = down(1, "n0", "mlx5_3", 1000)
        d = s.step(1000).decision
        assert d is not None and d.action == Action.RESTART
        reasons.append(d.reason)
    assert reasons[0] == reasons[1] and reasons[1].startswith("restart: ")


def test_an_announced_window_is_scheduled_with_its_reason() -> None:
    w = Maintenance(
        id=7,
        starts_at=at(3600),
        ends_at=at(7200),
        switch="rail3-leaf",
        moves_at=at(3480),
        reason="firmware",
    )
    health = assess(Evidence(maintenance=(w,)), at(0), RULES)
    (scheduled,) = health.scheduled
    assert (scheduled.key, scheduled.kind, scheduled.since, scheduled.switch) == (
        "maintenance:7",
        "maintenance",
        at(3480),
        "rail3-leaf",
    )
    assert scheduled.reason == "planned maintenance 7 (firmware) scheduled"


def test_a_job_index_keeps_ten_examples_of_broken_pairs() -> None:
    """n0 loses four RNICs on four nodes: ranks 0 to 3 have no path, 12 pairs broken; the
    answer names ten of them, with or without the job's index."""
    s = Story(["n0", "n1", "n2", "n3"])
    for fid, dev in enumerate(("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"), start=1):
        s.faults[fid] = down(fid, "n0", dev, 1000)
    job, fabric = s.job(), s.fabric(at(1000))
    plain = routes_of(job, fabric)
    indexed = routes_of(job, fabric, index_for(job, fabric))
    assert plain.broken_pairs == indexed.broken_pairs == 12
    assert len(plain.examples) == len(indexed.examples) == 10


@pytest.mark.parametrize("policy", [Policy.FAILOVER_ALWAYS, Policy.NCCL_FAILOVER_ONLY])
def test_a_failover_policy_turns_the_cost_model_s_restart_into_a_failover(policy: Policy) -> None:
    asked = decide(
        DecisionInputs(
            checkpoint_interval_s=3600.0,
            elapsed_s=600.0,
            detect_s=0.0,
            reload_s=600.0,
            timeout_s=30.0,
            k=1.5,
            k_source="measured",
            gpus=16,
        )
    )
    assert asked.action == cost.Action.RESTART
    told = with_policy(asked, policy)
    assert told.action == cost.Action.FAILOVER
    assert told.reason == (
        f"policy {policy.value}: fail over wherever a path is left ({asked.reason})"
    )
    assert told.costs_s == asked.costs_s
