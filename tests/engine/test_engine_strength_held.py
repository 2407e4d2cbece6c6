"""Who waits on a backup for a fail-back (`reconcile`'s held ranks), told communicator by
communicator: the orders and shapes of communicators the mutation run found untold.

A fail-back is one switch point per communicator, so a member whose primary is back
waits while another member stays on its backup, unless the plan disables channels to
keep that rail out; a held rank makes its other communicators wait in turn.
"""

from __future__ import annotations

from scheduler_svc.engine.intents import IntentKind
from scheduler_svc.engine.state import Action, CommSpec, Mode
from tests.engine.stories import (
    Story,
    at,
    down,
    n0_returns_and_rank_3_waits,
    rails_3_and_6_fail,
)


def test_a_held_rank_makes_a_communicator_listed_before_wait_too() -> None:
    """Rail 3 fails on three nodes; n0 and n1 come back. Rank 11 waits for rank 19 (one-rail
    communicator 6), and so rank 3 waits for rank 11 (communicator 5, listed first)."""
    comms = (CommSpec(5, 4, ranks=(3, 11)), CommSpec(6, 4, ranks=(11, 19)))
    s = Story(["n0", "n1", "n2"], job_kw={"communicators": comms})
    for fid, node in enumerate(("n0", "n1", "n2"), start=1):
        s.faults[fid] = down(fid, node, "mlx5_3", 3000)
    s.step(3000)
    moved = {3: "mlx5_2/1", 11: "mlx5_2/1", 19: "mlx5_2/1"}
    assert dict(s.desired.moved) == moved
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3100))
    s.faults[2] = down(2, "n1", "mlx5_3", 3000, recovered_at=at(3100))
    out = s.step(3220)
    assert out.decision is None and s.intents[-1] == []
    assert dict(s.desired.moved) == moved
    # n2 back too: all three return at one switch point each.
    s.faults[3] = down(3, "n2", "mlx5_3", 3000, recovered_at=at(3300))
    d = s.step(3420).decision
    assert d is not None and d.action == Action.FAILBACK
    assert [r["rank"] for r in d.plan["returning"]] == [3, 11, 19]
    assert (s.mode, dict(s.desired.moved)) == (Mode.NORMAL, {})


def test_a_returning_rank_of_a_communicator_nobody_stays_in_returns() -> None:
    """Rank 3 waits for rank 11 (communicator 5); rank 6, alone of communicator 6 off its
    primary, returns at once."""
    comms = (CommSpec(5, 4, ranks=(3, 11)), CommSpec(6, 4, ranks=(6, 14)))
    s = Story(["n0", "n1"], job_kw={"communicators": comms})
    rails_3_and_6_fail(s)
    assert dict(s.desired.moved) == {3: "mlx5_2/1", 6: "mlx5_7/1", 11: "mlx5_2/1"}
    n0_returns_and_rank_3_waits(s)


def test_a_rank_waits_for_its_one_rail_peer_behind_a_communicator_with_dcr() -> None:
    """As test_failback_decisions' waiting story with the world communicator (DCR: its
    fail-back keeps the failed rail out) listed first: rank 3 still waits for rank 11."""
    comms = (CommSpec(77, 16), CommSpec(5, 4, ranks=(3, 11)))
    s = Story(["n0", "n1"], job_kw={"communicators": comms})
    rails_3_and_6_fail(s)
    assert s.desired.disabled.get(77)
    n0_returns_and_rank_3_waits(s)


def test_a_communicator_of_every_rank_listed_without_its_ranks_returns_whole() -> None:
    """A two-rank job on one rail, its communicator registered without a rank list (every
    rank of the job): rank 0 waits for rank 1, then both return together."""
    s = Story(
        ["n0", "n1"],
        ranks=((0, "n0", 3), (1, "n1", 3)),
        job_kw={"communicators": (CommSpec(5, 4),)},
    )
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.faults[2] = down(2, "n1", "mlx5_3", 3000)
    s.step(3000)
    assert dict(s.desired.moved) == {0: "mlx5_2/1", 1: "mlx5_2/1"}
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3100))
    held = s.step(3220)
    assert held.decision is None and s.intents[-1] == []
    assert dict(s.desired.moved) == {0: "mlx5_2/1", 1: "mlx5_2/1"}
    s.faults[2] = down(2, "n1", "mlx5_3", 3000, recovered_at=at(3300))
    d = s.step(3420).decision
    assert d is not None and d.action == Action.FAILBACK
    assert [(i.kind, i.ranks) for i in s.intents[-1]] == [(IntentKind.FAILBACK, (0, 1))]


def test_a_rank_waits_for_a_peer_still_failed_after_another_communicator_held_one() -> None:
    """Rail 3 fails on three nodes; n0 and n1 come back. Communicator 6 holds rank 11 for
    rank 19; communicator 5, listed after it, still sees rank 19 on its backup and holds
    rank 3 too."""
    comms = (CommSpec(6, 4, ranks=(11, 19)), CommSpec(5, 4, ranks=(3, 19)))
    s = Story(["n0", "n1", "n2"], job_kw={"communicators": comms})
    for fid, node in enumerate(("n0", "n1", "n2"), start=1):
        s.faults[fid] = down(fid, node, "mlx5_3", 3000)
    s.step(3000)
    moved = {3: "mlx5_2/1", 11: "mlx5_2/1", 19: "mlx5_2/1"}
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3100))
    s.faults[2] = down(2, "n1", "mlx5_3", 3000, recovered_at=at(3100))
    out = s.step(3220)
    assert out.decision is None and s.intents[-1] == []
    assert dict(s.desired.moved) == moved
