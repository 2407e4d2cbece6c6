"""A job that restarts, or registers, while faults are open: what its new life starts on.

Each story restarts the job early (fault at 1000 s: the cost model restarts) and then
lets the fleet manager bring it back, with the fault still open.
"""

from __future__ import annotations

from scheduler_svc.engine.fabric import Maintenance, SwitchEvidence
from scheduler_svc.engine.intents import IntentKind, command_diff
from scheduler_svc.engine.job_routes import routes_of
from scheduler_svc.engine.paths import plan_node
from scheduler_svc.engine.reconcile import reconcile
from scheduler_svc.engine.state import Action, CheckpointSeen, Mode
from tests.engine.stories import Story, at, down, topo

# Both RNICs of n0's GPUs 2 and 3 fail: ranks 2 and 3 lose every path.
ISOLATED = (
    "2 rank pair(s) across nodes have no path left (2 rank(s) lost both RNICs): "
    "no usable path is left for some GPU (primary and backup both lost); "
    "restart (1.18 h) is the only way forward"
)


def restarted(**story_kw: object) -> Story:
    """The job restarted after n0/mlx5_3 failed at 1000 s."""
    s = Story(["n0", "n1"], **story_kw)  # type: ignore[arg-type]
    s.faults[1] = down(1, "n0", "mlx5_3", 1000)
    first = s.step(1000)
    assert first.decision is not None and first.decision.action == Action.RESTART
    assert (s.mode, s.desired.k, s.restart_decided_at) == (Mode.RESTARTING, 1.5, at(1000))
    return s


def test_a_restarting_job_waits_and_keeps_what_breaks_meanwhile_for_its_new_life() -> None:
    """Until the fleet manager brings the job back, a new fault decides nothing, but the
    pass records it as known and still answers the paths and the plans' warnings."""
    s = restarted(shape={"switch_name": "leaf"})
    s.faults[2] = down(2, "n1", "mlx5_5", 1010)
    now = at(1020)
    out = s.step(1020)
    assert out.decision is None
    assert out.desired.mode == Mode.RESTARTING
    assert out.desired.evidence == frozenset({"fault:1", "fault:2"})
    assert out.conn == routes_of(s.job(), s.fabric(now))
    assert out.conn.failed_over_ranks == (3, 13)
    warned = plan_node(topo("n0", switch_name="leaf")).warnings
    assert warned and out.warnings == warned + plan_node(topo("n1", switch_name="leaf")).warnings
    # Back again: both faults were known at the restart, so no cost question. (The
    # service clears the restart time when the next incarnation starts.)
    s.restart_decided_at = None
    s.checkpoint = CheckpointSeen(9, at(1100), received_at=at(1100))
    back = s.step(1100)
    assert back.decision is not None
    assert back.decision.trigger == "replan:2026-11-01T12:18:20+00:00"
    assert back.decision.reason == (
        "the restarted job starts on its backups: faults still open; it is not restarted "
        "again for them"
    )
    assert dict(back.desired.moved) == {3: "mlx5_2/1", 13: "mlx5_4/1"}


def test_a_restarted_job_starts_on_its_backups_with_the_k_and_checkpoint_it_had() -> None:
    """The fault that caused the restart is still open when the new incarnation reports its
    first checkpoint: it starts on the backup (a replan, not a second restart) with the k
    decided at the restart and that checkpoint recorded as seen."""
    s = restarted()
    s.restart_decided_at = None  # the next incarnation started
    s.checkpoint = CheckpointSeen(9, at(1100), received_at=at(1100))
    out = s.step(1100)
    d = out.decision
    assert d is not None
    assert d.action == Action.FAILOVER
    assert d.trigger == "replan:2026-11-01T12:18:20+00:00"
    assert d.reason == (
        "the restarted job starts on its backups: faults still open; it is not restarted "
        "again for them"
    )
    assert d.fault_key is None
    assert (d.costs_s, d.costs_gpu_s, d.saved_gpu_s) == ({}, {}, 0.0)
    assert (d.inputs["t_elapsed_s"], d.inputs["k"]) == (1100.0, 1.5)
    assert d.plan["failed_over"] == [
        {"rank": 3, "node": "n0", "gpu": 3, "from": "mlx5_3/1", "to": "mlx5_2/1"}
    ]
    assert out.desired.mode == Mode.FAILED_OVER
    assert dict(out.desired.moved) == {3: "mlx5_2/1"}
    assert out.desired.evidence == frozenset({"fault:1"})
    assert out.desired.k == 1.5
    assert out.desired.checkpoint_id == 9
    assert out.desired.disabled == {77: (3, 11)}


def test_a_restarted_job_keeps_the_k_of_the_restart_when_it_declares_another() -> None:
    """The k stored with the new life is the one the restart decided on, not the job's."""
    s = restarted()
    s.job_kw = {"slowdown_k": 1.2}
    s.restart_decided_at = None  # the next incarnation started
    s.checkpoint = CheckpointSeen(9, at(1100), received_at=at(1100))
    out = s.step(1100)
    assert out.decision is not None and out.decision.inputs["k"] == 1.2
    assert out.desired.k == 1.5


def test_a_job_placed_back_without_a_path_is_not_restarted_again_and_says_why() -> None:
    """Faults open since before the restart leave ranks 2 and 3 without any path, and the
    next incarnation is placed back on them: a restart would land it there again, so it
    runs as placed (nobody can move to a backup: normal, not failed over), with one
    decision saying so (issue 28: one restart per evidence per placement)."""
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 1000)
    s.faults[2] = down(2, "n0", "mlx5_2", 1000)
    s.step(1500)
    assert s.mode == Mode.RESTARTING
    s.restart_decided_at = None  # the next incarnation started
    s.checkpoint = CheckpointSeen(9, at(1600), received_at=at(1600))
    out = s.step(1700)
    d = out.decision
    assert d is not None
    assert (d.action, d.trigger) == (Action.NONE, "replan:2026-11-01T12:28:20+00:00")
    assert d.reason == (
        "the restarted job resumes on the faults it was restarted for, 2 rank(s) without a "
        "usable path: it is not restarted again for them (place it without the faulty "
        "node); no rank can move to a backup"
    )
    assert out.desired.mode == Mode.NORMAL
    # The same evidence on the next passes: nothing more to say.
    again = s.step(1800)
    assert (again.decision, again.desired.mode) == (None, Mode.NORMAL)


def test_a_restarted_job_without_a_path_for_new_evidence_restarts_again_and_says_why() -> None:
    """Ranks 2 and 3 lost both RNICs after the restart was decided: the restarted job
    resumes without a path for evidence it was not restarted for, and the cost model
    restarts it again, timed now."""
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 1000)
    s.faults[2] = down(2, "n0", "mlx5_4", 1000)  # ranks 3 and 5: GPU 3's backup is fine
    s.step(1500)
    assert s.mode == Mode.RESTARTING
    s.faults[3] = down(3, "n0", "mlx5_2", 1550)
    s.step(1560)  # while restarting: known, decided nothing
    s.restart_decided_at = None  # the next incarnation started
    s.checkpoint = CheckpointSeen(9, at(1600), received_at=at(1600))
    now = at(1700)
    out = reconcile(now, s.job(), s.fabric(now), s.options)
    d = out.decision
    assert d is not None
    assert d.action == Action.RESTART
    assert d.trigger == "state:2026-11-01T12:28:20+00:00"
    assert d.fault_key is None
    assert d.reason.startswith("the restarted job resumes with faults still open: ")
    assert d.inputs["t_elapsed_s"] == 1700.0
    assert out.desired.mode == Mode.RESTARTING
    assert out.desired.moved == {}
    assert out.desired.checkpoint_id == 9


def test_a_fault_that_leaves_ranks_without_a_path_is_timed_when_it_appeared() -> None:
    """New evidence that isolates ranks is decided at its own time, not the pass's."""
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 1000)
    s.faults[2] = down(2, "n0", "mlx5_2", 1000)
    out = s.step(1500)
    d = out.decision
    assert d is not None
    assert (d.action, d.trigger, d.fault_key) == (Action.RESTART, "fault:1", "fault:1")
    assert d.reason == ISOLATED
    assert d.inputs["t_elapsed_s"] == 1000.0
    assert out.conn.isolated_ranks == (2, 3)


def test_a_job_registered_on_ranks_without_a_path_restarts_with_no_restart_note() -> None:
    """Registered on open faults that isolate ranks: nothing is news, but no path is left,
    so the cost model restarts it; its reason says nothing of a restarted job."""
    s = Story(["n0", "n1"], job_kw={"registering": True})
    s.faults[1] = down(1, "n0", "mlx5_3", 100)
    s.faults[2] = down(2, "n0", "mlx5_2", 100)
    out = s.step(210)
    d = out.decision
    assert d is not None
    assert (d.action, d.trigger, d.fault_key) == (
        Action.RESTART,
        "state:2026-11-01T12:03:30+00:00",
        None,
    )
    assert d.reason == ISOLATED
    assert d.inputs["t_elapsed_s"] == 210.0
    assert out.desired.evidence == frozenset({"fault:1", "fault:2"})


def _restarted_twice_by_rail3(*, leaf_inferred: bool) -> Story:
    """n0/mlx5_2 fails early (restart); back on n0 and n1, rank 2 runs on mlx5_3. Then
    n1/mlx5_3 fails: pairs across the nodes lose their common rail, restart again, for
    faults 1 and 2. While the job waits for the fleet manager, n0/mlx5_3 fails too (rank 2
    has no RNIC left) and, with `leaf_inferred`, rail3-leaf is inferred failed from it."""
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_2", 1000, switch="rail2-leaf")
    assert s.step(1000).desired.restarted_for == {"fault:1"}
    s.restart_decided_at = None
    s.checkpoint = CheckpointSeen(9, at(1100), received_at=at(1100))
    assert mode_after(s, 1100) == Mode.FAILED_OVER
    s.faults[2] = down(2, "n1", "mlx5_3", 1200, switch="rail3-leaf")
    again = s.step(1200)
    assert again.decision is not None and again.decision.action == Action.RESTART
    assert again.desired.restarted_for == {"fault:1", "fault:2"}
    s.faults[3] = down(3, "n0", "mlx5_3", 1201, switch="rail3-leaf")
    if leaf_inferred:
        s.switches[1] = SwitchEvidence(1, "rail3-leaf", at(1202), "3 nodes lost their port")
    assert s.step(1202).decision is None
    s.restart_decided_at = None  # the next incarnation starts, on n0 and n1 again
    s.checkpoint = CheckpointSeen(10, at(1300), received_at=at(1300))
    return s


def mode_after(s: Story, t: float) -> Mode:
    s.step(t)
    return s.mode


def test_a_leaf_inferred_failed_is_one_failure_with_the_port_a_restart_was_for() -> None:
    """n1/mlx5_3, which the second restart was for, is one of rail3-leaf's ports: the
    leaf, and n0/mlx5_3 under it, are that same failure. Placed back there, the job is
    not restarted a third time; it runs on what is left and says why."""
    s = _restarted_twice_by_rail3(leaf_inferred=True)
    out = s.step(1300)
    assert out.decision is not None and out.decision.action == Action.FAILOVER
    assert out.decision.reason.startswith(
        "the restarted job resumes on the faults it was restarted for, 2 rank(s) without a "
        "usable path: it is not restarted again for them"
    )
    assert out.desired.restarted_for == {"fault:1", "fault:2", "fault:3", "switch:1"}


def test_a_port_failing_while_the_job_restarts_is_news_unless_one_failure_with_its_cause() -> None:
    """The same, but no leaf is inferred: n0/mlx5_3 is a failure of its own that no restart
    was for, so the incarnation it leaves without a path is restarted for it."""
    s = _restarted_twice_by_rail3(leaf_inferred=False)
    now = at(1300)
    out = reconcile(now, s.job(), s.fabric(now), s.options)
    assert out.decision is not None and out.decision.action == Action.RESTART
    assert out.desired.restarted_for == {"fault:1", "fault:2", "fault:3"}


def _restarted_ahead_of_rail2_leaf_window(*, announced_n0_window_at: float) -> Story:
    """n0/mlx5_3 fails late in the interval: rank 3 fails over to mlx5_2. A window on
    rail2-leaf moves jobs at once (3001 s): rank 3 has no path, restart. The next
    incarnation is placed back on n0 and n1 and runs failed over. A window on n0/mlx5_2
    (moving jobs from 3060 s) is announced at `announced_n0_window_at`."""
    s = Story(["n0", "n1"])
    n0_window = Maintenance(
        2, at(3120), at(3720), node="n0", device="mlx5_2", port=1, moves_at=at(3060)
    )
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, switch="rail3-leaf")
    assert mode_after(s, 3000) == Mode.FAILED_OVER
    if announced_n0_window_at < 3001:
        s.windows[2] = n0_window
    s.windows[3] = Maintenance(3, at(3030), at(3090), switch="rail2-leaf", moves_at=at(3000))
    restart = s.step(3001).decision
    assert restart is not None and restart.action == Action.RESTART
    s.restart_decided_at = None
    s.checkpoint = CheckpointSeen(9, at(3002), received_at=at(3002))
    assert mode_after(s, 3002) == Mode.FAILED_OVER
    s.windows[2] = n0_window
    return s


def test_a_window_announced_when_the_restart_was_decided_was_restarted_for() -> None:
    s = _restarted_ahead_of_rail2_leaf_window(announced_n0_window_at=3000)
    assert s.decisions[1].desired.restarted_for == {"fault:1", "maintenance:2", "maintenance:3"}
    out = s.step(3061)  # n0/mlx5_2's window moves jobs now: no news to this incarnation
    assert out.decision is None
    assert out.desired.mode == Mode.FAILED_OVER


def test_a_window_announced_after_the_restart_is_news_to_the_next_incarnation() -> None:
    s = _restarted_ahead_of_rail2_leaf_window(announced_n0_window_at=3002)
    assert s.decisions[1].desired.restarted_for == {"fault:1", "maintenance:3"}
    out = s.step(3061)
    assert out.decision is not None and out.decision.action == Action.RESTART
    assert out.decision.trigger == "maintenance:2"


def test_a_job_placed_back_without_a_path_fails_back_its_last_rank_on_a_backup() -> None:
    """No communicator. n0's mlx5_2 and mlx5_3 fail early (GPUs 2 and 3 have no path) and
    so does n1/mlx5_5: the job restarts. Placed back on n0 and n1, it runs on what is
    left (rank 13 on its backup). When n1/mlx5_5 comes back and is damped, rank 13
    returns: a fail-back, after which nobody is on a backup, the job is normal and its
    desired state moves no rank (not a `none` that left rank 13 on its backup)."""
    s = Story(["n0", "n1"], comm_channels=None)
    s.faults[1] = down(1, "n0", "mlx5_2", 1000)
    s.faults[2] = down(2, "n0", "mlx5_3", 1000)
    s.faults[3] = down(3, "n1", "mlx5_5", 1000)
    assert mode_after(s, 1000) == Mode.RESTARTING
    s.restart_decided_at = None
    s.checkpoint = CheckpointSeen(9, at(1100), received_at=at(1100))
    assert mode_after(s, 1100) == Mode.FAILED_OVER
    assert dict(s.desired.moved) == {13: "mlx5_4/1"}
    s.faults[3] = down(3, "n1", "mlx5_5", 1000, recovered_at=at(1200))
    back = s.step(1200 + 3600).decision
    assert back is not None and back.action == Action.FAILBACK
    assert (s.mode, dict(s.desired.moved)) == (Mode.NORMAL, {})


def test_a_port_of_another_switch_failing_while_the_job_restarts_is_news() -> None:
    """As in the leaf test, and n1's mlx5_5 (rail5-leaf, not inferred failed) fails too
    while the job restarts: only rail3-leaf and its ports are one failure with what the
    restart was for; rank 13 losing its primary to rail 5 is news, and with ranks still
    without a path the job restarts for it."""
    s = _restarted_twice_by_rail3(leaf_inferred=True)
    s.faults[4] = down(4, "n1", "mlx5_5", 1201, switch="rail5-leaf")
    now = at(1300)
    out = reconcile(now, s.job(), s.fabric(now), s.options)
    assert out.decision is not None and out.decision.action == Action.RESTART
    assert "fault:4" in out.desired.restarted_for


def test_what_a_restart_knows_of_announced_windows() -> None:
    """Ranks on GPUs 0-5 of n0 and n1 (mlx5_6 and mlx5_7 carry none of them). At the
    restart, windows are announced on rail4-leaf and on n0/mlx5_6: the leaf's is the job's
    (its ranks on GPUs 4 and 5 use it) and counts as restarted for; n0/mlx5_6's is not."""
    ranks = tuple((i * 6 + g, n, g) for i, n in enumerate(("n0", "n1")) for g in range(6))
    s = Story(["n0", "n1"], ranks=ranks)
    s.windows[4] = Maintenance(4, at(5000), at(5600), switch="rail4-leaf", moves_at=at(4940))
    s.windows[6] = Maintenance(
        6, at(5000), at(5600), node="n0", device="mlx5_6", port=1, moves_at=at(4940)
    )
    s.faults[1] = down(1, "n0", "mlx5_2", 1000)
    s.faults[2] = down(2, "n0", "mlx5_3", 1000)
    out = s.step(1000)
    assert out.decision is not None and out.decision.action == Action.RESTART
    assert out.desired.restarted_for == {"fault:1", "fault:2", "maintenance:4"}


def _placed_back_with_rank_13_on_a_windowed_backup() -> Story:
    """No communicator. n0's mlx5_2 and mlx5_3 and n1's mlx5_5 fail early, and a window on
    n1/mlx5_4 (rank 13's backup) is announced, moving jobs from 1200 s: the job restarts
    for all of it. Placed back on n0 and n1, it runs on what is left, rank 13 on mlx5_4."""
    s = Story(["n0", "n1"], comm_channels=None)
    s.faults[1] = down(1, "n0", "mlx5_2", 1000)
    s.faults[2] = down(2, "n0", "mlx5_3", 1000)
    s.faults[3] = down(3, "n1", "mlx5_5", 1000)
    s.windows[4] = Maintenance(
        4, at(1260), at(9000), node="n1", device="mlx5_4", port=1, moves_at=at(1200)
    )
    assert mode_after(s, 1000) == Mode.RESTARTING
    assert s.desired.restarted_for == {"fault:1", "fault:2", "fault:3", "maintenance:4"}
    s.restart_decided_at = None
    s.checkpoint = CheckpointSeen(9, at(1100), received_at=at(1100))
    assert mode_after(s, 1100) == Mode.FAILED_OVER
    assert dict(s.desired.moved) == {13: "mlx5_4/1"}
    return s


def test_a_rank_whose_backup_fails_too_stays_where_it_was_told() -> None:
    """The window on rank 13's backup begins while its primary is still down: rank 13 has
    no path left, which the restart was for. It is not failed back onto its dead primary
    (before: a FAILBACK saying n1's primary paths were healthy again); it stays on its
    backup, told nothing, and the job says nothing new."""
    s = _placed_back_with_rank_13_on_a_windowed_backup()
    told = s.desired
    out = s.step(1201)
    assert out.decision is None
    assert out.conn.isolated_ranks == (2, 3, 12, 13)
    assert (out.desired.mode, dict(out.desired.moved)) == (Mode.FAILED_OVER, {13: "mlx5_4/1"})
    assert command_diff(told, out.desired, s.job()) == []


def test_a_rank_left_without_a_path_returns_once_its_primary_does() -> None:
    """Then n1/mlx5_5 comes back and, past its damping, is healthy: rank 13 returns to it
    from its backup, still in the window, and rank 12 (mlx5_4's own GPU) moves onto it."""
    s = _placed_back_with_rank_13_on_a_windowed_backup()
    s.step(1201)
    told = s.desired
    s.faults[3] = down(3, "n1", "mlx5_5", 1000, recovered_at=at(1300))
    assert s.step(1301).decision is None  # damped: still no path
    out = s.step(1300 + 3600)
    assert out.decision is not None and out.decision.action == Action.FAILOVER
    assert out.conn.isolated_ranks == (2, 3)
    assert (out.desired.mode, dict(out.desired.moved)) == (Mode.FAILED_OVER, {12: "mlx5_5/1"})
    intents = command_diff(told, out.desired, s.job())
    assert [(i.kind, i.ranks, i.returning) for i in intents] == [
        (IntentKind.FAILOVER, (12,), ()),
        (IntentKind.FAILBACK, (13,), (13,)),
    ]


def test_a_restart_isolating_ranks_again_is_not_decided_for_what_broke_meanwhile() -> None:
    """n0's mlx5_2 and mlx5_3 fail early (ranks 2 and 3 have no path): restart. While the
    job waits for the fleet manager, mlx5_5 fails on both nodes: known when the next
    incarnation starts, but not what the restart was for. Placed back on n0 and n1, ranks
    2 and 3 are without a path again by what the restart was for, so restarting once more
    cannot help: the job runs on what is left, ranks 5 and 13 on mlx5_4."""
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_2", 1000)
    s.faults[2] = down(2, "n0", "mlx5_3", 1000)
    assert mode_after(s, 1000) == Mode.RESTARTING
    assert s.desired.restarted_for == {"fault:1", "fault:2"}
    s.faults[3] = down(3, "n0", "mlx5_5", 1050)
    s.faults[4] = down(4, "n1", "mlx5_5", 1050)
    assert s.step(1060).decision is None
    s.restart_decided_at = None
    s.checkpoint = CheckpointSeen(9, at(1100), received_at=at(1100))
    out = s.step(1100)
    assert out.decision is not None and out.decision.action == Action.FAILOVER
    assert out.decision.reason.startswith(
        "the restarted job resumes on the faults it was restarted for, 2 rank(s) without a "
        "usable path: it is not restarted again for them"
    )
    assert out.conn.isolated_ranks == (2, 3)
    assert dict(out.desired.moved) == {5: "mlx5_4/1", 13: "mlx5_4/1"}
    assert out.desired.restarted_for == {"fault:1", "fault:2"}
