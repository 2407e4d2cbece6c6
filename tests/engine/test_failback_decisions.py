"""Fail-back decisions: the exact record when primaries come back, whole or in part."""

from __future__ import annotations

from scheduler_svc.engine.fabric import SwitchEvidence
from scheduler_svc.engine.intents import IntentKind
from scheduler_svc.engine.nccl import NcclSpec
from scheduler_svc.engine.state import Action, CommSpec, Desired, Mode
from tests.engine.stories import (
    Story,
    at,
    down,
    n0_returns_and_rank_3_waits,
    rails_3_and_6_fail,
)


def test_whole_failback_record() -> None:
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.step(3000)
    assert s.desired.moved == {3: "mlx5_2/1"}
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3100))
    assert s.step(3150).decision is None  # damping (120 s) not over
    out = s.step(3220)
    d = out.decision
    assert d is not None
    assert d.trigger == "failback:1"
    assert d.fault_key == "fault:1"
    assert d.action == Action.FAILBACK
    assert d.reason == (
        "fail back: the primary paths on n0 are healthy again; "
        "1 rank(s) return to their primary at one op count"
    )
    assert d.plan == {
        "mitigation": "failback",
        "returning": [{"rank": 3, "node": "n0", "gpu": 3, "to": "mlx5_3/1"}],
        "still_failed_over": [],
        "held": [],
        "disabled_channels": {},
        "cleared": ["fault:1"],
    }
    assert d.costs_s == {} and d.costs_gpu_s == {}
    assert d.inputs["k"] == 1.5
    assert out.desired.mode == Mode.NORMAL
    assert out.desired.moved == {}
    assert out.desired.k is None
    assert out.desired.channel_plan() == ({}, {}, {})


def test_partial_failback_keeps_the_still_failed_rank_and_its_channels() -> None:
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.faults[2] = down(2, "n1", "mlx5_5", 3000)
    s.step(3000)
    assert s.desired.moved == {3: "mlx5_2/1", 13: "mlx5_4/1"}
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3100))
    d = s.step(3220).decision
    assert d is not None
    assert d.trigger == "failback:1"
    assert d.reason == (
        "fail back: the primary paths on n0 are healthy again; 1 rank(s) return to their "
        "primary at one op count; 1 rank(s) stay on their backup (their primary is still failed)"
    )
    assert d.plan["returning"] == [{"rank": 3, "node": "n0", "gpu": 3, "to": "mlx5_3/1"}]
    assert d.plan["still_failed_over"] == [13]
    assert d.plan["disabled_channels"] == {"77": [5, 13]}
    assert d.plan["cleared"] == ["fault:1"]
    assert s.desired.mode == Mode.FAILED_OVER
    assert s.desired.moved == {13: "mlx5_4/1"}


def test_a_one_rail_communicator_returns_whole_or_not_at_all() -> None:
    """Issue 28, case 3: no channel plan can keep a failed rail out of a one-rail
    communicator, so a fail-back there would send the still-failed rank back too."""
    s = Story(["n0", "n1"], job_kw={"communicators": (CommSpec(5, 4, ranks=(3, 11)),)})
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.faults[2] = down(2, "n1", "mlx5_3", 3000)
    s.step(3000)
    assert s.desired.moved == {3: "mlx5_2/1", 11: "mlx5_2/1"}
    assert s.desired.disabled == {}
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3100))
    held = s.step(3220)
    assert held.decision is None  # the outcome did not change: rank 3 waits for rank 11
    assert s.desired.moved == {3: "mlx5_2/1", 11: "mlx5_2/1"}
    assert s.intents[-1] == []
    s.faults[2] = down(2, "n1", "mlx5_3", 3000, recovered_at=at(3300))
    d = s.step(3420).decision
    assert d is not None and d.action == Action.FAILBACK
    assert [r["rank"] for r in d.plan["returning"]] == [3, 11]
    assert s.desired.moved == {} and s.desired.mode == Mode.NORMAL
    assert [(i.kind, i.ranks) for i in s.intents[-1]] == [(IntentKind.FAILBACK, (3, 11))]


def test_a_rank_waits_on_its_backup_while_a_one_rail_peer_is_still_failed() -> None:
    """Rank 3 is in a one-rail communicator with still-failed rank 11, and in the
    world communicator with DCR: it waits, and the decision says why."""
    comms = (CommSpec(5, 4, ranks=(3, 11)), CommSpec(77, 16))
    s = Story(["n0", "n1"], job_kw={"communicators": comms})
    rails_3_and_6_fail(s)
    assert s.desired.moved == {3: "mlx5_2/1", 6: "mlx5_7/1", 11: "mlx5_2/1"}
    d = n0_returns_and_rank_3_waits(s)  # 6 returns, 3 held, {3, 11} still moved
    assert d.plan["still_failed_over"] == [3, 11]
    assert d.reason.endswith(
        "1 rank(s) stay on their backup (their primary is still failed); 1 rank(s) wait on "
        "their backup until every rank of their communicator can return (no channel plan "
        "keeps the failed rail out)"
    )
    assert s.desired.moved == {3: "mlx5_2/1", 11: "mlx5_2/1"}


def test_stock_nccl_failback_is_recorded_and_without_port_recovery_stays_failed_over() -> None:
    old = NcclSpec((2, 29, 7), port_failover=True, merged_nics=(frozenset({"mlx5_2", "mlx5_3"}),))
    s = Story(["n0", "n1"], comm_channels=None, job_kw={"nccl": old})
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.step(3000)
    assert s.mode == Mode.FAILED_OVER
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3100))
    d = s.step(3220).decision
    assert d is not None
    assert d.reason == (
        "fail back: n0/mlx5_3/1 is back, but NCCL 2.29.7 with port failover has no port "
        "recovery (2.30+): its ranks stay on the partner device until the job restarts"
    )
    assert s.desired.mode == Mode.FAILED_OVER
    assert s.desired.moved == {}


def test_a_cleared_switch_names_itself_in_the_trigger() -> None:
    s = Story(["n0", "n1"])
    s.switches[4] = SwitchEvidence(4, "rail3-leaf", at(3000), "2 nodes lost their port")
    s.step(3000)
    assert s.desired.moved == {3: "mlx5_2/1", 11: "mlx5_2/1"}
    del s.switches[4]
    d = s.step(3100).decision
    assert d is not None
    assert d.trigger == "failback:switch:4"
    assert d.fault_key == "switch:4"
    assert d.plan["cleared"] == ["switch:4"]
    assert d.reason == (
        "fail back: the primary paths on n0, n1 are healthy again; "
        "2 rank(s) return to their primary at one op count"
    )


def test_failback_clears_the_plan_and_keeps_the_failovers_k_in_its_inputs() -> None:
    s = Story(["n0", "n1"], job_kw={"comm_share": 0.4, "slowdown_k": None})
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.step(3000)
    k = s.desired.k
    assert k is not None and k != 1.03
    assert s.desired.mitigation == {77: "balance"}
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3100))
    out = s.step(3220)
    assert out.decision is not None
    assert (out.decision.inputs["k"], out.decision.inputs["k_source"]) == (k, "measured")
    assert out.desired.mitigation == {}
    assert out.desired.disabled == {}
    assert out.conn is not None and out.conn.failed_over_ranks == ()
    assert out.warnings == ()


def test_stock_nccl_with_port_recovery_returns_to_normal_on_every_node() -> None:
    new = NcclSpec((2, 30, 0), port_failover=True, merged_nics=(frozenset({"mlx5_2", "mlx5_3"}),))
    s = Story(["n0", "n1"], comm_channels=None, job_kw={"nccl": new})
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.faults[2] = down(2, "n1", "mlx5_3", 3000)
    s.step(3000)
    assert s.mode == Mode.FAILED_OVER
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3100))
    s.faults[2] = down(2, "n1", "mlx5_3", 3000, recovered_at=at(3100))
    d = s.step(3220).decision
    assert d is not None
    assert d.reason == (
        "fail back: NCCL 2.30.0 with port failover recovers n0/mlx5_3/1, n1/mlx5_3/1 by "
        "itself (port recovery); recorded, no commands sent"
    )
    assert s.desired.mode == Mode.NORMAL


def test_a_rank_placed_off_the_failed_rnic_returns_while_the_fault_stays_open() -> None:
    """Re-registered onto GPU 2, rank 0 has a healthy primary again; the fault, still open
    (mlx5_3 is now GPU 2's backup), clears nothing: the time names the fail-back."""
    s = Story(["n0", "n1"], ranks=((0, "n0", 3), (1, "n1", 3)))
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.step(3000)
    assert s.desired.moved == {0: "mlx5_2/1"}
    s.ranks = ((0, "n0", 2), (1, "n1", 3))
    out = s.step(3100)
    d = out.decision
    assert d is not None
    assert d.action == Action.FAILBACK
    assert (d.trigger, d.fault_key) == ("failback:2026-11-01T12:51:40+00:00", None)
    assert d.plan["cleared"] == []
    assert d.plan["returning"] == [{"rank": 0, "node": "n0", "gpu": 2, "to": "mlx5_2/1"}]
    assert out.desired.evidence == frozenset({"fault:1"})
    assert out.desired.mode == Mode.NORMAL


def test_a_failback_with_no_k_known_records_the_default_k() -> None:
    """Started on its backups without a cost decision, declaring no k: nothing ever set one."""
    s = Story(["n0", "n1"], job_kw={"registering": True, "slowdown_k": None})
    s.faults[1] = down(1, "n0", "mlx5_3", 100)
    s.step(210)
    s.job_kw = {"slowdown_k": None}
    assert s.desired.k is None
    s.faults[1] = down(1, "n0", "mlx5_3", 100, recovered_at=at(300))
    d = s.step(500).decision
    assert d is not None
    assert d.action == Action.FAILBACK
    assert (d.inputs["k"], d.inputs["k_source"]) == (1.03, "default")


def test_the_node_plans_warnings_travel_with_the_failback() -> None:
    s = Story(["n0", "n1"], shape={"switch_name": "leaf"})
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.step(3000)
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3100))
    out = s.step(3220)
    assert out.decision is not None and out.decision.action == Action.FAILBACK
    assert len(out.warnings) == 16
    assert out.warnings[3].startswith("GPU 3: backup mlx5_2/1 hangs off the same fabric switch")


def test_a_partial_failback_is_failed_over_whatever_mode_the_stored_state_has() -> None:
    """The mode after a partial fail-back follows the ranks still on their backup: a desired
    state stored without its mode (read back as normal) still leaves the job failed over."""
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.faults[2] = down(2, "n1", "mlx5_5", 3000)
    s.step(3000)
    stored = {k: v for k, v in s.desired.to_json().items() if k != "mode"}
    s.desired = Desired.from_json(stored)
    assert s.desired.mode == Mode.NORMAL and s.desired.moved == {3: "mlx5_2/1", 13: "mlx5_4/1"}
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3100))
    out = s.step(3220)
    assert out.decision is not None and out.decision.action == Action.FAILBACK
    assert out.desired.mode == Mode.FAILED_OVER
    assert out.desired.moved == {13: "mlx5_4/1"}
