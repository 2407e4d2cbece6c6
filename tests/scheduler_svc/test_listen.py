"""Waiting long-polls cost nothing while nothing happens, and wake across replicas.

A poll looks at the store once, then waits until it is woken or its deadline
passes; it never re-reads on a timer. On PostgreSQL a commit that issues
commands NOTIFYs their nodes, and each replica's one listening connection wakes
its own polls, so a command committed through replica A ends a poll held by
replica B. Every poll here asks for 120 s, so one that is not woken outlasts
every bound below by far: only a wake-up can answer in time.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any

import httpx
import psycopg
import pytest
from sqlalchemy import make_url
from sqlalchemy.orm import Session, sessionmaker

from railover_testing.local import local_service
from railover_testing.waiting import wait_until
from scheduler_svc.api import commands as commands_api
from scheduler_svc.config import Settings
from scheduler_svc.main import create_app
from scheduler_svc.services.delivery import (
    LISTENER_APPLICATION_NAME,
    CommandListener,
    CommandNotifier,
    CommandWatermark,
    libpq_url,
)
from scheduler_svc.store.db import (
    COMMANDS_CHANNEL,
    command_nodes_from_payload,
    make_engine,
    make_sessionmaker,
    publish_command_nodes,
)
from scheduler_svc.store.uow import notify_nodes, unit_of_work
from tests.scheduler_svc.helpers import event, job_body, register_nodes
from tests.scheduler_svc.test_delivery import serve

NO_RECHECK_S = 120.0
# Generous for a loaded 2-core machine, yet far below NO_RECHECK_S: only a wake-up meets it.
WOKEN_WITHIN_S = 20.0


@pytest.fixture
def wait_log(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], threading.Condition]:
    """Every notifier wait of every app in this process, as "wait n" / "woke n"."""
    log: list[str] = []
    changed = threading.Condition()
    real = CommandNotifier.wait

    async def wait(self: CommandNotifier, node: str, timeout: float) -> None:
        with changed:
            log.append(f"wait {node}")
            changed.notify_all()
        await real(self, node, timeout)
        with changed:
            log.append(f"woke {node}")
            changed.notify_all()

    monkeypatch.setattr(CommandNotifier, "wait", wait)
    return log, changed


def long_poll(url: str, node: str, got: dict[str, Any]) -> threading.Thread:
    def run() -> None:
        with httpx.Client(base_url=url, timeout=NO_RECHECK_S + 30) as c:
            got["response"] = c.get(f"/v1/nodes/{node}/commands", params={"wait_s": NO_RECHECK_S})

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def delivered(got: dict[str, Any]) -> list[tuple[str, list[int], str]]:
    assert got["response"].status_code == 200
    return [(c["kind"], c["ranks"], c["state"]) for c in got["response"].json()["commands"]]


# -- payloads -----------------------------------------------------------------------------------
@pytest.mark.postgres
def test_a_commit_notifies_every_node_even_past_one_payloads_limit(pg_url: str) -> None:
    """3,000 long names are more than one NOTIFY holds (8,000 bytes): all arrive, once."""
    nodes = {f"rack{i:04d}-{'x' * 200}" for i in range(3000)}
    with psycopg.connect(libpq_url(pg_url), autocommit=True) as listening:
        listening.execute(f"LISTEN {COMMANDS_CHANNEL}")
        engine = make_engine(pg_url)
        try:
            with unit_of_work(make_sessionmaker(engine)) as session:
                notify_nodes(session, nodes)
                # Nothing is delivered before the commit.
                assert list(listening.notifies(timeout=0.2)) == []
            got: list[str] = []
            for note in listening.notifies(timeout=WOKEN_WITHIN_S):
                assert note.channel == COMMANDS_CHANNEL
                assert len(note.payload.encode()) < 8000
                got += command_nodes_from_payload(note.payload)
                if len(got) >= len(nodes):
                    break
            # A rolled-back transaction notifies nobody.
            with make_sessionmaker(engine)() as session:
                publish_command_nodes(session, ["never"])
                session.rollback()
            assert list(listening.notifies(timeout=0.5)) == []
        finally:
            engine.dispose()
    assert sorted(got) == sorted(nodes)


def test_publishing_on_sqlite_is_a_no_op(tmp_path: Any) -> None:
    from scheduler_svc.store.db import upgrade

    url = f"sqlite:///{tmp_path / 'r.db'}"
    upgrade(url)
    engine = make_engine(url)
    factory: sessionmaker[Session] = make_sessionmaker(engine)
    with unit_of_work(factory) as session:
        notify_nodes(session, ["n0"])  # no pg_notify to run: the commit just succeeds
    engine.dispose()


# -- a poll looks once, then only when woken ---------------------------------------------------
@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each look a poll takes at the store."""
    seen: list[str] = []
    real = commands_api._take

    def take(*args: Any, **kwargs: Any) -> Any:
        seen.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(commands_api, "_take", take)
    return seen


def test_an_idle_poll_looks_at_the_store_once(settings: Settings, looks: list[str]) -> None:
    """No re-read while it waits: a poll nothing wakes looks when it starts, and then returns
    empty at its deadline (the old path looked once a second: 4 looks over these 3 s)."""
    app = create_app(settings)
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        register_nodes(http, ["n0"])
        r = http.get("/v1/nodes/n0/commands", params={"wait_s": 3})
        assert r.status_code == 200 and r.json() == {"commands": []}
        listener = app.state.listener
        if settings.db_url.startswith("sqlite"):
            # Other writers' commands are caught by the newest id (test_watermark.py).
            assert isinstance(listener, CommandWatermark)
            assert listener.reads >= 1
        else:
            assert isinstance(listener, CommandListener)
            assert wait_until(lambda: listener.listens >= 1, timeout=30)
            assert listener.listens == 1
    assert looks == ["n0"]


def test_notify_all_wakes_every_waiter() -> None:
    import asyncio

    async def scenario() -> None:
        n = CommandNotifier()
        n.bind(asyncio.get_running_loop())
        waits = [asyncio.create_task(n.wait(f"n{i}", NO_RECHECK_S)) for i in range(3)]
        await asyncio.sleep(0)
        n.notify_all_threadsafe()
        await asyncio.wait_for(asyncio.gather(*waits), WOKEN_WITHIN_S)

    asyncio.run(scenario())


def test_a_reset_forgets_an_earlier_wake_up_but_not_a_later_one() -> None:
    import asyncio

    async def scenario() -> None:
        n = CommandNotifier()
        n.notify(["n0"])  # an echo of a delivery, with no poll waiting
        n.reset("n0")  # the next poll is about to look at the store
        assert not n._event("n0").is_set()
        n.notify(["n0"])  # a commit after the look began: its wait must end at once
        await asyncio.wait_for(n.wait("n0", NO_RECHECK_S), WOKEN_WITHIN_S)
        n.reset("never-seen")  # nothing to forget: no error, no event made
        assert "never-seen" not in n._events

    asyncio.run(scenario())


# -- two replicas on one PostgreSQL --------------------------------------------------------------
@pytest.fixture
def replicas(pg_url: str) -> Iterator[tuple[str, str]]:
    from tests.conftest import truncate_pg

    truncate_pg(pg_url)
    settings = Settings(
        db_url=pg_url, port=0, allow_anonymous_loopback=True, commands_wait_max_s=NO_RECHECK_S
    )
    with local_service(settings) as a, local_service(settings) as b:
        with httpx.Client(base_url=a, timeout=30) as http:
            register_nodes(http, ["n0", "n1"])
            assert http.post("/v1/jobs", json=job_body("j1", ["n0", "n1"])).status_code == 201
        yield a, b


def listener_pids(pg_url: str) -> list[int]:
    with psycopg.connect(libpq_url(pg_url), autocommit=True) as c:
        rows = c.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
            (make_url(pg_url).database, LISTENER_APPLICATION_NAME),
        ).fetchall()
    return sorted(r[0] for r in rows)


def terminate_listeners(pg_url: str) -> int:
    """End every listener's backend, as a store restart or a cut link would; how many."""
    with psycopg.connect(libpq_url(pg_url), autocommit=True) as c:
        row = c.execute(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND application_name = %s) t",
            (make_url(pg_url).database, LISTENER_APPLICATION_NAME),
        ).fetchone()
    assert row is not None
    return int(row[0])


def fault_on_n1(url: str) -> None:
    with httpx.Client(base_url=url, timeout=60) as http:
        r = http.post("/v1/events", json={"events": [event("n1", device="mlx5_6", after_s=3000)]})
        assert r.status_code == 202


@pytest.mark.postgres
def test_a_poll_on_replica_b_wakes_on_a_commit_through_replica_a(
    replicas: tuple[str, str], wait_log: tuple[list[str], threading.Condition]
) -> None:
    a, b = replicas
    log, changed = wait_log
    got: dict[str, Any] = {}
    poller = long_poll(b, "n1", got)
    with changed:
        # B's poll looked at the store, found nothing, and now waits.
        assert changed.wait_for(lambda: log == ["wait n1"], timeout=30)
    fault_on_n1(a)
    poller.join(WOKEN_WITHIN_S)
    assert not poller.is_alive(), "replica B's poll was not woken by replica A's commit"
    assert log == ["wait n1", "woke n1"]
    assert delivered(got) == [("failover", [14], "delivered")]


@pytest.mark.postgres
def test_the_listener_survives_a_dropped_connection(
    pg_url: str,
    replicas: tuple[str, str],
    wait_log: tuple[list[str], threading.Condition],
) -> None:
    """Its backend is terminated; it reconnects, LISTENs again and wakes every waiting poll
    once (a commit during the gap is read then); later commits wake polls as before."""
    a, b = replicas
    log, changed = wait_log
    before = listener_pids(pg_url)
    assert len(before) == 2  # one per replica
    got: dict[str, Any] = {}
    poller = long_poll(b, "n1", got)
    with changed:
        assert changed.wait_for(lambda: log == ["wait n1"], timeout=30)
    assert terminate_listeners(pg_url) == 2
    with changed:
        # B listens again, and its wake-up of every poll made this one look once more.
        assert changed.wait_for(
            lambda: log == ["wait n1", "woke n1", "wait n1"], timeout=WOKEN_WITHIN_S
        )
    assert wait_until(lambda: len(listener_pids(pg_url)) == 2, timeout=WOKEN_WITHIN_S)
    assert not set(listener_pids(pg_url)) & set(before)
    fault_on_n1(a)
    poller.join(WOKEN_WITHIN_S)
    assert not poller.is_alive(), "the re-connected listener did not wake the poll"
    assert log == ["wait n1", "woke n1", "wait n1", "woke n1"]
    assert delivered(got) == [("failover", [14], "delivered")]


@pytest.mark.postgres
def test_a_commit_while_nobody_listens_is_not_missed(
    pg_url: str,
    replicas: tuple[str, str],
    wait_log: tuple[list[str], threading.Condition],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The command commits while B's listener is down: B's wake-up after LISTEN finds it."""
    a, b = replicas
    log, changed = wait_log
    got: dict[str, Any] = {}
    poller = long_poll(b, "n1", got)
    with changed:
        assert changed.wait_for(lambda: log == ["wait n1"], timeout=30)
    # Hold every reconnect until the command has committed.
    gate = threading.Event()
    real_connect = CommandListener._connect

    def connect(self: CommandListener) -> psycopg.Connection[Any]:
        assert gate.wait(60)
        return real_connect(self)

    monkeypatch.setattr(CommandListener, "_connect", connect)
    terminate_listeners(pg_url)
    assert wait_until(lambda: listener_pids(pg_url) == [], timeout=WOKEN_WITHIN_S)
    fault_on_n1(a)  # its NOTIFY reaches no listener of B
    assert log == ["wait n1"] and poller.is_alive()
    gate.set()
    poller.join(WOKEN_WITHIN_S)
    assert not poller.is_alive(), "the command committed during the gap was missed"
    assert log == ["wait n1", "woke n1"]
    assert delivered(got) == [("failover", [14], "delivered")]


@pytest.mark.postgres
def test_stop_ends_the_listeners_wait_at_once(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`stop` NOTIFYs the listener's own channel: with a wait longer than stop's 10 s join,
    only that notification can end the thread in time. Others' polls are not woken."""
    monkeypatch.setattr("scheduler_svc.services.delivery.LISTEN_WAIT_S", 600.0)
    woken: list[str] = []

    class Recording(CommandNotifier):
        def notify_threadsafe(self, nodes: Iterable[str]) -> None:
            woken.extend(nodes)

        def notify_all_threadsafe(self) -> None:
            woken.append("all")

    other, mine = Recording(), CommandNotifier()
    bystander = CommandListener(pg_url, other)
    listener = CommandListener(pg_url, mine)
    bystander.start()
    listener.start()
    try:
        assert wait_until(lambda: listener.listens == 1 and bystander.listens == 1, timeout=30)
        assert wait_until(lambda: len(listener_pids(pg_url)) == 2, timeout=30)
        listener.stop()
        assert listener._thread is not None and not listener._thread.is_alive()
        assert woken == ["all"]  # its own first LISTEN only: the stop reached nobody else
    finally:
        bystander.stop()


# -- a renewal skips its look when nothing changed (PostgreSQL, while listening) -----------------
def test_an_empty_look_stands_until_a_wake_up_or_a_listener_change() -> None:
    import asyncio

    async def scenario() -> None:
        n = CommandNotifier()
        n.bind(asyncio.get_running_loop())
        stamp = n.stamp("n0")
        n.looked_empty("n0", stamp)
        assert not n.unchanged_since_empty("n0")  # not listening: nothing stands
        n.listening_threadsafe(True)
        await asyncio.sleep(0)  # the loop runs the listener's call
        assert n.listening and not n.unchanged_since_empty("n0")  # looked before it listened
        n.looked_empty("n0", n.stamp("n0"))
        n.looked_empty("n1", n.stamp("n1"))
        assert n.unchanged_since_empty("n0") and n.unchanged_since_empty("n1")
        n.notify(["n1"])  # a command for n1: only n1 must look again
        assert n.unchanged_since_empty("n0") and not n.unchanged_since_empty("n1")
        # A wake-up between a look's start and its end: that look's answer may miss it.
        stamp = n.stamp("n1")
        n.notify(["n1"])
        n.looked_empty("n1", stamp)
        assert not n.unchanged_since_empty("n1")
        n.notify_all_threadsafe()  # the listener reconnected: everything looks again
        await asyncio.sleep(0)
        assert not n.unchanged_since_empty("n0")
        n.looked_empty("n0", n.stamp("n0"))
        assert n.unchanged_since_empty("n0")
        n.listening_threadsafe(False)  # lost: nothing stands, and nothing is kept
        await asyncio.sleep(0)
        assert not n.unchanged_since_empty("n0")
        n.listening_threadsafe(True)
        await asyncio.sleep(0)
        assert not n.unchanged_since_empty("n0")

    asyncio.run(scenario())


@pytest.fixture
def listening(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each change of every notifier's listening, as the event loop applies it."""
    seen: list[bool] = []
    real = CommandNotifier._set_listening

    def record(self: CommandNotifier, listening: bool) -> None:
        seen.append(listening)
        real(self, listening)

    monkeypatch.setattr(CommandNotifier, "_set_listening", record)
    return seen


@pytest.mark.postgres
def test_a_renewal_skips_the_look_while_listening_and_nothing_woke_its_node(
    pg_url: str, looks: list[str], listening: list[bool], replicas: tuple[str, str]
) -> None:
    a, b = replicas
    assert wait_until(lambda: listening.count(True) == 2, timeout=30)  # A's and B's
    assert looks == []  # no poll yet: the fixture registered nodes and a job only

    def renew(node: str = "n1", **params: Any) -> list[dict[str, Any]]:
        with httpx.Client(base_url=b, timeout=NO_RECHECK_S + 30) as http:
            r = http.get(f"/v1/nodes/{node}/commands", params={"wait_s": 0, **params})
        assert r.status_code == 200, r.text
        cmds: list[dict[str, Any]] = r.json()["commands"]
        return cmds

    for _ in range(3):
        assert renew() == []
    assert looks == ["n1"]  # the first found nothing; nothing has woken n1 since
    assert renew("n0") == [] and renew("n0") == []
    assert looks == ["n1", "n0"]
    # A command through replica A: B's listener wakes n1, whose next poll looks and finds it.
    got: dict[str, Any] = {}
    fault_on_n1(a)
    long_poll(b, "n1", got).join(WOKEN_WITHIN_S + 30)
    assert delivered(got) == [("failover", [14], "delivered")]
    assert looks == ["n1", "n0", "n1"]
    assert renew() == [] and renew() == []  # the first looks (its last look found one)
    assert renew("n0") == []  # n0 was not woken: still skipped
    assert looks == ["n1", "n0", "n1", "n1"]
    # The agent at its start asks for unacknowledged commands too: those always look.
    assert [c["kind"] for c in renew(include_unacked=True)] == ["failover"]
    assert [c["kind"] for c in renew(include_unacked=True)] == ["failover"]
    assert looks == ["n1", "n0", "n1", "n1", "n1", "n1"]
    # The listeners lose their connections and listen again: every node looks once more.
    terminate_listeners(pg_url)
    assert wait_until(lambda: listening.count(True) == 4, timeout=WOKEN_WITHIN_S)
    assert wait_until(lambda: len(listener_pids(pg_url)) == 2, timeout=WOKEN_WITHIN_S)
    for _ in range(2):
        assert renew() == [] and renew("n0") == []
    assert looks == ["n1", "n0", "n1", "n1", "n1", "n1", "n1", "n0"]
    assert sorted(listening[2:]) == [False, False, True, True]  # each lost, then listening
