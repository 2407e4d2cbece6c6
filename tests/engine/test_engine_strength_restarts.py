"""What a restart was for, and what a refusal leaves told: the mutation run's untold cases.

`isolated_by` answers whether the evidence a restart was decided for alone took a rank's
node, GPU or both RNICs (table-driven, on evidence made up for each row); a job placed
back on that evidence says so in a decision whose record is whole; and `transit_refused`
and `failback_refused` trim what was told of one communicator only.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler_svc.engine.evidence import isolated_by
from scheduler_svc.engine.fabric import FaultKind, Unhealthy
from scheduler_svc.engine.intents import failback_refused, transit_refused
from scheduler_svc.engine.job_routes import backups_of, index_for, routes_of
from scheduler_svc.engine.records import inputs_now
from scheduler_svc.engine.state import Action, CheckpointSeen, Desired, Mode
from tests.engine.stories import Story, at, down

# --- isolated_by: whose evidence left a rank without a path ------------------------------------


def _u(key: str, kind: str, **where: object) -> Unhealthy:
    return Unhealthy(key, key, kind, at(1000), "made up", **where)  # type: ignore[arg-type]  # str | int | None


def _port(key: str, node: str, device: str) -> Unhealthy:
    return _u(key, FaultKind.LINK_DOWN.value, node=node, device=device, port=1)


# n0's mlx5_2 and mlx5_3 fail: ranks 2 and 3 (each with one as primary, the other as
# backup) have no path left.
ROWS: list[tuple[str, list[Unhealthy], bool]] = [
    ("both RNICs", [_port("a", "n0", "mlx5_2"), _port("b", "n0", "mlx5_3")], True),
    ("one RNIC", [_port("a", "n0", "mlx5_2")], False),
    ("the node", [_u("n", FaultKind.UNREACHABLE.value, node="n0")], True),
    ("another node", [_u("n", FaultKind.UNREACHABLE.value, node="n1")], False),
    ("its GPU", [_u("g", FaultKind.GPU_LOST.value, node="n0", port=3)], True),
    ("another GPU", [_u("g", FaultKind.GPU_LOST.value, node="n0", port=5)], False),
    ("its GPU's index elsewhere", [_u("g", FaultKind.GPU_LOST.value, node="n1", port=3)], False),
    ("a link fault on port 3", [_u("p", FaultKind.LINK_DOWN.value, node="n0", port=3)], False),
    (
        "its rail's switch and the other RNIC",
        [_u("s", "switch", switch="rail3-leaf"), _port("a", "n0", "mlx5_2")],
        True,
    ),
    (
        "another rail's switch and one RNIC",
        [_u("s", "switch", switch="rail5-leaf"), _port("a", "n0", "mlx5_2")],
        False,
    ),
]


@pytest.mark.parametrize(("evidence", "lost"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_isolated_by_names_what_took_a_rank_s_paths(evidence: list[Unhealthy], lost: bool) -> None:
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_2", 1000)
    s.faults[2] = down(2, "n0", "mlx5_3", 1000)
    fabric = s.fabric(at(1000))
    conn = routes_of(s.job(), fabric)
    assert conn.isolated_ranks == (2, 3)
    keys = {u.key for u in evidence}
    assert isolated_by(fabric, conn, evidence, keys) is lost
    assert not isolated_by(fabric, conn, evidence, set())  # not what the restart was for
    # A node the fabric does not show: nothing known took it.
    unknown = replace(fabric, topologies={"n1": fabric.topologies["n1"]})
    assert not isolated_by(unknown, conn, evidence, keys)


@pytest.mark.parametrize("indexed", [False, True], ids=["routes", "index"])
def test_backups_of_answers_the_ranks_asked_for_alone(indexed: bool) -> None:
    """The RNIC each rank asked for falls back to (the service reads it for ranks that left
    their primary), with or without the job's index; ranks the job lacks are left out."""
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 1000)
    fabric = s.fabric(at(1000))
    index = index_for(s.job(), fabric) if indexed else None
    conn = routes_of(s.job(), fabric, index)
    assert backups_of(conn, [3, 11, 99]) == {3: "mlx5_2/1", 11: "mlx5_2/1"}
    assert backups_of(conn, (12,)) == {12: "mlx5_5/1"}
    assert backups_of(conn, []) == {}


# --- placed back on what it was restarted for ----------------------------------------------------


def test_placed_back_without_a_path_its_none_decision_keeps_a_whole_record() -> None:
    """As test_restart_decisions' story (ranks 2 and 3 without any path, placed back),
    on leaf switches (whose plans warn), the job declaring no k: the decision's record
    has the inputs, plan and warnings of a decision the cost model did not make."""
    s = Story(["n0", "n1"], shape={"switch_name": "leaf"})
    s.faults[1] = down(1, "n0", "mlx5_3", 1000)
    s.faults[2] = down(2, "n0", "mlx5_2", 1000)
    s.step(1500)
    assert s.mode == Mode.RESTARTING and s.desired.k is not None
    k = s.desired.k
    s.restart_decided_at = None  # the next incarnation started
    s.job_kw = {"slowdown_k": None}
    s.checkpoint = CheckpointSeen(9, at(1600), received_at=at(1600))
    out = s.step(1700)
    d = out.decision
    assert d is not None and d.action == Action.NONE
    warned = s.fabric(at(1700)).plans["n0"].warnings + s.fabric(at(1700)).plans["n1"].warnings
    assert warned and out.warnings == warned
    assert d.plan == {"failed_over": [], "warnings": list(warned)}
    assert (d.costs_s, d.costs_gpu_s, d.saved_gpu_s, d.fault_key) == ({}, {}, 0.0, None)
    assert d.inputs == inputs_now(at(1700), s.job(), s.options, k)
    assert (d.inputs["k"], d.inputs["k_source"]) == (k, "measured")
    assert out.desired.mode == Mode.NORMAL and dict(out.desired.moved) == {}
    # Said once: the same evidence on the next pass keeps the warnings and says nothing.
    again = s.step(1800)
    assert (again.decision, again.warnings) == (None, warned)


# --- what was told, less a refusal ------------------------------------------------------------


def test_transit_refused_trims_the_refusing_ranks_of_that_communicator_only() -> None:
    told = Desired(transit={78: {2: 0, 10: 8}, 79: {3: 1}}, moved={2: "mlx5_0/1"})
    assert transit_refused(told, 78, (2,)) == replace(told, transit={78: {10: 8}, 79: {3: 1}})
    assert transit_refused(told, 78, [2, 10]) == replace(told, transit={79: {3: 1}})
    assert transit_refused(told, 80, (2,)) == told  # nothing of it was told


def test_failback_refused_restores_the_held_plan_of_that_communicator_only() -> None:
    commanded = Desired(
        mode=Mode.NORMAL,
        moved={5: "mlx5_4/1"},
        disabled={78: (1,)},
        mitigation={78: "dcr", 80: "s-bond"},
        weights={78: (0.5, 0.5)},
        split={78: 0.25},
        transit={78: {2: 0}, 80: {4: 6}},
    )
    held = Desired(
        mode=Mode.FAILED_OVER,
        moved={3: "mlx5_2/1", 5: "mlx5_4/1", 11: "mlx5_2/1"},
        disabled={77: (3, 11)},
        mitigation={77: "nvl", 78: "balance"},
        weights={77: (0.25, 0.75)},
        split={77: 0.5},
        transit={77: {3: 1}, 78: {9: 9}},
    )
    out = failback_refused(commanded, held, 77, (3,))
    assert out == replace(
        commanded,
        mode=Mode.FAILED_OVER,
        moved={5: "mlx5_4/1", 3: "mlx5_2/1"},
        disabled={78: (1,), 77: (3, 11)},
        mitigation={78: "dcr", 80: "s-bond", 77: "nvl"},
        weights={78: (0.5, 0.5), 77: (0.25, 0.75)},
        split={78: 0.25, 77: 0.5},
        transit={78: {2: 0}, 80: {4: 6}, 77: {3: 1}},
    )
    # A communicator the held state plans nothing for loses what it was told.
    gone = failback_refused(commanded, Desired(mode=Mode.FAILED_OVER), 78, ())
    assert (dict(gone.mitigation), dict(gone.transit)) == ({80: "s-bond"}, {80: {4: 6}})
    assert (dict(gone.disabled), dict(gone.weights), dict(gone.split)) == ({}, {}, {})


def test_placed_back_on_broken_pairs_it_fails_over_and_says_which_kind_of_loss() -> None:
    """n0/mlx5_3 and n1/mlx5_2 fail: nobody is without a path, but rank 3 has only its
    backup (rail 2's RNIC) and rank 11 only its primary, so the pair has none between them
    (and ranks 2 and 10 alike). Restarted, then placed back on both faults: it fails over."""
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 1000)
    s.faults[2] = down(2, "n1", "mlx5_2", 1000)
    first = s.step(1000)
    assert first.decision is not None and first.decision.action == Action.RESTART
    assert (first.conn.isolated_ranks, first.conn.broken_pairs) == ((), 2)
    s.restart_decided_at = None  # the next incarnation started
    s.checkpoint = CheckpointSeen(9, at(1100), received_at=at(1100))
    out = s.step(1100)
    d = out.decision
    assert d is not None and d.action == Action.FAILOVER
    assert d.reason == (
        "the restarted job resumes on the faults it was restarted for, rank pairs without a "
        "usable path between them: it is not restarted again for them (place it without "
        "the faulty node)"
    )
    assert out.desired.mode == Mode.FAILED_OVER
    assert dict(out.desired.moved) == {3: "mlx5_2/1", 10: "mlx5_3/1"}


def test_a_new_life_on_a_fault_from_while_it_restarted_does_not_claim_it_was_restarted_for_it() -> (
    None
):
    """Restarted for n0/mlx5_3, which clears before the job is back; n1/mlx5_5 failed while
    it restarted (known, not news). The new life starts on rank 13's backup, and its note
    does not say it was restarted for that fault."""
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 1000)
    assert s.step(1000).desired.mode == Mode.RESTARTING
    s.faults[2] = down(2, "n1", "mlx5_5", 1010)
    assert s.step(1020).decision is None
    s.faults[1] = down(1, "n0", "mlx5_3", 1000, recovered_at=at(1030))
    s.restart_decided_at = None  # the next incarnation started
    s.checkpoint = CheckpointSeen(9, at(1400), received_at=at(1400))
    out = s.step(1500)
    d = out.decision
    assert d is not None and d.action == Action.FAILOVER
    assert d.reason == "the restarted job starts on its backups: faults still open"
    assert dict(out.desired.moved) == {13: "mlx5_4/1"}
    assert out.desired.evidence == frozenset({"fault:2"})


def test_a_new_life_after_a_restart_for_no_evidence_has_no_verdict() -> None:
    """GPU 7 of n0 is gone with no fault reported (the node's plan keeps it as a ghost):
    rank 7 has no path and the job restarts for no evidence. Placed back on a whole n0, its
    new life runs normally, with nothing decided to keep."""
    s = Story(["n0", "n1"], lost_gpus={"n0": 7})
    first = s.step(1000)
    assert first.decision is not None and first.decision.action == Action.RESTART
    assert first.desired.restarted_for == frozenset()
    s.lost_gpus = {}
    s.restart_decided_at = None  # the next incarnation started
    s.checkpoint = CheckpointSeen(9, at(1100), received_at=at(1100))
    out = s.step(1100)
    assert out.decision is None
    assert (out.desired.mode, out.desired.verdict, out.desired.checkpoint_id) == (
        Mode.NORMAL,
        None,
        9,
    )
