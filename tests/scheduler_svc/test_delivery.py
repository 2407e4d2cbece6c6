"""The command notifier, directly and through a real long-poll.

A commit that issues commands must wake that node's long-polls at once. A waiting
poll no longer re-reads the store on a timer (commands_api.RECHECK_S is None; the
old path set it to 1 s), but these tests still push any re-check far beyond every
bound they assert, so that only the wake-up can answer in time. Waking across
replicas (PostgreSQL LISTEN/NOTIFY) is tests/scheduler_svc/test_listen.py's.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from railover_testing.waiting import wait_until
from scheduler_svc.api import commands as commands_api
from scheduler_svc.config import Settings
from scheduler_svc.main import create_app
from scheduler_svc.services.delivery import CommandNotifier
from tests.scheduler_svc.helpers import event, job_body, register_nodes

# Far above every bound below: a poll that is not woken waits this long.
NO_RECHECK_S = 120.0
# Generous for a loaded 2-core machine, yet far below NO_RECHECK_S: only a wake-up meets it.
WOKEN_WITHIN_S = 20.0


# -- the notifier on its own ----------------------------------------------------------------------
def test_notify_wakes_only_that_nodes_waiter() -> None:
    async def scenario() -> list[str]:
        n = CommandNotifier()
        woke: list[str] = []

        async def waiter(node: str) -> None:
            await n.wait(node, NO_RECHECK_S)
            woke.append(node)

        a = asyncio.create_task(waiter("n0"))
        b = asyncio.create_task(waiter("n1"))
        await asyncio.sleep(0)  # one loop turn: both tasks are now waiting
        n.notify(["n1"])
        await asyncio.wait_for(b, WOKEN_WITHIN_S)
        assert not a.done()
        n.notify(iter(["n0"]))  # any iterable of names
        await asyncio.wait_for(a, WOKEN_WITHIN_S)
        return woke

    assert asyncio.run(scenario()) == ["n1", "n0"]


def test_a_poll_cancelled_as_it_is_woken_is_cancelled() -> None:
    # The client goes away in the very loop turn its wake-up lands: the poll must end
    # cancelled. (asyncio.wait_for on 3.11 returns normally then, CPython gh-86296.)
    async def scenario() -> None:
        n = CommandNotifier()
        poll = asyncio.create_task(n.wait("n0", NO_RECHECK_S))
        await asyncio.sleep(0)  # the poll is waiting
        n.notify(["n0"])
        poll.cancel()
        with pytest.raises(asyncio.CancelledError):
            await poll

    asyncio.run(scenario())


def test_a_notify_before_the_wait_is_not_lost_and_is_consumed_once() -> None:
    """A commit between a poller's look at the store and its wait must still wake it."""

    async def scenario() -> None:
        n = CommandNotifier()
        n.notify(["n0"])
        await asyncio.wait_for(n.wait("n0", NO_RECHECK_S), WOKEN_WITHIN_S)
        # Consumed: the next wait really waits (here: its short timeout, which returns quietly).
        await n.wait("n0", 0.01)
        assert not n._event("n0").is_set()

    asyncio.run(scenario())


def test_a_timed_out_wait_returns_quietly() -> None:
    asyncio.run(CommandNotifier().wait("n0", 0.0))  # no TimeoutError


def test_notify_threadsafe_from_a_worker_thread() -> None:
    async def scenario() -> None:
        n = CommandNotifier()
        n.bind(asyncio.get_running_loop())
        waiting = asyncio.create_task(n.wait("n2", NO_RECHECK_S))
        await asyncio.sleep(0)
        worker = threading.Thread(target=n.notify_threadsafe, args=(["n2"],))
        worker.start()
        await asyncio.wait_for(waiting, WOKEN_WITHIN_S)
        worker.join()

    asyncio.run(scenario())


def test_notify_threadsafe_without_a_live_loop_does_nothing() -> None:
    n = CommandNotifier()
    n.notify_threadsafe(["n0"])  # never bound: nothing to wake, no error
    assert n._events == {}
    loop = asyncio.new_event_loop()
    n.bind(loop)
    loop.close()
    n.notify_threadsafe(["n0"])  # the service stopped: no error either
    assert n._events == {}


# -- through HTTP: a long-poll woken by the commit ----------------------------------------------
@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert wait_until(lambda: server.started or not thread.is_alive(), timeout=30)
    assert server.started, "service did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


@pytest.fixture
def woken_app(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> tuple[FastAPI, list[str]]:
    """The service with its re-check pushed out of reach, and a log of the notifier's calls."""
    monkeypatch.setattr(commands_api, "RECHECK_S", NO_RECHECK_S)
    app = create_app(settings.model_copy(update={"commands_wait_max_s": NO_RECHECK_S}))
    log: list[str] = []
    waiting = threading.Event()
    real = CommandNotifier.wait

    async def wait(self: CommandNotifier, node: str, timeout: float) -> None:
        log.append(f"wait {node}")
        waiting.set()
        await real(self, node, timeout)
        log.append(f"woke {node}")

    monkeypatch.setattr(CommandNotifier, "wait", wait)
    app.state.waiting = waiting
    return app, log


def test_long_poll_wakes_on_the_commit_not_the_recheck(
    woken_app: tuple[FastAPI, list[str]],
) -> None:
    app, log = woken_app
    with serve(app) as url, httpx.Client(base_url=url, timeout=NO_RECHECK_S + 30) as http:
        register_nodes(http, ["n0", "n1"])
        assert http.post("/v1/jobs", json=job_body("j1", ["n0", "n1"])).status_code == 201
        got: dict[str, Any] = {}

        def poll() -> None:
            got["response"] = http.get("/v1/nodes/n1/commands", params={"wait_s": NO_RECHECK_S})

        poller = threading.Thread(target=poll)
        poller.start()
        # The poll looked at the store, found nothing, and now waits on the notifier.
        assert app.state.waiting.wait(30)
        assert log == ["wait n1"]
        r = http.post("/v1/events", json={"events": [event("n1", device="mlx5_6", after_s=3000)]})
        assert r.status_code == 202
        poller.join(WOKEN_WITHIN_S)
        assert not poller.is_alive(), "the long-poll was not woken by the commit"
    # Exactly one wait, ended by the wake-up (not a second look after a timeout).
    assert log == ["wait n1", "woke n1"]
    body = got["response"].json()
    assert got["response"].status_code == 200
    assert [(c["kind"], c["ranks"], c["state"]) for c in body["commands"]] == [
        ("failover", [14], "delivered")
    ]
