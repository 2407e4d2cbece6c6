"""The policies the fleet twin compares Railover with (RAILOVER_POLICY), each a service
setting over the same engine: restart-only, failover-always and nccl-failover-only.

Two nodes of 8 GPUs, communicator 77; n0/mlx5_3 fails. Early in the interval (1000 s after
the checkpoint) Railover's cost model restarts; late (3000 s) it fails over.
"""

from __future__ import annotations

import pytest

from scheduler_svc.engine.decision import Policy
from scheduler_svc.engine.state import Action, CheckpointSeen, Mode, Options
from tests.engine.stories import Story, at, down


def story(policy: Policy, fault_at: float, **job_kw: object) -> tuple[Story, Action]:
    s = Story(["n0", "n1"], options=Options(policy=policy), job_kw=dict(job_kw))
    s.faults[1] = down(1, "n0", "mlx5_3", fault_at)
    d = s.step(fault_at).decision
    assert d is not None
    return s, d.action


@pytest.mark.parametrize(
    ("policy", "early", "late"),
    [
        (Policy.RAILOVER, Action.RESTART, Action.FAILOVER),
        (Policy.RESTART_ONLY, Action.RESTART, Action.RESTART),
        (Policy.FAILOVER_ALWAYS, Action.FAILOVER, Action.FAILOVER),
        (Policy.NCCL_FAILOVER_ONLY, Action.FAILOVER, Action.FAILOVER),
    ],
)
def test_what_each_policy_does_at_a_fault(policy: Policy, early: Action, late: Action) -> None:
    assert story(policy, 1000)[1] == early
    assert story(policy, 3000)[1] == late


def test_a_policy_keeps_the_costs_and_says_it_overrode_the_cost_model() -> None:
    s, _ = story(Policy.RESTART_ONLY, 3000)
    d = s.decisions[0].decision
    assert d is not None
    assert d.reason.startswith(
        "policy restart-only: every fault that hits a rank restarts the job (fail over: "
    )
    failover, restart = d.costs_s["failover"], d.costs_s["restart"]
    assert failover is not None and restart is not None and failover < restart
    s, _ = story(Policy.FAILOVER_ALWAYS, 1000)
    d = s.decisions[0].decision
    assert d is not None
    assert d.reason.startswith("policy failover-always: fail over wherever a path is left (restart")


def test_no_path_left_restarts_under_every_policy() -> None:
    for policy in Policy:
        s = Story(["n0", "n1"], options=Options(policy=policy))
        s.faults[1] = down(1, "n0", "mlx5_3", 3000)
        s.faults[2] = down(2, "n0", "mlx5_2", 3000)
        d = s.step(3000).decision
        assert d is not None and d.action == Action.RESTART, policy


@pytest.mark.parametrize("policy", [Policy.FAILOVER_ALWAYS, Policy.NCCL_FAILOVER_ONLY])
def test_only_railover_restarts_at_a_checkpoint(policy: Policy) -> None:
    """Failed over with a day of repair ahead and a spare: Railover restarts at the next
    checkpoint; the other policies keep running degraded, and say why once."""
    for p, verdict in ((Policy.RAILOVER, Action.RESTART), (policy, Action.NONE)):
        s, _ = story(p, 3000, repair_estimate_s=86400)
        s.checkpoint = CheckpointSeen(5, at(3100), at(3100))
        d = s.step(3100).decision
        assert d is not None and d.action == verdict, p
    assert d is not None and d.reason == (
        f"keep running degraded: policy {policy.value} never restarts a job at a checkpoint"
    )
    s.checkpoint = CheckpointSeen(6, at(3200), at(3200))
    assert s.step(3200).decision is None


def test_nccl_failover_only_never_fails_back() -> None:
    """The port comes back: Railover fails back after the damping; NCCL keeps its partner
    device, so the rank stays on its backup until the job restarts."""
    for policy, back in (
        (Policy.RAILOVER, Mode.NORMAL),
        (Policy.NCCL_FAILOVER_ONLY, Mode.FAILED_OVER),
    ):
        s, _ = story(policy, 3000)
        s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3010))
        out = s.step(3010 + 3600)
        assert out.desired.mode == back, policy
        assert (dict(out.desired.moved) == {3: "mlx5_2/1"}) == (back == Mode.FAILED_OVER)
