"""What replaces a fail-back a failover overtook (`reconciler.replacing_overtaken`), and
that a pass with none to replace reads none of the job's ranks: on a 65,536-rank job,
listing them on every pass was 6 % of a fault report's handler on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

from scheduler_svc.engine.intents import Intent, IntentKind
from scheduler_svc.engine.state import CommSpec, Desired, JobState, Mode
from scheduler_svc.services.commands import Overtaken
from scheduler_svc.services.reconciler import replacing_overtaken

T0 = datetime(2026, 12, 1, tzinfo=UTC)


class CountedRanks(tuple[tuple[int, str, int], ...]):
    """A job's placement that counts how often it is walked."""

    walks = 0

    def __iter__(self) -> Iterator[tuple[int, str, int]]:
        CountedRanks.walks += 1
        return super().__iter__()


def job(communicators: tuple[CommSpec, ...] = ()) -> JobState:
    ranks = CountedRanks((r, f"n{r // 8}", r % 8) for r in (5, 3, 1, 0, 2, 4, 6, 7))
    return JobState("j", Mode.NORMAL, ranks, 3600.0, 600.0, 0.0, 30.0, T0, communicators)


def test_no_overtaken_fail_back_reads_no_rank() -> None:
    state = job((CommSpec(7, 8),))
    CountedRanks.walks = 0
    assert replacing_overtaken([], [], Desired(), state) == []
    assert CountedRanks.walks == 0


def test_a_communicator_naming_no_ranks_is_rebalanced_on_every_rank_in_order() -> None:
    state = job((CommSpec(7, 8), CommSpec(9, 8, (2, 3))))
    desired = Desired(disabled={7: (1, 5)})
    overtaken = [Overtaken(7, 4, (0, 1), (1,)), Overtaken(9, 2, (2, 3), (3,))]
    assert replacing_overtaken(overtaken, [], desired, state) == [
        Intent(IntentKind.REBALANCE, 7, tuple(range(8)), (1, 5)),
        Intent(IntentKind.REBALANCE, 9, (2, 3), ()),
    ]


def test_without_communicators_the_ranks_kept_on_backup_are_told_again() -> None:
    state = job()
    desired = Desired(moved={1: "mlx5_1/1", 2: "mlx5_2/1", 3: "mlx5_3/1"})
    sent = Intent(IntentKind.FAILOVER, 0, (3,))
    overtaken = [Overtaken(0, 4, (0, 1, 2, 3), (0, 1, 2, 3))]
    told = replacing_overtaken(overtaken, [sent], desired, state)
    assert told == [Intent(IntentKind.FAILOVER, 0, (1, 2))]
