"""The fault lifecycle as stories: evidence in, desired state and decisions out (engine only).

Each story (a `Story`, tests/engine/stories.py) drives `reconcile` the way the service
does: it keeps the desired state of the previous pass, and the commands are `command_diff`
between what was commanded and what is desired now.
"""

from __future__ import annotations

import pytest

from scheduler_svc.engine.fabric import (
    Evidence,
    FaultEvidence,
    FaultKind,
    Health,
    Maintenance,
    Quarantine,
    SwitchEvidence,
    assess,
    fault_health,
)
from scheduler_svc.engine.intents import Intent, IntentKind
from scheduler_svc.engine.state import (
    Action,
    CheckpointSeen,
    Desired,
    MirrorFailureSeen,
    Mode,
)
from tests.engine.stories import RULES, SCALED, Story, at, down, kinds, mode

# --- clearing rules -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "now_s", "health"),
    [
        (down(1, "n0", "mlx5_0", 0), 10_000, Health.FAILED),  # no port_up: stays down
        (down(1, "n0", "mlx5_0", 0, recovered_at=at(10)), 100, Health.RECOVERING),
        (down(1, "n0", "mlx5_0", 0, recovered_at=at(10)), 130, Health.HEALTHY),
        # CQE: the port stays ACTIVE; quiet for 300 s after the newest error
        (
            FaultEvidence(1, "n0", "mlx5_0", 1, FaultKind.RETRY_EXCEEDED, at(0)),
            299,
            Health.RECOVERING,
        ),
        (
            FaultEvidence(1, "n0", "mlx5_0", 1, FaultKind.RETRY_EXCEEDED, at(0)),
            300,
            Health.HEALTHY,
        ),
        (
            FaultEvidence(
                1, "n0", "mlx5_0", 1, FaultKind.RETRY_EXCEEDED, at(0), last_error_at=at(200)
            ),
            400,
            Health.RECOVERING,
        ),
        (
            FaultEvidence(1, "n0", "mlx5_0", 1, FaultKind.RETRY_EXCEEDED, at(0), port_active=False),
            10_000,
            Health.FAILED,
        ),
        (FaultEvidence(1, "n0", "gpu7", 7, FaultKind.GPU_LOST, at(0)), 10**6, Health.FAILED),
        (FaultEvidence(1, "n0", "mlx5_0", 0, FaultKind.RNIC_LOST, at(0)), 10**6, Health.FAILED),
    ],
)
def test_clearing_rules(fault: FaultEvidence, now_s: float, health: Health) -> None:
    assert fault_health(fault, at(now_s), RULES).health == health


def test_assess_keeps_recovering_faults_out_of_service_and_says_when_they_clear() -> None:
    ev = Evidence(
        faults=(
            down(1, "n0", "mlx5_0", 0, recovered_at=at(10)),
            down(2, "n1", "mlx5_1", 0, recovered_at=at(1)),
        )
    )
    h = assess(ev, at(125), RULES)
    assert h.failed.links == frozenset({("n0", "mlx5_0", 1)})
    assert [c.fault.id for c in h.cleared] == [2]
    assert h.next_change_at == at(130)


# --- stories ------------------------------------------------------------------------------------


def test_late_fault_fails_over_once_and_the_same_input_again_changes_nothing() -> None:
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    first = s.step(3001)
    assert first.decision is not None
    assert (first.decision.action, first.decision.trigger) == (Action.FAILOVER, "fault:1")
    assert first.desired.moved == {3: "mlx5_2/1"}
    assert kinds(s.intents[-1])[0] == ("failover", (3,), ())
    again = s.step(3002)
    assert again.decision is None
    assert s.intents[-1] == []
    assert again.desired == first.desired


def test_early_fault_restarts_and_the_job_leaves_restarting_at_its_next_checkpoint() -> None:
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 1000)
    out = s.step(1000)
    assert out.decision is not None and out.decision.action == Action.RESTART
    assert kinds(s.intents[-1]) == [("abort", tuple(range(16)), ())]
    # While the job is being restarted, more faults decide nothing and send nothing.
    s.faults[2] = down(2, "n1", "mlx5_5", 1010)
    assert s.step(1020).decision is None and s.intents[-1] == []
    assert mode(s) == Mode.RESTARTING
    # The fleet manager restarts it; its first checkpoint is the new incarnation's (the
    # service clears the restart time when it starts).
    s.faults.clear()
    s.restart_decided_at = None
    s.checkpoint = CheckpointSeen(9, at(1100), received_at=at(1100))
    out = s.step(1100)
    assert mode(s) == Mode.NORMAL and out.decision is None
    s.faults[3] = down(3, "n1", "mlx5_3", 3000)
    later = s.step(3000)
    assert later.decision is not None and later.decision.action == Action.FAILOVER


def test_a_job_registered_after_a_fault_starts_on_its_backups_without_a_restart() -> None:
    """A job posted while a fault is open (re-posted after a restart, or new) already runs
    without that RNIC: restarting it would change nothing, so no cost question is asked."""
    s = Story(["n0", "n1"], job_kw={"registering": True})
    s.faults[1] = down(1, "n0", "mlx5_3", 100)  # early: after a fault, the model restarts
    out = s.step(210)
    s.job_kw = {}  # its first pass stored a desired state
    assert out.decision is not None
    assert out.decision.action == Action.FAILOVER
    assert "faults open before it was registered" in out.decision.reason
    assert out.desired.moved == {3: "mlx5_2/1"}
    assert out.desired.evidence == frozenset({"fault:1"})
    # What breaks once it runs is news, and the cost model decides it as usual.
    s.faults[2] = down(2, "n1", "mlx5_5", 220)
    later = s.step(221)
    assert later.decision is not None and later.decision.action == Action.RESTART
    assert later.decision.trigger == "fault:2"


def test_flap_fails_over_at_once_and_back_after_damping_at_one_switch_point() -> None:
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.step(3000)
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3003))
    assert s.step(3010).decision is None  # up again, still damping: stays on backup
    assert mode(s) == Mode.FAILED_OVER
    back = s.step(3124)
    assert back.decision is not None
    assert (back.decision.action, back.decision.trigger) == (Action.FAILBACK, "failback:1")
    assert back.decision.plan["returning"] == [
        {"rank": 3, "node": "n0", "gpu": 3, "to": "mlx5_3/1"}
    ]
    assert mode(s) == Mode.NORMAL
    assert kinds(s.intents[-1]) == [("failback", tuple(range(16)), ())]


def test_partial_failback_returns_only_healthy_primaries_and_keeps_dead_channels_off() -> None:
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.faults[2] = down(2, "n1", "mlx5_5", 3000)
    out = s.step(3000)
    assert out.decision is not None and out.decision.action == Action.FAILOVER
    assert out.desired.moved == {3: "mlx5_2/1", 13: "mlx5_4/1"}
    assert out.desired.disabled == {77: (3, 5, 11, 13)}
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3100))
    back = s.step(3300)
    assert back.decision is not None and back.decision.action == Action.FAILBACK
    assert back.desired.moved == {13: "mlx5_4/1"}
    assert back.desired.mode == Mode.FAILED_OVER
    assert back.desired.disabled == {77: (5, 13)}
    assert back.decision.plan["still_failed_over"] == [13]
    # Every rank of the communicator is told the same switch point: rail 5 stays off.
    assert kinds(s.intents[-1]) == [("failback", tuple(range(16)), (5, 13))]


def test_quarantined_port_carries_no_traffic_until_the_flag_is_cleared() -> None:
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3005))
    s.quarantines[4] = Quarantine(4, "n0", "mlx5_3", 1, at(3000), "5 downs in 600 s")
    s.step(3001)
    assert s.desired.moved == {3: "mlx5_2/1"}
    # Long after the damping period the port is up, but quarantined: no fail-back.
    assert s.step(9000).decision is None and s.desired.moved == {3: "mlx5_2/1"}
    # An unrelated fault and its fail-back do not return the quarantined port either.
    s.faults[2] = down(2, "n1", "mlx5_5", 9000)
    s.step(9000)
    s.faults[2] = down(2, "n1", "mlx5_5", 9000, recovered_at=at(9001))
    s.step(9200)
    assert s.desired.moved == {3: "mlx5_2/1"} and mode(s) == Mode.FAILED_OVER
    del s.quarantines[4]
    back = s.step(9300)
    assert back.decision is not None and back.decision.action == Action.FAILBACK
    assert back.decision.trigger == "failback:flag:4"
    assert mode(s) == Mode.NORMAL


def test_lost_gpu_is_a_fault_on_that_gpu_and_the_decision_names_it() -> None:
    s = Story(["n0", "n1"])
    s.faults[1] = FaultEvidence(1, "n0", "gpu7", 7, FaultKind.GPU_LOST, at(3000))
    s.lost_gpus["n0"] = 7
    out = s.step(3000)
    assert out.decision is not None and out.decision.action == Action.RESTART
    assert "n0/gpu7" in out.decision.reason
    assert "no usable path" in out.decision.reason
    assert out.conn.isolated_ranks == (7,)


def test_lost_primary_rnic_fails_the_ranks_over() -> None:
    s = Story(["n0", "n1"])
    s.faults[1] = FaultEvidence(1, "n0", "mlx5_3", 0, FaultKind.RNIC_LOST, at(3000))
    out = s.step(3000)
    assert out.decision is not None and out.decision.action == Action.FAILOVER
    assert "RNIC n0/mlx5_3 is gone" in out.decision.reason
    assert out.desired.moved == {3: "mlx5_2/1"}


def test_two_faults_in_one_pass_are_one_decision_with_the_two_fault_k() -> None:
    s = Story(["n0", "n1"], job_kw={"slowdown_k": None})
    s.faults[1] = down(1, "n0", "mlx5_0", 3000)
    s.faults[2] = down(2, "n1", "mlx5_5", 3000)
    out = s.step(3000)
    assert out.decision is not None
    assert (out.decision.inputs["k"], out.decision.inputs["concurrent_faults"]) == (1.2, 2)
    assert len(s.decisions) == 1


def test_switch_failure_moves_ranks_on_nodes_that_reported_nothing() -> None:
    s = Story(["n0", "n1", "n2", "n3"])
    for i, n in enumerate(["n0", "n1", "n2"]):
        s.faults[i + 1] = down(i + 1, n, "mlx5_3", 3000 + i * 0.5, switch="rail3-leaf")
    s.switches[1] = SwitchEvidence(1, "rail3-leaf", at(3001), "3 nodes lost their port")
    out = s.step(3002)
    assert out.decision is not None and out.decision.action == Action.FAILOVER
    assert set(out.desired.moved) == {3, 11, 19, 27}
    # Port faults on the failed switch are that one failure.
    assert out.decision.inputs["concurrent_faults"] == 1


def test_a_flap_during_a_switch_point_sends_the_newest_plan_only() -> None:
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.step(3000)
    assert [k for k, _, _ in kinds(s.intents[-1])] == ["failover", "balance"]
    # Before the rebalance's switch point the port is back, and after damping it fails
    # back: the communicator is told the channel plan it should have now, not the old one.
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3000.5))
    s.step(3121)
    assert kinds(s.intents[-1]) == [("failback", tuple(range(16)), ())]
    # It goes down again: a new decision and a new switch point.
    s.faults[2] = down(2, "n0", "mlx5_3", 3130)
    out = s.step(3130)
    assert out.decision is not None and out.decision.trigger == "fault:2"
    assert [k for k, _, _ in kinds(s.intents[-1])] == ["failover", "balance"]


def test_a_fault_during_a_failback_fails_over_what_broke_and_returns_what_healed() -> None:
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.step(3000)
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3010))
    s.faults[2] = down(2, "n1", "mlx5_5", 3200)
    out = s.step(3200)
    assert out.decision is not None
    assert (out.decision.action, out.decision.trigger) == (Action.FAILOVER, "fault:2")
    assert out.desired.moved == {13: "mlx5_4/1"}
    got = kinds(s.intents[-1])
    assert ("failover", (13,), ()) in got
    assert ("failback", tuple(range(16)), (5, 13)) in got


def test_flowcheck_checkpoints_while_failed_over_decide_at_most_once() -> None:
    s = Story(["n0", "n1"], job_kw={"repair_estimate_s": 1200})
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.step(3000)
    for i in range(100):
        s.checkpoint = CheckpointSeen(100 + i, at(3006 + 6 * i), at(3006 + 6 * i), "flowcheck")
        s.step(3006 + 6 * i)
    assert [d.decision.action for d in s.decisions if d.decision] == [Action.FAILOVER, Action.NONE]
    assert mode(s) == Mode.FAILED_OVER


def test_checkpoint_with_a_long_repair_ahead_restarts() -> None:
    s = Story(["n0", "n1"], job_kw={"repair_estimate_s": 86400})
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.step(3000)
    s.checkpoint = CheckpointSeen(5, at(3100), at(3100))
    out = s.step(3100)
    assert out.decision is not None and out.decision.action == Action.RESTART
    assert out.decision.reason.startswith("restart at this checkpoint")
    assert mode(s) == Mode.RESTARTING
    assert kinds(s.intents[-1])[0][0] == "abort"


def test_measured_k_that_changes_the_answer_redecides_once() -> None:
    s = Story(["n0", "n1"], job_kw={"slowdown_k": None})
    s.faults[1] = down(1, "n0", "mlx5_3", 1500)
    first = s.step(1500)
    assert first.decision is not None and first.decision.inputs["k"] == 1.03
    s.measured_k = 2.5
    out = s.step(1600)
    assert out.decision is not None and out.decision.action == Action.RESTART
    assert out.decision.inputs["k_source"] == "measured"
    assert "measured k 2.500 replaces 1.030" in out.decision.reason
    assert s.step(1700).decision is None


def test_job_without_communicators_gets_failover_and_failback_but_no_switch_point_plan() -> None:
    s = Story(["n0", "n1"], comm_channels=None)
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.step(3000)
    assert kinds(s.intents[-1]) == [("failover", (3,), ())]
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3001))
    s.step(3200)
    assert [i.kind for i in s.intents[-1]] == [IntentKind.FAILBACK]


def test_planned_maintenance_is_evidence_from_its_start_to_its_end() -> None:
    window = Maintenance(1, at(100), at(200), node="n0", device="mlx5_3", port=1)
    before = assess(Evidence(maintenance=(window,)), at(50), RULES)
    assert before.failed.empty and before.next_change_at == at(100)
    during = assess(Evidence(maintenance=(window,)), at(150), RULES)
    assert during.failed.links == frozenset({("n0", "mlx5_3", 1)})
    assert during.next_change_at == at(200)
    assert [u.key for u in during.unhealthy] == ["maintenance:1"]
    whole_switch = Maintenance(2, at(0), at(10), switch="rail3-leaf")
    assert assess(Evidence(maintenance=(whole_switch,)), at(5), RULES).failed.switches == {
        "rail3-leaf"
    }


def test_early_fault_without_a_spare_node_restarts_scaled_and_aborts_every_rank() -> None:
    # dp 2 x tp 8: each node is one DP replica; dropping n0 leaves DP 1.
    s = Story(
        ["n0", "n1"],
        job_kw={
            "allow_scaling": True,
            "dp_size": 2,
            "tp_size": 8,
            "spare_nodes": False,
            "node_replace_s": 7200,
            "slowdown_k": 3.0,
        },
    )
    s.faults[1] = down(1, "n0", "mlx5_3", 100)
    out = s.step(100)
    assert out.decision is not None and out.decision.action == Action.RESTART_SCALED
    # failover 30 + 3·3500 + 600; restart waits 7200 s for a node; scaled runs 2x long.
    assert out.decision.costs_s == {
        "failover": 11130.0,
        "restart": 11430.0,
        "restart_scaled": 7830.0,
        "none": None,
    }
    assert out.decision.costs_gpu_s["restart_scaled"] == 7830.0 * 16 / 2
    assert out.decision.plan["drop_nodes"] == ["n0"]
    assert out.decision.plan["new_dp_size"] == 1
    assert out.decision.plan["dropped_replicas"] == [0]
    assert out.decision.inputs["new_dp_size"] == 1
    assert out.decision.reason.endswith("; drop n0 (DP replicas 0): DP 2 -> 1")
    assert out.decision.saved_gpu_s == 0.0
    assert kinds(s.intents[-1]) == [("abort", tuple(range(16)), ())]
    assert mode(s) == Mode.RESTARTING


@pytest.mark.parametrize(
    ("layout", "fault_on", "new_dp", "dropped", "scaled_cost"),
    [
        # tp 8 fills a node: one replica per node, DP 4 -> 3: 630 + 3600·4/3.
        ({"dp_size": 4, "tp_size": 8}, "n1", 3, [1], 630 + 3600 * 4 / 3),
        # tp 4: every node holds ranks of two replicas, DP 4 -> 2: 630 + 7200.
        ({"dp_size": 4, "tp_size": 4, "pp_size": 2}, "n0", 2, [0, 1], 7830.0),
        # tp 8, pp 2: n2 holds replica 0's second pipeline stage, DP 2 -> 1.
        ({"dp_size": 2, "tp_size": 8, "pp_size": 2}, "n2", 1, [0], 7830.0),
    ],
)
def test_restart_scaled_drops_every_replica_with_a_rank_on_the_node(
    layout: dict[str, int], fault_on: str, new_dp: int, dropped: list[int], scaled_cost: float
) -> None:
    s = Story(["n0", "n1", "n2", "n3"], job_kw=SCALED | layout)
    s.faults[1] = down(1, fault_on, "mlx5_3", 100)
    out = s.step(100)
    assert out.decision is not None
    assert out.decision.inputs["new_dp_size"] == new_dp
    assert out.decision.costs_s["restart_scaled"] == scaled_cost
    assert (
        out.decision.costs_gpu_s["restart_scaled"] == scaled_cost * 32 * new_dp / layout["dp_size"]
    )
    assert out.decision.action == Action.RESTART_SCALED
    assert out.decision.plan["drop_nodes"] == [fault_on]
    assert out.decision.plan["new_dp_size"] == new_dp
    assert out.decision.plan["dropped_replicas"] == dropped


def test_no_restart_scaled_when_the_node_holds_a_rank_of_every_replica() -> None:
    # dp 8 x pp 4, tp 1: n0's 8 ranks are one of each replica; nothing would be left.
    s = Story(["n0", "n1", "n2", "n3"], job_kw=SCALED | {"dp_size": 8, "pp_size": 4})
    s.faults[1] = down(1, "n0", "mlx5_3", 100)
    out = s.step(100)
    assert out.decision is not None
    assert out.decision.costs_s["restart_scaled"] is None
    assert out.decision.inputs["new_dp_size"] is None
    assert out.decision.action == Action.FAILOVER  # 11130 s < restart's 11430 s
    assert "drop_nodes" not in out.decision.plan


def test_a_layout_that_does_not_describe_the_ranks_offers_no_restart_scaled() -> None:
    s = Story(["n0", "n1"], job_kw=SCALED | {"dp_size": 8})  # 8 x 1 x 1 != 16 ranks
    s.faults[1] = down(1, "n0", "mlx5_3", 100)
    out = s.step(100)
    assert out.decision is not None and out.decision.costs_s["restart_scaled"] is None


def test_a_failover_records_what_it_saved_and_a_k_that_changes_no_answer_is_no_decision() -> None:
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    first = s.step(3000)
    assert first.decision is not None and first.decision.action == Action.FAILOVER
    # 16 GPUs x (restart 4230 s - failover 30 + 1.5·600 + 600 = 1530 s).
    assert first.decision.costs_s["restart"] == 4230.0
    assert first.decision.costs_s["failover"] == 1530.0
    assert first.decision.saved_gpu_s == 16 * 2700.0
    # A measured k that leaves the answer as it was (the same failover) is no decision
    # (issue 28, case 11), and the k decided with stays.
    for step, k in enumerate((1.1, 1.134, 1.17)):  # drifting 3 % a report
        s.measured_k = k
        assert s.step(3100 + step).decision is None
        assert s.desired.k == 1.5


def test_dcr_or_balance_disables_the_lost_rails_channels_for_the_whole_communicator() -> None:
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    out = s.step(3000)
    assert out.decision is not None
    comm = out.decision.plan["communicators"][0]
    assert comm["mitigation"] in ("dcr", "balance")
    assert comm["disabled_channels"] == [3, 11]
    assert ("balance", tuple(range(16)), (3, 11)) in kinds(s.intents[-1])


# --- FlowCheck: a lost iteration asks for a checkpoint and makes restarting dearer ----------------


def test_a_mirror_failure_asks_every_rank_for_a_checkpoint_until_a_newer_normal_one() -> None:
    s = Story(["n0", "n1"])
    s.job_kw["mirror_failures"] = (MirrorFailureSeen(1, 500, at(100), rebuilt_at=at(94)),)
    out = s.step(101)
    assert out.decision is None  # not a path outcome: nothing to decide, only to ask
    assert out.desired.checkpoint_after == 500
    assert out.desired.mode == Mode.NORMAL and dict(out.desired.moved) == {}
    assert s.intents[-1] == [Intent(IntentKind.CHECKPOINT_NOW, 0, tuple(range(16)), iteration=500)]
    s.step(102)
    assert s.intents[-1] == []  # asked once
    # FlowCheck checkpoints of later iterations are rebuilt on the lost one: still open.
    s.checkpoint = CheckpointSeen(7, at(106), at(106), "flowcheck", iteration=501)
    s.step(106)
    assert (s.desired.checkpoint_after, s.intents[-1]) == (500, [])
    # A second loss before the checkpoint came: the request moves on to it.
    s.job_kw["mirror_failures"] += (MirrorFailureSeen(2, 510, at(160)),)
    s.step(161)
    assert kinds(s.intents[-1]) == [("checkpoint_now", tuple(range(16)), ())]
    assert s.intents[-1][0].iteration == 510
    # A normal checkpoint of 510 is not newer than 510; one of 511 ends the request.
    s.job_kw["full_checkpoint_iteration"] = 510
    assert s.step(170).desired.checkpoint_after == 510 and s.intents[-1] == []
    s.job_kw["full_checkpoint_iteration"] = 511
    done = s.step(180)
    assert done.desired.checkpoint_after is None and s.intents[-1] == []
    assert done.decision is None
    # Stored and read back, the request survives the round trip.
    assert Desired.from_json(out.desired.to_json()) == out.desired


def test_a_normal_checkpoint_without_an_iteration_answers_the_failures_before_it() -> None:
    s = Story(["n0", "n1"])
    s.job_kw["mirror_failures"] = (MirrorFailureSeen(1, 500, at(100)),)
    s.job_kw["full_checkpoint_unnumbered_at"] = at(100)  # not after the failure
    assert s.step(101).desired.checkpoint_after == 500
    s.job_kw["full_checkpoint_unnumbered_at"] = at(130)
    assert s.step(131).desired.checkpoint_after is None


def test_a_restarting_job_is_not_asked_for_a_checkpoint() -> None:
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 1000)
    s.step(1000)
    assert mode(s) == Mode.RESTARTING
    s.job_kw["mirror_failures"] = (MirrorFailureSeen(1, 500, at(1005)),)
    s.step(1010)
    assert s.intents[-1] == []


@pytest.mark.parametrize(
    ("failure", "action", "t_elapsed_s"),
    [
        # FlowCheck checkpointed 10 s before the fault: restarting loses almost nothing.
        (None, Action.RESTART, 10.0),
        # Iteration 300 was lost at 1506 s; FlowCheck kept reporting later iterations,
        # but the last one rebuilt is from 1500 s: 1500 s of work to redo, past the
        # threshold of 1200 s (k = 1.5, an hour's interval), so failing over is cheaper.
        (MirrorFailureSeen(1, 300, at(1506), rebuilt_at=at(1500)), Action.FAILOVER, 1500.0),
        # No checkpoint below 300 known: the loss itself bounds the last rebuilt one.
        (MirrorFailureSeen(1, 300, at(1700)), Action.FAILOVER, 1300.0),
    ],
)
def test_t_elapsed_counts_from_the_last_rebuilt_iteration_while_a_failure_is_open(
    failure: MirrorFailureSeen | None, action: Action, t_elapsed_s: float
) -> None:
    s = Story(["n0", "n1"], last_checkpoint_at=at(2990))
    s.checkpoint = CheckpointSeen(9, at(2990), at(2990), "flowcheck", iteration=600)
    if failure is not None:
        s.job_kw["mirror_failures"] = (failure,)
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    out = s.step(3000)
    assert out.decision is not None
    assert out.decision.action == action
    assert out.decision.inputs["t_elapsed_s"] == t_elapsed_s
