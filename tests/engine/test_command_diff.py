"""command_diff: the exact commands that turn what ranks were told into the desired state."""

from __future__ import annotations

from scheduler_svc.engine import jobindex
from scheduler_svc.engine.intents import Intent, IntentKind, command_diff
from scheduler_svc.engine.routes import JobIndex
from scheduler_svc.engine.state import CommSpec, Desired, JobState, Mode, comms_of
from tests.engine.jobs import a_job

ALL = (0, 1, 2, 3)


def job(*comms: CommSpec) -> JobState:
    return a_job(((3, "b", 1), (0, "a", 0), (1, "a", 1), (2, "b", 0)), communicators=comms)


TWO = job(CommSpec(5, 4, ranks=(1, 0)), CommSpec(6, 4))
FAILED_OVER = Mode.FAILED_OVER


def test_restarting_aborts_every_communicator_once() -> None:
    restart = Desired(mode=Mode.RESTARTING)
    assert command_diff(Desired(), restart, TWO) == [
        Intent(IntentKind.ABORT, 5, (1, 0)),
        Intent(IntentKind.ABORT, 6, (3, 0, 1, 2)),
    ]
    assert command_diff(restart, restart, TWO) == []
    assert command_diff(Desired(), restart, job()) == [Intent(IntentKind.ABORT, 0, (3, 0, 1, 2))]


def test_nothing_changed_sends_nothing() -> None:
    d = Desired(
        mode=FAILED_OVER,
        moved={1: "x/1"},
        disabled={6: (1,)},
        weights={5: (0.5, 0.5)},
        split={5: 0.25},
        transit={6: {2: 0}},
        checkpoint_after=9,
    )
    assert command_diff(d, d, TWO) == []


def test_new_moves_plan_changes_transit_and_a_checkpoint_request() -> None:
    commanded = Desired(mode=FAILED_OVER, moved={0: "m/1"}, transit={6: {2: 1}})
    desired = Desired(
        mode=FAILED_OVER,
        moved={0: "m/1", 1: "m/2", 3: "m/3"},
        disabled={6: (1, 3)},
        weights={5: (0.75, 0.25)},
        split={5: 0.125},
        transit={6: {2: 1, 3: 0}, 5: {3: 1}},
        checkpoint_after=42,
    )
    assert command_diff(commanded, desired, TWO) == [
        Intent(IntentKind.FAILOVER, 5, (1,)),
        Intent(IntentKind.BALANCE, 5, (0, 1), (), weights=(0.75, 0.25), split_ratio=0.125),
        Intent(IntentKind.FAILOVER, 6, (1, 3)),
        Intent(IntentKind.REBALANCE, 6, (0, 1, 2, 3), (1, 3)),
        Intent(IntentKind.NVL_TRANSIT, 6, (3,), transit=((3, 0),)),
        Intent(IntentKind.CHECKPOINT_NOW, 0, ALL, iteration=42),
    ]


def test_a_moved_rank_given_another_backup_is_told_again() -> None:
    commanded = Desired(mode=FAILED_OVER, moved={1: "m/1"})
    desired = Desired(mode=FAILED_OVER, moved={1: "m/2"})
    assert command_diff(commanded, desired, TWO) == [
        Intent(IntentKind.FAILOVER, 5, (1,)),
        Intent(IntentKind.FAILOVER, 6, (1,)),
    ]


def test_a_split_or_weights_change_alone_rebalances() -> None:
    commanded = Desired(mode=FAILED_OVER, weights={5: (0.5, 0.5)}, split={5: 0.25})
    split = Desired(mode=FAILED_OVER, weights={5: (0.5, 0.5)}, split={5: 0.125})
    assert command_diff(commanded, split, TWO) == [
        Intent(IntentKind.BALANCE, 5, (0, 1), (), weights=(0.5, 0.5), split_ratio=0.125)
    ]
    weights = Desired(mode=FAILED_OVER, weights={5: (0.25, 0.75)}, split={5: 0.25})
    assert command_diff(commanded, weights, TWO) == [
        Intent(IntentKind.BALANCE, 5, (0, 1), (), weights=(0.25, 0.75), split_ratio=0.25)
    ]
    # Balance dropped for plain DCR: a rebalance with the channels that stay off.
    dcr = Desired(mode=FAILED_OVER, disabled={5: (2,)})
    assert command_diff(commanded, dcr, TWO) == [Intent(IntentKind.REBALANCE, 5, (0, 1), (2,))]


def test_returning_ranks_fail_back_with_the_channels_still_off() -> None:
    commanded = Desired(mode=FAILED_OVER, moved={0: "m/1", 2: "m/2"}, disabled={6: (1, 3)})
    desired = Desired(mode=FAILED_OVER, moved={2: "m/2"}, disabled={6: (3,)})
    assert command_diff(commanded, desired, TWO) == [
        Intent(IntentKind.FAILBACK, 5, (0, 1), (), returning=(0,)),
        Intent(IntentKind.FAILBACK, 6, (0, 1, 2, 3), (3,), returning=(0,)),
    ]  # each switch point tells all its members; it returns rank 0 alone


def test_a_job_without_communicators_gets_moves_and_failback_only() -> None:
    bare = job()
    commanded = Desired(mode=FAILED_OVER, moved={0: "m/1"})
    desired = Desired(mode=FAILED_OVER, moved={1: "m/1"}, disabled={0: (1,)}, weights={0: (1.0,)})
    # Only the rank that returns is told to (issue 28, case 3): rank 1's primary is down.
    assert command_diff(commanded, desired, bare) == [
        Intent(IntentKind.FAILOVER, 0, (1,)),
        Intent(IntentKind.FAILBACK, 0, (0,), (1,), returning=(0,)),
    ]
    # A plan change alone has no switch point to go with.
    plan_only = Desired(mode=FAILED_OVER, disabled={0: (1,)})
    assert command_diff(Desired(mode=FAILED_OVER), plan_only, bare) == []


def test_a_checkpoint_request_goes_once_and_not_when_withdrawn() -> None:
    asked = Desired(checkpoint_after=7)
    assert command_diff(Desired(), asked, TWO) == [
        Intent(IntentKind.CHECKPOINT_NOW, 0, ALL, iteration=7)
    ]
    assert command_diff(asked, Desired(checkpoint_after=8), TWO) == [
        Intent(IntentKind.CHECKPOINT_NOW, 0, ALL, iteration=8)
    ]
    assert command_diff(asked, Desired(), TWO) == []
    assert command_diff(Desired(), Desired(checkpoint_after=0), TWO) == [
        Intent(IntentKind.CHECKPOINT_NOW, 0, ALL, iteration=0)
    ]


def test_a_registered_communicator_numbered_0_gets_switch_points() -> None:
    zero = job(CommSpec(0, 4))
    desired = Desired(mode=FAILED_OVER, disabled={0: (1,)})
    assert command_diff(Desired(mode=FAILED_OVER), desired, zero) == [
        Intent(IntentKind.REBALANCE, 0, (0, 1, 2, 3), (1,))
    ]


def indexed(job: JobState) -> JobIndex:
    """The job's index (its nodes' plans do not matter to the commands: none are known)."""
    return jobindex.build(job.ranks, {}, {}, comms_of(job))


def test_the_jobs_index_gives_the_same_commands_and_another_jobs_index_is_ignored() -> None:
    """With the index built for the job the commands are the same, to the same ranks in
    the same order; an index built for other communicators or another placement is not
    read (the members come from the job itself)."""
    moved = Desired(mode=FAILED_OVER, moved={0: "m/1", 2: "m/2"}, disabled={6: (1, 3)})
    cases = [
        (Desired(), Desired(mode=Mode.RESTARTING), TWO),
        (
            Desired(mode=FAILED_OVER, moved={0: "m/1"}, transit={6: {2: 1}}),
            Desired(
                mode=FAILED_OVER,
                moved={0: "m/1", 1: "m/2", 3: "m/3"},
                disabled={6: (1, 3)},
                weights={5: (0.75, 0.25)},
                split={5: 0.125},
                transit={6: {2: 1, 3: 0}},
                checkpoint_after=42,
            ),
            TWO,
        ),
        (moved, Desired(mode=FAILED_OVER, moved={2: "m/2"}, disabled={6: (3,)}), TWO),
        (Desired(mode=FAILED_OVER), Desired(mode=FAILED_OVER, disabled={5: (2,), 6: (1,)}), TWO),
        (moved, Desired(mode=FAILED_OVER, moved={2: "m/2"}, checkpoint_after=3), job()),
    ]
    other_comms = job(CommSpec(6, 4), CommSpec(5, 4, ranks=(1, 0)))
    other_ranks = a_job(((0, "a", 0), (1, "a", 1), (2, "b", 0), (3, "b", 1)),
                        communicators=TWO.communicators)  # fmt: skip
    for commanded, desired, state in cases:
        expected = command_diff(commanded, desired, state)
        assert expected
        assert command_diff(commanded, desired, state, indexed(state)) == expected
        for other in (job(), other_comms, other_ranks, job(CommSpec(5, 4))):
            if other.communicators != state.communicators or other.ranks != state.ranks:
                assert command_diff(commanded, desired, state, indexed(other)) == expected
    # The expected answers themselves, for the two kinds of switch point with an index.
    assert command_diff(cases[3][0], cases[3][1], TWO, indexed(TWO)) == [
        Intent(IntentKind.REBALANCE, 5, (0, 1), (2,)),
        Intent(IntentKind.REBALANCE, 6, (0, 1, 2, 3), (1,)),
    ]
    assert command_diff(cases[4][0], cases[4][1], job(), indexed(other_comms)) == [
        Intent(IntentKind.FAILBACK, 0, (0,), (), returning=(0,)),
        Intent(IntentKind.CHECKPOINT_NOW, 0, ALL, iteration=3),
    ]
