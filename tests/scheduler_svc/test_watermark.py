"""SQLite's command watermark (delivery.CommandWatermark): commands written by anyone wake
their nodes' polls, so renewals may skip their looks on SQLite as on PostgreSQL.

The unit tests step the watermark's reads by hand against a real SQLite store and
record what it tells the notifier. The service test runs the real app over HTTP:
its renewals skip their looks, and a command that a writer outside the service puts
in the database file ends a 120 s poll long before its deadline.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from railover_testing.waiting import wait_until
from scheduler_svc.config import Settings
from scheduler_svc.main import create_app
from scheduler_svc.services import delivery
from scheduler_svc.services.delivery import CommandNotifier, CommandWatermark
from scheduler_svc.store import models as m
from scheduler_svc.store.db import make_engine, make_read_sessionmaker, make_sessionmaker
from tests.scheduler_svc.helpers import job_body, register_nodes
from tests.scheduler_svc.test_delivery import serve
from tests.scheduler_svc.test_listen import NO_RECHECK_S, WOKEN_WITHIN_S, looks  # noqa: F401
from tests.store.test_idempotency import job

NOW = datetime(2026, 12, 1, tzinfo=UTC)


class Recording(CommandNotifier):
    """What the watermark tells its notifier, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.told: list[Any] = []
        self.changed = threading.Condition()

    def _tell(self, what: Any) -> None:
        with self.changed:
            self.told.append(what)
            self.changed.notify_all()

    def listening_threadsafe(self, listening: bool) -> None:
        self._tell(("listening", listening))

    def notify_all_threadsafe(self) -> None:
        self._tell("all")

    def notify_threadsafe(self, nodes: Iterable[str]) -> None:
        self._tell(sorted(nodes))


@pytest.fixture
def store(tmp_path: Path, sqlite_migrated: Path) -> str:
    path = tmp_path / "railover.db"
    shutil.copyfile(sqlite_migrated, path)
    return f"sqlite:///{path}"


@pytest.fixture
def sessions(store: str) -> Iterator[tuple[sessionmaker[Session], sessionmaker[Session]]]:
    engine = make_engine(store)
    writes = make_sessionmaker(engine)
    with writes.begin() as s:
        s.add(job("j1"))
    yield writes, make_read_sessionmaker(engine)
    engine.dispose()


def unreadable() -> Session:
    """A store that cannot be read, in place of the watermark's sessionmaker."""
    raise OSError("disk gone")


def command_for(writes: sessionmaker[Session], *nodes: str) -> None:
    """Commands put in the store as any writer would, without telling any notifier."""
    with writes.begin() as s:
        s.add_all(m.Command(node=n, job_id="j1", kind="failover", created_at=NOW) for n in nodes)


def test_each_read_wakes_the_nodes_of_the_commands_since_the_last(
    sessions: tuple[sessionmaker[Session], sessionmaker[Session]],
) -> None:
    writes, reads = sessions
    command_for(writes, "old")  # before the first read: no wake-up of its own
    told = Recording()
    mark = CommandWatermark(reads, told, interval_s=3600)
    mark._read()
    assert told.told == [("listening", True), "all"]
    command_for(writes, "n1", "n2", "n1")
    mark._read()
    assert told.told[2:] == [["n1", "n2"]]  # each node once, the older command's not again
    mark._read()
    command_for(writes, "n3")
    mark._read()
    assert told.told[2:] == [["n1", "n2"], ["n3"]]
    assert mark.reads == 4


def test_a_failed_read_stops_the_skipping_and_the_next_reads_from_scratch(
    sessions: tuple[sessionmaker[Session], sessionmaker[Session]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    writes, reads = sessions
    told = Recording()
    mark = CommandWatermark(reads, told, interval_s=3600)
    mark._read()
    monkeypatch.setattr(mark, "_reads", unreadable)
    mark._read()
    mark._read()
    assert told.told == [("listening", True), "all", ("listening", False), ("listening", False)]
    failures = [r for r in caplog.records if "reading the store failed" in r.getMessage()]
    assert len(failures) == 1  # once per run of failures
    command_for(writes, "during")  # while nobody watched: the wake-up of all covers it
    monkeypatch.setattr(mark, "_reads", reads)
    mark._read()
    assert told.told[4:] == [("listening", True), "all"]
    command_for(writes, "after")
    mark._read()
    assert told.told[6:] == [["after"]]
    monkeypatch.setattr(mark, "_reads", unreadable)
    mark._read()
    assert len([r for r in caplog.records if "reading the store failed" in r.getMessage()]) == 2


def test_started_it_reads_at_once_then_on_its_interval_until_stopped(
    sessions: tuple[sessionmaker[Session], sessionmaker[Session]],
) -> None:
    writes, reads = sessions
    told = Recording()
    mark = CommandWatermark(reads, told, interval_s=0.05)
    mark.start()
    try:
        # The first read is done when start returns, before the service serves.
        assert told.told[:2] == [("listening", True), "all"]
        command_for(writes, "n7")
        with told.changed:
            assert told.changed.wait_for(lambda: ["n7"] in told.told, timeout=WOKEN_WITHIN_S)
    finally:
        mark.stop()
    assert mark._thread is not None and not mark._thread.is_alive()
    assert told.told[-1] == ("listening", False)


def test_on_sqlite_renewals_skip_their_looks_and_an_outside_writer_still_wakes_the_poll(
    store: str,
    looks: list[str],  # noqa: F811
) -> None:
    app = create_app(
        Settings(
            db_url=store, port=0, allow_anonymous_loopback=True, commands_wait_max_s=NO_RECHECK_S
        )
    )
    with serve(app) as url, httpx.Client(base_url=url, timeout=NO_RECHECK_S + 30) as http:
        register_nodes(http, ["n0"])
        assert http.post("/v1/jobs", json=job_body("j0", ["n0"])).status_code == 201
        assert isinstance(app.state.listener, CommandWatermark)
        assert wait_until(lambda: app.state.notifier.listening, timeout=WOKEN_WITHIN_S)
        for _ in range(3):
            assert http.get("/v1/nodes/n0/commands", params={"wait_s": 0}).json()["commands"] == []
        assert looks == ["n0"]  # the first look found nothing; the renewals kept its answer

        got: dict[str, Any] = {}

        def poll() -> None:
            with httpx.Client(base_url=url, timeout=NO_RECHECK_S + 30) as c:
                got["r"] = c.get("/v1/nodes/n0/commands", params={"wait_s": NO_RECHECK_S})

        poller = threading.Thread(target=poll)
        poller.start()
        # A script on the database file, not the service: no notifier hears its commit.
        outside = make_engine(store)
        try:
            with make_sessionmaker(outside).begin() as s:
                s.add(m.Command(node="n0", job_id="j0", kind="checkpoint_now", created_at=NOW))
        finally:
            outside.dispose()
        poller.join(WOKEN_WITHIN_S)
        assert not poller.is_alive(), "the outside writer's command never woke the poll"
        body = got["r"].json()
        assert [c["kind"] for c in body["commands"]] == ["checkpoint_now"]
        assert looks == ["n0", "n0"]


def test_the_first_failure_is_logged_with_its_retry_and_a_stop_before_start_is_fine(
    caplog: pytest.LogCaptureFixture,
) -> None:
    mark = CommandWatermark(unreadable, Recording(), interval_s=3600)  # type: ignore[arg-type]
    mark.stop()  # never started: nothing to join
    mark._read()
    failures = [r.getMessage() for r in caplog.records if "watermark" in r.getMessage()]
    assert failures == [
        "command watermark: reading the store failed; every poll looks, and the "
        f"watermark reads again in {delivery.WATERMARK_RETRY_S:.0f} s"
    ]


def test_after_a_failed_read_the_thread_retries_on_the_retry_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(delivery, "WATERMARK_RETRY_S", 0.01)
    tries: list[int] = []

    def broken() -> Session:
        tries.append(1)
        return unreadable()

    # Its interval is out of reach: only the retry interval can bring the next tries.
    mark = CommandWatermark(broken, Recording(), interval_s=3600)  # type: ignore[arg-type]
    mark.start()
    try:
        assert wait_until(lambda: len(tries) >= 3, timeout=WOKEN_WITHIN_S)
    finally:
        mark.stop()


def test_while_reads_succeed_the_thread_reads_on_its_interval_named_and_daemonic(
    sessions: tuple[sessionmaker[Session], sessionmaker[Session]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, reads = sessions
    monkeypatch.setattr(delivery, "WATERMARK_RETRY_S", 3600.0)  # out of reach
    mark = CommandWatermark(reads, Recording(), interval_s=0.01)
    mark.start()
    try:
        assert wait_until(lambda: mark.reads >= 3, timeout=WOKEN_WITHIN_S)
        # Named for stack dumps (py-spy dump): daemonic, so a hung read never holds an exit.
        assert mark._thread is not None
        assert (mark._thread.name, mark._thread.daemon) == ("railover-command-watermark", True)
    finally:
        mark.stop()
