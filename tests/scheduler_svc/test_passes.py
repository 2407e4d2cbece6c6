"""services.passes: the reports of a storm share their job's reconcile passes.

The pass itself is replaced by one that blocks until the test lets it go, so the
order is set by the test, not by timing: which callers arrive while a pass runs,
and how many passes their answers took.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial

import pytest

from railover_testing.waiting import wait_for
from scheduler_svc.config import Settings
from scheduler_svc.services.passes import Decided, ReconcilePasses


class Gated(ReconcilePasses):
    """Passes that record themselves and wait for `release` before they end."""

    def __init__(self) -> None:
        super().__init__(None, Settings(), lambda: datetime(2026, 1, 1, tzinfo=UTC))  # type: ignore[arg-type]
        self.started: list[str] = []
        self.release = threading.Semaphore(0)
        self.fail_next = False

    def _run(self, job_id: str) -> list[Decided]:
        n = len(self.started) + 1
        self.started.append(job_id)
        self.release.acquire()
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("store went away")
        return [Decided(f"{job_id}-pass{n}", "failover")]


def ids(decided: list[Decided]) -> list[str]:
    return [d.decision_id for d in decided]


class Caller(threading.Thread):
    def __init__(self, passes: ReconcilePasses, jobs: list[str]) -> None:
        super().__init__(daemon=True)
        self.passes, self.jobs = passes, jobs
        self.got: list[str] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.got = ids(self.passes.reconcile(self.jobs))
        except BaseException as e:  # handed to the test
            self.error = e


@pytest.fixture
def passes() -> Iterator[Gated]:
    g = Gated()
    yield g
    for _ in range(100):  # never leave a caller blocked
        g.release.release()


def start(passes: Gated, jobs: list[str]) -> Caller:
    c = Caller(passes, jobs)
    c.start()
    return c


def finish(*callers: Caller) -> None:
    for c in callers:
        c.join(10)
        assert not c.is_alive(), "a caller is still waiting"


def test_reports_during_a_pass_share_the_next_one(passes: Gated) -> None:
    first = start(passes, ["j"])
    wait_for("the first pass", lambda: passes.started == ["j"], 10)
    # Three reports commit while pass 1 runs: it may have read the store before them.
    late = [start(passes, ["j"]) for _ in range(3)]
    wait_for("all four waiting", lambda: passes.waiting("j") == 4, 10)
    assert passes.started == ["j"]  # nobody starts a second pass while one runs
    passes.release.release()
    finish(first)
    assert first.got == ["j-pass1"]
    # One of the three runs pass 2 for all of them.
    wait_for("the second pass", lambda: len(passes.started) == 2, 10)
    passes.release.release()
    finish(*late)
    assert [c.got for c in late] == [["j-pass2"]] * 3
    assert passes.started == ["j", "j"]
    assert passes.waiting("j") == 0


def test_a_report_after_the_passes_ended_gets_a_pass_of_its_own(passes: Gated) -> None:
    passes.release.release()
    assert ids(passes.reconcile(["j"])) == ["j-pass1"]
    passes.release.release()
    assert ids(passes.reconcile(["j"])) == ["j-pass2"]
    assert passes.started == ["j", "j"]


def test_jobs_are_passed_one_at_a_time_in_sorted_order(passes: Gated) -> None:
    for _ in range(3):
        passes.release.release()
    assert ids(passes.reconcile(["b", "a", "b"])) == ["a-pass1", "b-pass2"]
    assert passes.started == ["a", "b"]


def test_other_jobs_do_not_wait_for_a_jobs_pass(passes: Gated) -> None:
    slow = start(passes, ["j"])
    wait_for("j's pass", lambda: passes.started == ["j"], 10)
    other = start(passes, ["k"])
    wait_for("k's pass, beside j's", lambda: passes.started == ["j", "k"], 10)
    passes.release.release()
    passes.release.release()
    finish(slow, other)
    assert sorted([*(slow.got or []), *(other.got or [])]) == ["j-pass1", "k-pass2"]


def test_a_failed_pass_fails_its_runner_and_the_next_caller_passes_again(passes: Gated) -> None:
    passes.fail_next = True
    runner = start(passes, ["j"])
    wait_for("the pass", lambda: passes.started == ["j"], 10)
    waiter = start(passes, ["j"])
    wait_for("both waiting", lambda: passes.waiting("j") == 2, 10)
    passes.release.release()
    finish(runner)
    assert isinstance(runner.error, RuntimeError)
    # The waiter needed a pass that started after its commit: it runs one itself.
    wait_for("the waiter's own pass", lambda: len(passes.started) == 2, 10)
    passes.release.release()
    finish(waiter)
    assert waiter.error is None and waiter.got == ["j-pass2"]


def test_an_unbroken_storm_keeps_only_the_passes_still_awaited(passes: Gated) -> None:
    # Someone is always waiting, so the job is never forgotten; each pass's ids must
    # still go once the callers it answered have them, or a long storm grows without end.
    running = start(passes, ["j"])
    wait_for("pass 1", lambda: passes.started == ["j"], 10)
    for n in range(2, 8):
        nxt = start(passes, ["j"])
        wait_for(f"a caller for pass {n}", lambda: passes.waiting("j") == 2, 10)
        passes.release.release()
        finish(running)
        assert running.got == [f"j-pass{n - 1}"]
        wait_for(f"pass {n}", partial(lambda n: len(passes.started) == n, n), 10)
        assert passes.held("j") == 0  # pass n-1's only reader has its ids; n is running
        running = nxt
    passes.release.release()
    finish(running)
    assert running.got == ["j-pass7"]
    assert passes.held("j") == 0 and passes.waiting("j") == 0
