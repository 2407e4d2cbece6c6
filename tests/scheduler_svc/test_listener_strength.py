"""The command listener's own life, directly: its thread, its connection, its reconnects
and their backoff, and how it ends; and the notifier's stamps across wake-ups of all.

test_listen.py drives the listener through real replicas; these tests pin what those
cannot see (the order of the listener's reports to its notifier, each backoff, the
connection's settings) with a listener of their own, on a real PostgreSQL where one is
needed, and on loopback ports that refuse or never answer where none is.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from sqlalchemy import make_url

from railover_testing.waiting import wait_until
from scheduler_svc.services import delivery
from scheduler_svc.services.delivery import (
    LISTENER_APPLICATION_NAME,
    CommandListener,
    CommandNotifier,
)
from scheduler_svc.store.db import (
    COMMANDS_CHANNEL,
    make_engine,
    make_sessionmaker,
    publish_command_nodes,
)
from tests.scheduler_svc.test_listen import terminate_listeners

# Generous for a loaded 2-core machine; the waits below end as soon as their condition holds.
WITHIN_S = 30.0


class Recording(CommandNotifier):
    """A notifier that records, in order, what its listener tells it."""

    def __init__(self) -> None:
        super().__init__()
        self.told: list[str] = []
        self._told_lock = threading.Lock()

    def _tell(self, what: str) -> None:
        with self._told_lock:
            self.told.append(what)

    def listening_threadsafe(self, listening: bool) -> None:
        self._tell(f"listening {listening!r}")
        super().listening_threadsafe(listening)

    def notify_all_threadsafe(self) -> None:
        self._tell("all")
        super().notify_all_threadsafe()

    def notify_threadsafe(self, nodes: Iterable[str]) -> None:
        self._tell("nodes " + ",".join(sorted(nodes)))
        super().notify_threadsafe(nodes)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop in a thread of its own, as the service's is to the listener."""
    running = asyncio.new_event_loop()
    thread = threading.Thread(target=running.run_forever, daemon=True)
    thread.start()
    yield running
    running.call_soon_threadsafe(running.stop)
    thread.join(WITHIN_S)
    running.close()


def applied(loop: asyncio.AbstractEventLoop) -> None:
    """Return once the loop has run every call handed to it before this one."""
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(WITHIN_S)


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def refused_url() -> str:
    """Nothing listens there: every connection is refused at once."""
    return f"postgresql+psycopg://postgres@127.0.0.1:{unused_port()}/none"


def backoffs(caplog: pytest.LogCaptureFixture) -> list[tuple[str, float]]:
    """Each reconnect the listener logged: why ("lost" or "failed") and its wait."""
    out: list[tuple[str, float]] = []
    for r in list(caplog.records):
        if r.name != delivery.__name__:
            continue
        if r.msg.startswith("command listener lost PostgreSQL ("):
            out.append(("lost", float(r.args[1])))  # type: ignore[index,arg-type]
        elif r.msg.startswith("command listener failed;"):
            out.append(("failed", float(r.args[0])))  # type: ignore[index,arg-type]
    return out


# -- the notifier's stamps -----------------------------------------------------------------------
def test_every_wake_up_of_all_voids_a_look_begun_before_it() -> None:
    """Not only the first: a look that began before the second wake-up of all is void too."""

    async def scenario() -> None:
        n = CommandNotifier()
        n.bind(asyncio.get_running_loop())
        n.listening_threadsafe(True)
        for _ in range(2):
            stamp = n.stamp("n0")
            n.notify_all_threadsafe()  # during the look
            await asyncio.sleep(0)
            n.looked_empty("n0", stamp)
            assert not n.unchanged_since_empty("n0")
            n.looked_empty("n0", n.stamp("n0"))  # a look after it stands
            assert n.unchanged_since_empty("n0")

    asyncio.run(scenario())


def test_every_change_of_the_listeners_connection_voids_a_look_begun_before_it() -> None:
    """Lost and regained while a look was under way: that look's answer may be stale."""

    async def scenario() -> None:
        n = CommandNotifier()
        n.bind(asyncio.get_running_loop())
        n.listening_threadsafe(True)
        await asyncio.sleep(0)
        stamp = n.stamp("n0")
        n.listening_threadsafe(False)
        n.listening_threadsafe(True)
        await asyncio.sleep(0)
        assert n.listening
        n.looked_empty("n0", stamp)
        assert not n.unchanged_since_empty("n0")

    asyncio.run(scenario())


def test_a_new_notifier_is_not_listening() -> None:
    assert CommandNotifier().listening is False


def test_the_store_url_keeps_its_password_for_libpq() -> None:
    """The listener connects with it: a URL with the password masked would be refused."""
    url = "postgresql+psycopg://railover:s3cret@db.example:6432/railover?sslmode=require"
    assert delivery.libpq_url(url) == (
        "postgresql://railover:s3cret@db.example:6432/railover?sslmode=require"
    )


# -- its wait: wake-ups, the stop channel and the idle ping --------------------------------------
@dataclass(frozen=True)
class Note:
    channel: str
    payload: str


class Scripted:
    """A connection whose waits return what the script says, at once, in order."""

    def __init__(self, rounds: list[list[Note]]) -> None:
        self.rounds = rounds
        self.log: list[str] = []

    def notifies(self, timeout: float) -> Iterator[Note]:
        assert timeout == delivery.LISTEN_WAIT_S
        self.log.append("wait")
        return iter(self.rounds.pop(0))

    def execute(self, query: str) -> None:
        self.log.append(query)


def test_the_wait_pings_after_ping_s_of_idle_waits_and_not_while_woken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Waits of 1 s and a ping after 3 s idle: three quiet waits, a ping, and again; a
    wake-up starts the count again; the stop channel ends it. Each wake-up's nodes reach
    the notifier."""
    monkeypatch.setattr(delivery, "LISTEN_WAIT_S", 1.0)
    monkeypatch.setattr(delivery, "LISTEN_PING_S", 3.0)
    n = Recording()
    listener = CommandListener(refused_url(), n)
    conn = Scripted(
        [
            [],
            [],
            [],
            [],
            [],
            [],
            [Note(COMMANDS_CHANNEL, "n1 n2")],
            [],
            [],
            [],
            [Note(COMMANDS_CHANNEL, "n3"), Note(listener._stop_channel, ""), Note("x", "n4")],
        ]
    )
    listener._listen(conn)  # type: ignore[arg-type]  # what _listen uses of a connection
    ping = ["wait"] * 3 + ["SELECT 1"]  # three idle waits, then the ping; the count restarts
    assert conn.log == ping + ping + ["wait"] + ping + ["wait"]
    assert n.told == ["nodes n1,n2", "nodes n3"]  # nothing after the stop channel's note


# -- its thread and its connection ---------------------------------------------------------------
def test_stop_before_start_does_nothing() -> None:
    listener = CommandListener(refused_url(), CommandNotifier())
    listener.stop()  # no thread to end, no NOTIFY to send: no error
    assert listener._thread is None


@pytest.mark.postgres
def test_the_listener_is_a_daemon_thread_named_for_it(pg_url: str) -> None:
    """Named for py-spy and thread dumps; a daemon, so a listener stuck on a dead store
    never keeps a stopping service alive."""
    listener = CommandListener(pg_url, CommandNotifier())
    listener.start()
    try:
        thread = listener._thread
        assert thread is not None and thread.is_alive()
        assert thread.name == "railover-command-listener"
        assert thread.daemon is True
    finally:
        listener.stop()
    assert not thread.is_alive()


@pytest.mark.postgres
def test_its_connection_autocommits_and_notices_a_vanished_peer(pg_url: str) -> None:
    """Named in pg_stat_activity, autocommit (a LISTEN takes effect at once), a bounded
    connect, and TCP keepalives: a store host gone without a word is noticed by the kernel."""
    listener = CommandListener(pg_url, CommandNotifier())
    with listener._connect() as conn:
        params = conn.info.get_parameters()
        assert conn.autocommit is True
        assert conn.execute("SHOW application_name").fetchone() == (LISTENER_APPLICATION_NAME,)
    assert {k: params.get(k) for k in ("connect_timeout", "keepalives")} == {
        "connect_timeout": str(delivery.CONNECT_TIMEOUT_S),
        "keepalives": "1",
    }
    assert {k: params.get(k) for k in ("keepalives_idle", "keepalives_interval")} == {
        "keepalives_idle": "10",
        "keepalives_interval": "5",
    }
    assert params.get("keepalives_count") == "3"


# -- what it tells its notifier, in order ----------------------------------------------------------
@pytest.mark.postgres
def test_it_reports_each_listen_and_each_loss_and_ends_not_listening(
    pg_url: str, loop: asyncio.AbstractEventLoop
) -> None:
    n = Recording()
    n.bind(loop)
    listener = CommandListener(pg_url, n)
    listener.start()
    try:
        assert wait_until(lambda: listener.listens == 1, WITHIN_S)
        applied(loop)
        assert n.listening is True
        # A commit that issues commands to two nodes reaches it by name.
        engine = make_engine(pg_url)
        try:
            with make_sessionmaker(engine)() as session:
                publish_command_nodes(session, ["n7", "n3"])
                session.commit()
        finally:
            engine.dispose()
        assert wait_until(lambda: "nodes n3,n7" in n.told, WITHIN_S)
        assert terminate_listeners(pg_url) == 1
        assert wait_until(lambda: listener.listens == 2, WITHIN_S)
    finally:
        listener.stop()
    applied(loop)
    assert n.listening is False
    assert n.told == [
        "listening True",
        "all",
        "nodes n3,n7",
        "listening False",  # lost its connection
        "listening True",
        "all",  # what was committed meanwhile is looked for
        "listening False",  # stopped
    ]


@pytest.mark.postgres
def test_the_backoff_starts_again_after_each_listen(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Lost, then two refused reconnects (0.1, 0.2, 0.4 s), then listening: the next loss
    waits 0.1 s again, not 0.8."""
    caplog.set_level(logging.WARNING, logger=delivery.__name__)
    refusals = {"left": 0}
    real = CommandListener._connect

    def connect(self: CommandListener) -> psycopg.Connection[Any]:
        if refusals["left"]:
            refusals["left"] -= 1
            raise psycopg.OperationalError("refused by the test")
        return real(self)

    monkeypatch.setattr(CommandListener, "_connect", connect)
    listener = CommandListener(pg_url, CommandNotifier())
    listener.start()
    try:
        assert wait_until(lambda: listener.listens == 1, WITHIN_S)
        refusals["left"] = 2
        assert terminate_listeners(pg_url) == 1
        assert wait_until(lambda: listener.listens == 2, WITHIN_S)
        assert terminate_listeners(pg_url) == 1
        assert wait_until(lambda: listener.listens == 3, WITHIN_S)
    finally:
        listener.stop()
    assert backoffs(caplog) == [("lost", 0.1), ("lost", 0.2), ("lost", 0.4), ("lost", 0.1)]
    # Each says why: the refusals name themselves.
    lost = [r.getMessage() for r in caplog.records if "refused by the test" in r.getMessage()]
    assert len(lost) == 2
    assert (
        lost[0] == "command listener lost PostgreSQL (refused by the test); reconnecting in 0.2 s"
    )


def test_reconnects_double_their_wait_up_to_the_cap(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Two unexpected errors, then a store that refuses: each wait doubles, to the cap, in
    both branches; and each failure says the listener is not listening."""
    caplog.set_level(logging.WARNING, logger=delivery.__name__)
    monkeypatch.setattr(delivery, "RECONNECT_MAX_S", 0.8)
    errors = {"left": 2}
    real = CommandListener._connect

    def connect(self: CommandListener) -> psycopg.Connection[Any]:
        if errors["left"]:
            errors["left"] -= 1
            raise RuntimeError("a bug in the listener's connection")
        return real(self)

    monkeypatch.setattr(CommandListener, "_connect", connect)
    n = Recording()
    n.bind(loop)
    listener = CommandListener(refused_url(), n)
    listener.start()
    try:
        assert wait_until(lambda: len(backoffs(caplog)) >= 5, WITHIN_S)
    finally:
        listener.stop()
    assert backoffs(caplog)[:5] == [
        ("failed", 0.1),
        ("failed", 0.2),
        ("lost", 0.4),
        ("lost", 0.8),
        ("lost", 0.8),
    ]
    failures = len(backoffs(caplog))
    assert listener.listens == 0
    # Each failure (and stop) said "not listening"; nothing was ever listening or woken.
    assert set(n.told) == {"listening False"}
    assert failures + 1 <= len(n.told) <= failures + 2  # one more try may fail as stop runs


@pytest.mark.postgres
def test_an_idle_listener_pings_its_store(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle for LISTEN_PING_S, the listener runs a query: a half-open connection errors then."""
    monkeypatch.setattr(delivery, "LISTEN_WAIT_S", 0.05)
    monkeypatch.setattr(delivery, "LISTEN_PING_S", 0.2)
    listener = CommandListener(pg_url, CommandNotifier())
    listener.start()

    def last_query() -> str | None:
        with psycopg.connect(delivery.libpq_url(pg_url), autocommit=True) as c:
            row = c.execute(
                "SELECT query FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
                (make_url(pg_url).database, LISTENER_APPLICATION_NAME),
            ).fetchone()
        return None if row is None else str(row[0])

    try:
        assert wait_until(lambda: listener.listens == 1, WITHIN_S)
        assert wait_until(lambda: last_query() == "SELECT 1", WITHIN_S), last_query()
    finally:
        listener.stop()


def test_stop_returns_while_the_store_takes_connections_but_never_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A socket that accepts and then says nothing (a hung store): the listener's connect
    and stop's NOTIFY each give up after their connect timeout, so stop ends the thread."""
    monkeypatch.setattr(delivery, "CONNECT_TIMEOUT_S", 2)  # libpq's least
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"postgresql+psycopg://postgres@127.0.0.1:{silent.getsockname()[1]}/none"
        listener = CommandListener(url, CommandNotifier())
        listener.start()
        listener.stop()
        assert listener._thread is not None and not listener._thread.is_alive()
