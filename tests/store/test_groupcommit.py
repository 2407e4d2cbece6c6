"""Group commit (store/groupcommit.py): concurrent short writes share a transaction.

Each test drives real threads against a real store of each backend. A first work
holds its batch open on an event while the others queue behind it (waited on by
the queue's length, not by time), so which works share the second batch is exact.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session, sessionmaker

from railover_testing.waiting import wait_for
from scheduler_svc.store import models as m
from scheduler_svc.store.db import make_engine, make_sessionmaker
from scheduler_svc.store.groupcommit import GroupCommit
from scheduler_svc.store.uow import after_commit, notify_nodes


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def entry(path: str) -> m.AuditEntry:
    return m.AuditEntry(at=datetime.now(UTC), method="POST", path=path, status=202)


def add(path: str) -> Callable[[Session], str]:
    def work(s: Session) -> str:
        s.add(entry(path))
        s.flush()
        return path

    return work


def failing(hooks: list[str]) -> Callable[[Session], str]:
    """A work that writes, asks for a wake-up and an after-commit hook, then raises."""

    def bad(s: Session) -> str:
        notify_nodes(s, {"bad"})
        after_commit(s, lambda: hooks.append("bad"))
        s.add(entry("/bad"))
        s.flush()
        raise LookupError("no such thing")

    return bad


def stored(sessions: sessionmaker[Session]) -> list[str]:
    with sessions() as s:
        return sorted(s.scalars(select(m.AuditEntry.path)))


class Held:
    """A first work that keeps its batch open until released, so others queue behind it."""

    def __init__(self, writes: GroupCommit) -> None:
        self.writes = writes
        self.inside = threading.Event()
        self.release = threading.Event()
        self.results: dict[str, Any] = {}
        self.threads: list[threading.Thread] = []

    def hold(self, s: Session) -> str:
        s.add(entry("/held"))
        self.inside.set()
        assert self.release.wait(30)
        return "/held"

    def start(self, name: str, work: Callable[[Session], Any]) -> None:
        def call() -> None:
            try:
                self.results[name] = self.writes.run(work)
            except Exception as exc:  # the caller's own error, kept for the test to check
                self.results[name] = exc

        t = threading.Thread(target=call)
        t.start()
        self.threads.append(t)

    def queue_behind(self, works: dict[str, Callable[[Session], Any]]) -> None:
        self.start("/held", self.hold)
        assert self.inside.wait(30)
        for i, (name, work) in enumerate(works.items()):
            self.start(name, work)
            wait_for("queued", lambda: self.writes.queued == i + 1, 30)  # noqa: B023
        self.release.set()
        for t in self.threads:
            t.join(30)
            assert not t.is_alive()


def test_a_lone_write_commits_at_once_in_a_batch_of_its_own(
    sessions: sessionmaker[Session],
) -> None:
    writes = GroupCommit(sessions)
    assert writes.run(add("/a")) == "/a"
    assert stored(sessions) == ["/a"]
    assert writes.run(add("/b")) == "/b"
    assert (writes.batches, stored(sessions)) == (2, ["/a", "/b"])


def test_a_lone_work_runs_without_a_savepoint_and_fails_alone(
    sessions: sessionmaker[Session],
) -> None:
    """Alone in its transaction, a work needs no savepoint: what it raises rolls back the
    whole transaction, its after-commit hooks with it, and reaches its caller."""
    woken: list[set[str]] = []
    hooks: list[str] = []
    writes = GroupCommit(sessions, woken.append)
    sent: list[str] = []
    engine = sessions.kw["bind"]

    def statement(*args: Any) -> None:
        sent.append(args[2].split()[0].upper())

    bad = failing(hooks)

    event.listen(engine, "before_cursor_execute", statement)
    try:
        assert writes.run(add("/a")) == "/a"
        with pytest.raises(LookupError, match="no such thing"):
            writes.run(bad)
    finally:
        event.remove(engine, "before_cursor_execute", statement)
    assert "SAVEPOINT" not in sent and "RELEASE" not in sent
    assert sent.count("INSERT") == 2
    assert stored(sessions) == ["/a"]
    assert (woken, hooks) == ([], [])
    assert writes.batches == 2


def test_writes_queued_behind_a_batch_share_the_next_transaction(
    sessions: sessionmaker[Session],
) -> None:
    writes = GroupCommit(sessions)
    held = Held(writes)
    held.queue_behind({f"/q{i}": add(f"/q{i}") for i in range(5)})
    assert writes.batches == 2  # the held one, then the five together
    assert held.results == {"/held": "/held"} | {f"/q{i}": f"/q{i}" for i in range(5)}
    assert stored(sessions) == sorted(["/held"] + [f"/q{i}" for i in range(5)])


def test_a_batch_takes_at_most_max_batch_works(sessions: sessionmaker[Session]) -> None:
    writes = GroupCommit(sessions, max_batch=2)
    held = Held(writes)
    held.queue_behind({f"/q{i}": add(f"/q{i}") for i in range(5)})
    assert writes.batches == 4  # the held one, then 2 + 2 + 1
    assert len(stored(sessions)) == 6


def test_max_batch_must_be_positive(sessions: sessionmaker[Session]) -> None:
    with pytest.raises(ValueError, match="max_batch: 0, at least 1"):
        GroupCommit(sessions, max_batch=0)
    writes = GroupCommit(sessions, max_batch=1)  # one is allowed: no work shares a batch
    held = Held(writes)
    held.queue_behind({f"/q{i}": add(f"/q{i}") for i in range(3)})
    assert writes.batches == 4


def test_a_failing_work_is_rolled_back_alone_and_its_caller_gets_its_error(
    sessions: sessionmaker[Session],
) -> None:
    woken: list[set[str]] = []
    hooks: list[str] = []
    writes = GroupCommit(sessions, woken.append)

    def good(name: str) -> Callable[[Session], str]:
        def work(s: Session) -> str:
            notify_nodes(s, {name})
            after_commit(s, lambda: hooks.append(name))
            return add(f"/{name}")(s)

        return work

    bad = failing(hooks)

    held = Held(writes)
    held.queue_behind({"a": good("a"), "bad": bad, "b": good("b")})
    assert isinstance(held.results["bad"], LookupError)
    assert (held.results["a"], held.results["b"]) == ("/a", "/b")
    assert stored(sessions) == ["/a", "/b", "/held"]
    # What the failed work queued for after the commit went with its savepoint.
    assert woken == [{"a", "b"}]
    assert hooks == ["a", "b"]


def test_a_failed_commit_fails_every_caller_and_stores_nothing(
    sessions: sessionmaker[Session],
) -> None:
    writes = GroupCommit(sessions)
    refuse = threading.Event()

    @event.listens_for(sessions, "before_commit")
    def _fail(s: Session) -> None:
        # The event comes for each work's savepoint too: fail only the batch's own commit.
        if refuse.is_set() and not s.in_nested_transaction():
            raise RuntimeError("the store went away")

    held = Held(writes)
    held.start("/held", held.hold)
    assert held.inside.wait(30)
    held.start("/a", add("/a"))
    held.start("/b", add("/b"))
    wait_for("queued", lambda: writes.queued == 2, 30)
    refuse.set()
    held.release.set()
    for t in held.threads:
        t.join(30)
    assert {k: str(v) for k, v in held.results.items()} == {
        "/held": "the store went away",
        "/a": "the store went away",
        "/b": "the store went away",
    }
    refuse.clear()
    assert stored(sessions) == []
    # The queue is free again: the next write commits.
    assert writes.run(add("/c")) == "/c"
    assert stored(sessions) == ["/c"]


def test_a_work_sees_the_writes_of_the_works_before_it_in_its_batch(
    sessions: sessionmaker[Session],
) -> None:
    """Two reports of one event in one batch: the second finds the first's row."""
    writes = GroupCommit(sessions)

    def count(s: Session) -> int:
        return int(s.scalar(select(func.count()).select_from(m.AuditEntry)) or 0)

    held = Held(writes)
    held.queue_behind({"/a": add("/a"), "count": count})
    assert held.results["count"] == 2  # the held one and /a, both uncommitted then
