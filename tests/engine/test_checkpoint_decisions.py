"""The re-decision at a checkpoint while failed over: its exact record and desired state."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from scheduler_svc.engine.decision import spare_price_s
from scheduler_svc.engine.fabric import SwitchEvidence
from scheduler_svc.engine.state import Action, CheckpointSeen, DecisionRecord, Mode, Options
from tests.engine.stories import Story, at, down


def failed_over(**job_kw: object) -> Story:
    s = Story(["n0", "n1"], job_kw=dict(job_kw))
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    first = s.step(3000)
    assert first.decision is not None and first.decision.action == Action.FAILOVER
    assert s.desired.k == 1.5
    return s


def checkpoint_decision(options: dict[str, Any], **job_kw: object) -> DecisionRecord:
    """The decision at a checkpoint 100 s after failing over, a day's repair ahead, with
    these options (say a spare reserve) and the job's `job_kw`."""
    s = failed_over(repair_estimate_s=86400, **job_kw)
    s.options = replace(s.options, **options)
    s.checkpoint = CheckpointSeen(5, at(3100), at(3100))
    d = s.step(3100).decision
    assert d is not None
    return d


def test_a_long_repair_ahead_restarts_at_the_checkpoint() -> None:
    s = failed_over(repair_estimate_s=86400)
    s.checkpoint = CheckpointSeen(5, at(3100), at(3100))
    out = s.step(3100)
    d = out.decision
    assert d is not None
    assert d.trigger == "checkpoint:5"
    assert d.action == Action.RESTART
    # 100 s degraded of the 86400 s repair: 86300 s left at k=1.5.
    assert d.reason == (
        "restart at this checkpoint: reload 600 s < 43150 s lost running degraded "
        "(k=1.500) until the repair in 86300 s"
    )
    assert d.costs_s == {"restart": 600, "failover": 43150.0}
    assert d.costs_gpu_s == {}
    assert d.plan == {"repair_in_s": 86300.0, "k": 1.5}
    assert d.inputs["k"] == 1.5
    assert d.inputs["t_elapsed_s"] == 3100.0
    assert d.fault_key is None
    assert out.desired.mode == Mode.RESTARTING
    assert out.desired.moved == {}
    assert out.desired.disabled == {}
    assert out.desired.mitigation == {}
    assert out.desired.channel_plan() == ({}, {}, {})
    assert (out.desired.checkpoint_id, out.desired.verdict) == (5, "restart")
    assert out.conn is not None and out.conn.failed_over_ranks == (3,)
    assert out.warnings == ()


def test_a_short_repair_keeps_running_degraded_and_decides_once() -> None:
    s = failed_over(repair_estimate_s=1200)
    moved = dict(s.desired.moved)
    s.checkpoint = CheckpointSeen(6, at(3100), at(3100))
    out = s.step(3100)
    d = out.decision
    assert d is not None
    assert d.trigger == "checkpoint:6"
    assert d.action == Action.NONE
    assert d.reason == (
        "keep running degraded: 550 s lost until the repair in 1100 s (k=1.500) <= reload 600 s"
    )
    assert d.costs_s == {"restart": 600, "failover": 550.0}
    assert d.plan == {"repair_in_s": 1100.0, "k": 1.5}
    assert out.desired.mode == Mode.FAILED_OVER
    assert dict(out.desired.moved) == moved
    assert (out.desired.checkpoint_id, out.desired.verdict) == (6, "keep")
    # The next checkpoint gives the same answer: recorded, no decision.
    s.checkpoint = CheckpointSeen(7, at(3200), at(3200))
    again = s.step(3200)
    assert again.decision is None
    assert again.conn is not None and again.conn.failed_over_ranks == (3,)
    assert again.warnings == ()
    assert (again.desired.checkpoint_id, again.desired.verdict) == (7, "keep")


def test_the_measured_k_and_a_repair_already_past_decide() -> None:
    s = failed_over(repair_estimate_s=50)
    s.measured_k = 1.25
    s.step(3050)
    s.checkpoint = CheckpointSeen(8, at(3100), at(3100))
    d = s.step(3100).decision
    assert d is not None
    assert d.trigger == "checkpoint:8"
    assert d.plan == {"repair_in_s": 0.0, "k": 1.25}
    assert d.costs_s == {"restart": 600, "failover": 0.0}
    assert d.reason == (
        "keep running degraded: 0 s lost until the repair in 0 s (k=1.250) <= reload 600 s"
    )


def test_the_default_repair_estimate_is_a_day() -> None:
    s = failed_over()
    s.checkpoint = CheckpointSeen(9, at(3100), at(3100))
    d = s.step(3100).decision
    assert d is not None
    assert d.plan == {"repair_in_s": 86300.0, "k": 1.5}


def test_degraded_time_counts_fractions_of_a_second() -> None:
    s = failed_over(repair_estimate_s=1200)
    s.checkpoint = CheckpointSeen(10, at(3000.5), at(3000.5))
    d = s.step(3000.5).decision
    assert d is not None
    assert d.plan == {"repair_in_s": 1199.5, "k": 1.5}


def test_the_inputs_use_the_k_of_the_failover() -> None:
    s = Story(
        ["n0", "n1"], job_kw={"comm_share": 0.4, "slowdown_k": None, "repair_estimate_s": 86400}
    )
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.step(3000)
    k = s.desired.k
    assert k is not None and k != 1.03
    s.checkpoint = CheckpointSeen(11, at(3100), at(3100))
    d = s.step(3100).decision
    assert d is not None
    assert (d.inputs["k"], d.inputs["k_source"]) == (k, "measured")
    assert d.plan["k"] == k


def test_a_measured_k_and_a_checkpoint_in_one_pass_are_one_decision() -> None:
    """Both arrive before the same pass: the checkpoint is decided with the measured k, and
    an identical pass after it decides nothing (it used to decide measured_k, then the
    checkpoint, on two passes)."""
    s = failed_over(repair_estimate_s=50)
    s.measured_k = 1.25
    s.checkpoint = CheckpointSeen(8, at(3100), at(3100))
    d = s.step(3100).decision
    assert d is not None and d.trigger == "checkpoint:8" and d.plan["k"] == 1.25
    assert s.desired.k == 1.25
    assert s.step(3101).decision is None
    assert s.step(3102).decision is None


def test_a_new_k_at_a_checkpoint_is_no_decision_while_the_verdict_stands() -> None:
    """Issue 28, case 11: a "keep" again at a later checkpoint is no decision, whatever k
    it now rests on; the k is kept with the verdict, and a verdict that flips is one."""
    s = failed_over(repair_estimate_s=50)
    s.checkpoint = CheckpointSeen(8, at(3100), at(3100))
    assert s.step(3100).decision is not None  # keep
    s.checkpoint = CheckpointSeen(9, at(3110), at(3110))
    assert s.step(3110).decision is None  # keep again, same k
    s.measured_k = 1.25
    s.checkpoint = CheckpointSeen(10, at(3120), at(3120))
    out = s.step(3120)
    assert out.decision is None
    assert (out.desired.checkpoint_id, out.desired.verdict, out.desired.k) == (10, "keep", 1.25)
    assert s.step(3121).decision is None


def test_a_k_within_the_tolerance_at_a_later_checkpoint_is_no_new_decision() -> None:
    """1.52 against the failover's 1.5 is within 2 % of it: the "keep" stands, quietly."""
    s = failed_over(repair_estimate_s=50)
    s.checkpoint = CheckpointSeen(8, at(3100), at(3100))
    assert s.step(3100).decision is not None  # keep
    s.measured_k = 1.52
    s.checkpoint = CheckpointSeen(9, at(3110), at(3110))
    out = s.step(3110)
    assert out.decision is None
    assert (out.desired.checkpoint_id, out.desired.verdict, out.desired.k) == (9, "keep", 1.52)


def test_a_k_exactly_at_the_tolerance_is_not_a_change() -> None:
    """Only a k further than the tolerance from the last is news (2.5 is 25 % off 2.0)."""
    s = Story(["n0", "n1"], job_kw={"slowdown_k": 2.0, "repair_estimate_s": 50})
    s.options = Options(measured_k_tolerance=0.25)
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    assert s.step(3000).decision is not None and s.desired.k == 2.0
    s.checkpoint = CheckpointSeen(8, at(3100), at(3100))
    assert s.step(3100).decision is not None  # keep
    s.measured_k = 2.5
    s.checkpoint = CheckpointSeen(9, at(3110), at(3110))
    out = s.step(3110)
    assert out.decision is None
    assert (out.desired.verdict, out.desired.k) == ("keep", 2.5)


def registered_on_a_fault(**job_kw: object) -> Story:
    """A job posted while a fault is open: it starts on its backups, and no k is decided."""
    s = Story(["n0", "n1"], job_kw={"registering": True, **job_kw})
    s.faults[1] = down(1, "n0", "mlx5_3", 100)
    first = s.step(210)
    assert first.decision is not None and first.decision.trigger.startswith("replan:")
    assert s.desired.k is None
    s.job_kw = dict(job_kw)
    return s


def test_without_any_k_the_checkpoint_decides_with_the_first_default() -> None:
    s = registered_on_a_fault(slowdown_k=None, repair_estimate_s=1200)
    s.checkpoint = CheckpointSeen(5, at(300), at(300))
    d = s.step(300).decision
    assert d is not None
    # The repair clock runs from the fault (100 s), not from the failover (210 s).
    assert d.plan == {"repair_in_s": 1000.0, "k": 1.03}
    assert s.desired.k == 1.03


def test_a_declared_k_decides_the_checkpoint_when_no_failover_set_one() -> None:
    """The job's own slowdown_k, as its inputs record says (it used to be the default 1.03)."""
    s = registered_on_a_fault(slowdown_k=1.5, repair_estimate_s=1200)
    s.checkpoint = CheckpointSeen(5, at(300), at(300))
    d = s.step(300).decision
    assert d is not None
    assert (d.inputs["k"], d.inputs["k_source"]) == (1.5, "measured")
    assert d.plan == {"repair_in_s": 1000.0, "k": 1.5}
    assert d.reason == (
        "keep running degraded: 500 s lost until the repair in 1000 s (k=1.500) <= reload 600 s"
    )
    assert s.desired.k == 1.5


def test_the_node_plans_warnings_travel_with_the_checkpoint_verdicts() -> None:
    s = Story(["n0", "n1"], shape={"switch_name": "leaf"}, job_kw={"repair_estimate_s": 50})
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.step(3000)
    s.checkpoint = CheckpointSeen(8, at(3100), at(3100))
    first = s.step(3100)
    assert first.decision is not None and first.decision.trigger == "checkpoint:8"
    s.checkpoint = CheckpointSeen(9, at(3110), at(3110))
    again = s.step(3110)
    assert again.decision is None and again.desired.checkpoint_id == 9
    for out in (first, again):
        assert len(out.warnings) == 16
        assert out.warnings[3].startswith("GPU 3: backup mlx5_2/1 hangs off the same fabric")


def test_a_checkpoint_taken_at_the_failover_itself_is_no_re_decision() -> None:
    """Only a checkpoint taken after the job failed over was taken running degraded."""
    s = failed_over(repair_estimate_s=86400)
    assert s.failed_over_at == at(3000)
    s.checkpoint = CheckpointSeen(5, at(3000), at(3100))
    out = s.step(3100)
    assert out.decision is None
    assert (out.desired.mode, out.desired.checkpoint_id, out.desired.verdict) == (
        Mode.FAILED_OVER,
        None,
        None,
    )
    s.checkpoint = CheckpointSeen(6, at(3101), at(3101))
    later = s.step(3101)
    assert later.decision is not None and later.decision.trigger == "checkpoint:6"
    assert later.desired.mode == Mode.RESTARTING


@pytest.mark.parametrize(
    ("tolerance", "measured_k"),
    [
        (0.02, 1.52),  # 0.02 off 1.5: within 2 % of it (0.03)
        (0.125, 1.6875),  # exactly 12.5 % of 1.5 off it: not further than the tolerance
    ],
)
def test_a_measured_k_within_the_tolerance_of_the_failovers_is_no_re_decision(
    tolerance: float, measured_k: float
) -> None:
    """Between checkpoints a measured k re-decides only when further from the k decided
    than the tolerance (a share of that k); the k stored stays the decided one."""
    s = Story(["n0", "n1"], options=Options(measured_k_tolerance=tolerance))
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.step(3000)
    assert s.desired.k == 1.5
    s.measured_k = measured_k
    out = s.step(3100)
    assert out.decision is None
    assert (out.desired.mode, out.desired.k) == (Mode.FAILED_OVER, 1.5)


def test_one_restart_per_evidence_and_the_incarnation_placed_back_on_it_runs_degraded() -> None:
    """Issue 28, case 6: a FlowCheck job checkpoints every iteration while its NIC stays
    broken. The first checkpoint restarts it; the next incarnation, placed back on the
    same nodes, starts on its backups once, and no later checkpoint restarts it again."""
    s = failed_over(repair_estimate_s=86400)
    s.checkpoint = CheckpointSeen(5, at(3100), at(3100), kind="flowcheck", iteration=50)
    first = s.step(3100)
    assert first.decision is not None and first.decision.action == Action.RESTART
    assert s.desired.restarted_for == frozenset({"fault:1"})
    # The fleet manager posts the next incarnation on the same nodes.
    s.restart_decided_at = None
    s.checkpoint = CheckpointSeen(6, at(3700), at(3700), kind="flowcheck", iteration=51)
    back = s.step(3700)
    assert back.decision is not None and back.decision.action == Action.FAILOVER
    assert back.decision.reason.endswith("it is not restarted again for them")
    assert s.mode == Mode.FAILED_OVER
    for i in range(20):  # a checkpoint every iteration: no decision, no restart
        t = 3710 + 10 * i
        s.checkpoint = CheckpointSeen(7 + i, at(t), at(t), kind="flowcheck", iteration=52 + i)
        out = s.step(t)
        assert out.decision is None
        assert (out.desired.mode, out.desired.verdict) == (Mode.FAILED_OVER, "keep")
    assert [d.decision.action for d in s.decisions if d.decision] == [
        Action.FAILOVER,
        Action.RESTART,
        Action.FAILOVER,
    ]


def test_a_restart_that_cannot_escape_the_fault_is_not_decided() -> None:
    """No spare node and no scaled restart: the restarted job would land on the same
    broken NIC, so the checkpoint keeps it running degraded, and says why."""
    s = failed_over(repair_estimate_s=86400, spare_nodes=False)
    s.checkpoint = CheckpointSeen(5, at(3100), at(3100))
    d = s.step(3100).decision
    assert d is not None and d.action == Action.NONE
    assert d.reason.startswith(
        "keep running degraded: a restart cannot escape the fault (no spare node to take "
        "the faulty one's place, and no scaled restart): restart at this checkpoint"
    )
    assert s.mode == Mode.FAILED_OVER


def test_a_checkpoint_restart_leaves_the_spares_kept_back_for_lost_gpus() -> None:
    """One spare free and one kept back (RAILOVER_SPARE_RESERVE): the job runs degraded on,
    and says so; with two free it restarts onto one of them."""

    def checkpoint_with(spares_free: int) -> DecisionRecord:
        return checkpoint_decision({"spare_reserve": 1}, spares_free=spares_free)

    kept = checkpoint_with(1)
    assert kept.action == Action.NONE
    assert kept.reason.startswith(
        "keep running degraded: a restart cannot escape the fault (no spare node to take "
        "the faulty one's place beyond the 1 kept back, of 1 free, and no scaled restart)"
    )
    assert checkpoint_with(2).action == Action.RESTART
    none_at_all = failed_over(repair_estimate_s=86400, spare_nodes=False)
    none_at_all.options = replace(none_at_all.options, spare_reserve=1)
    none_at_all.checkpoint = CheckpointSeen(5, at(3100), at(3100))
    d = none_at_all.step(3100).decision
    assert d is not None and "no spare node to take the faulty one's place, and no" in d.reason


def test_a_checkpoint_restart_pays_for_the_spare_it_takes() -> None:
    """A day's repair ahead at k=1.5 costs 43,200 s running degraded against a 600 s reload:
    with spares plenty the job restarts. Priced (RAILOVER_HARD_FAILURES_PER_H), the last
    of 2 free spares is worth more than that to the lost GPUs and dead nodes a day brings
    at 0.1 an hour, when each would wait a week for a node; the job runs degraded on and
    says so. With 12 free the price is negligible and it restarts."""
    week = 7 * 86400.0

    def checkpoint_with(spares_free: int) -> DecisionRecord:
        priced = {"hard_failures_per_h": 0.1}
        return checkpoint_decision(priced, spares_free=spares_free, node_replace_s=week)

    kept = checkpoint_with(2)
    price = spare_price_s(2, 0.1, 86400 - 100, week)  # the repair left at the checkpoint
    assert price > 43_200
    assert kept.action == Action.NONE
    assert kept.reason.startswith("keep running degraded: ")
    assert f"<= reload 600 s + {price:.0f} s the spare is worth to lost GPUs" in kept.reason
    plenty = checkpoint_with(12)
    assert plenty.action == Action.RESTART
    assert "the spare is worth" in plenty.reason  # priced, and small


def test_a_scaled_restart_takes_no_spare_and_pays_no_price() -> None:
    """Both free spares kept back (RAILOVER_SPARE_RESERVE 2): the checkpoint's restart is a
    scaled one, which takes no spare, so it pays no spare's price, even with its reload
    half a second short of the 43,150 s the job would lose running degraded."""
    d = checkpoint_decision(
        {"spare_reserve": 2, "hard_failures_per_h": 0.1},
        spares_free=2,
        node_replace_s=7 * 86400.0,
        reload_s=43_149.5,
        allow_scaling=True,
        dp_size=2,
        tp_size=8,
    )
    assert d.action == Action.RESTART, d.reason
    assert "the spare is worth" not in d.reason


@pytest.mark.parametrize(("estimate", "hold"), [(7200.0, 7200.0), (None, 50_000.0)])
def test_a_faults_decision_prices_the_spare_by_the_repair_ahead(
    estimate: float | None, hold: float
) -> None:
    """The fault's decision holds the spare until the job's repair estimate, or the
    service's default repair time when the job gives none."""
    job = {"spares_free": 2, "node_replace_s": 86400.0, "repair_estimate_s": estimate}
    s = Story(["n0", "n1"], job_kw=job)
    s.options = replace(s.options, hard_failures_per_h=0.1, default_repair_s=50_000.0)
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    d = s.step(3000).decision
    assert d is not None
    assert d.inputs["spare_price_s"] == pytest.approx(spare_price_s(2, 0.1, hold, 86400.0))
    assert d.inputs["spare_price_s"] > 0


def test_a_restart_cannot_escape_a_switch_failure_so_the_checkpoint_keeps_running() -> None:
    """A leaf fails under both nodes with a day's repair ahead: a restart would need a spare
    for every node under it, and placed back on them the job fails over again, so the
    checkpoint keeps it running degraded (the fleet twin's leaf failures restarted jobs
    onto nothing but a wait for the repair)."""
    s = Story(["n0", "n1"], job_kw={"repair_estimate_s": 86400})
    s.faults[1] = down(1, "n0", "mlx5_5", 3000, switch="rail5-leaf")
    s.faults[2] = down(2, "n1", "mlx5_5", 3000.4, switch="rail5-leaf")
    s.switches[1] = SwitchEvidence(1, "rail5-leaf", at(3000.6), "2 nodes lost their port")
    first = s.step(3001).decision
    assert first is not None and first.action == Action.FAILOVER
    s.checkpoint = CheckpointSeen(5, at(3100), at(3100))
    d = s.step(3100).decision
    assert d is not None and d.action == Action.NONE
    assert d.reason.startswith(
        "keep running degraded: a restart cannot escape a switch failure (every node under "
        "the switch would need a spare): restart at this checkpoint"
    )
    assert s.mode == Mode.FAILED_OVER


def test_the_repair_clock_runs_from_the_fault_across_incarnations() -> None:
    """Degraded time counts from the fault's opening, not from the new incarnation's
    failover, so the remaining repair shrinks as the fault ages."""
    s = failed_over(repair_estimate_s=7200, spare_nodes=False)
    s.failed_over_at = at(5000)  # as if an incarnation failed over again later
    s.checkpoint = CheckpointSeen(5, at(5100), at(5100))
    d = s.step(5100).decision
    assert d is not None
    assert d.plan == {"repair_in_s": 7200.0 - 2100.0, "k": 1.5}


def test_a_fault_whose_cause_is_gone_is_not_restarted_for_at_a_checkpoint() -> None:
    """A flap: the port is back 5 s after it failed, and the job waits on its backup only
    for the damping period (120 s here). A checkpoint meanwhile (FlowCheck takes one
    every iteration) must not restart the job for a day-long repair that will not
    happen: the repair left is the damping left. Found by the fleet twin, where every
    flap under a FlowCheck job cost it a reload."""
    s = failed_over(repair_estimate_s=86400)
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3005))
    s.checkpoint = CheckpointSeen(5, at(3006), at(3006))
    d = s.step(3006).decision
    assert d is not None and d.action == Action.NONE
    assert d.plan == {"repair_in_s": 119.0, "k": 1.5}
    assert d.reason.startswith("keep running degraded")
    assert s.mode == Mode.FAILED_OVER


def test_the_repair_left_for_a_recovering_fault_counts_from_the_checkpoint() -> None:
    """The checkpoint was taken half a second before the flap's port is damped: that half
    second is the repair left (not rounded up to a whole one)."""
    s = failed_over(repair_estimate_s=86400)
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3005))
    s.checkpoint = CheckpointSeen(5, at(3124.5), at(3124.5))
    d = s.step(3124.6).decision
    assert d is not None and d.action == Action.NONE
    assert d.plan == {"repair_in_s": 0.5, "k": 1.5}


@pytest.mark.parametrize(
    ("scaling", "dp", "restarts"), [(True, 2, True), (False, 2, False), (True, 1, False)]
)
def test_without_a_spare_only_a_scaled_restart_escapes_the_fault(
    scaling: bool, dp: int, restarts: bool
) -> None:
    """No spare node: a restart at the checkpoint escapes the fault only as a scaled
    restart without n0, which needs scaling allowed and a replica left (DP 2 of TP 8:
    n0 and n1 are one replica each; DP 1 leaves none)."""
    s = failed_over(
        repair_estimate_s=86400,
        spare_nodes=False,
        allow_scaling=scaling,
        dp_size=dp,
        tp_size=16 // dp,
    )
    s.checkpoint = CheckpointSeen(5, at(3100), at(3100))
    d = s.step(3100).decision
    assert d is not None
    assert (d.action == Action.RESTART) == restarts, d.reason


def test_a_checkpoint_does_not_restart_for_evidence_a_restart_was_decided_for() -> None:
    """The job carries a restart verdict for fault 1 (its last incarnation was restarted
    for it) and fails over on it: a checkpoint with a long repair ahead keeps it running
    degraded, and says why."""
    s = Story(["n0", "n1"], job_kw={"repair_estimate_s": 86400})
    s.desired = replace(s.desired, restarted_for=frozenset({"fault:1"}))
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    assert s.step(3000).decision is not None and s.mode == Mode.FAILED_OVER
    s.checkpoint = CheckpointSeen(5, at(3100), at(3100))
    d = s.step(3100).decision
    assert d is not None and d.action == Action.NONE
    assert d.reason == (
        "keep running degraded: a restart was already decided for this evidence, and the "
        "job came back on it"
    )
