"""Stopping the service ends its waiting long-polls at once (notify.CommandNotifier.close).

uvicorn waits for open requests before it stops; polls of up to 120 s would hold a
rolling restart that long. The server `railover serve` runs (main.PollEndingServer)
closes the notifier when it is told to stop: every waiting poll answers empty, and a
poll that comes in while it stops answers without waiting. Each poll here asks for
120 s; only the close can end it within the generous bound below.
"""

from __future__ import annotations

import signal
import socket
import threading
from typing import Any

import httpx
import pytest
import uvicorn

from railover_testing.waiting import wait_until
from scheduler_svc.config import Settings
from scheduler_svc.main import PollEndingServer, create_app
from scheduler_svc.services.delivery import CommandNotifier
from tests.scheduler_svc.helpers import register_nodes
from tests.scheduler_svc.test_delivery import serve
from tests.scheduler_svc.test_listen import (  # noqa: F401
    NO_RECHECK_S,
    WOKEN_WITHIN_S,
    looks,
    wait_log,
)


def poll(url: str, node: str, got: dict[str, Any]) -> threading.Thread:
    def run() -> None:
        with httpx.Client(base_url=url, timeout=NO_RECHECK_S + 30) as c:
            got[node] = c.get(f"/v1/nodes/{node}/commands", params={"wait_s": NO_RECHECK_S})

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_stopping_server_answers_its_waiting_polls_and_exits(
    settings: Settings,
    wait_log: tuple[list[str], threading.Condition],  # noqa: F811
    looks: list[str],  # noqa: F811
) -> None:
    log, changed = wait_log
    app = create_app(settings.model_copy(update={"commands_wait_max_s": NO_RECHECK_S}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = PollEndingServer(config, app.state.notifier)
    running = threading.Thread(target=server.run, daemon=True)
    running.start()
    assert wait_until(lambda: server.started or not running.is_alive(), timeout=30)
    url = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=url, timeout=30) as http:
        register_nodes(http, ["n0", "n1"])
    got: dict[str, Any] = {}
    pollers = [poll(url, n, got) for n in ("n0", "n1")]
    with changed:
        assert changed.wait_for(lambda: sorted(log) == ["wait n0", "wait n1"], timeout=30)
    server.handle_exit(signal.SIGTERM, None)  # what the signal handler calls
    for p in pollers:
        p.join(WOKEN_WITHIN_S)
    running.join(WOKEN_WITHIN_S)
    assert not any(p.is_alive() for p in pollers), "a waiting poll held the stop"
    assert not running.is_alive(), "the server did not stop"
    assert {n: (r.status_code, r.json()) for n, r in got.items()} == {
        "n0": (200, {"commands": []}),
        "n1": (200, {"commands": []}),
    }
    assert sorted(log) == ["wait n0", "wait n1", "woke n0", "woke n1"]
    assert sorted(looks) == ["n0", "n1"]  # each looked when it came in, not again at the stop


def test_a_poll_that_comes_in_while_stopping_does_not_wait(
    settings: Settings,
    wait_log: tuple[list[str], threading.Condition],  # noqa: F811
) -> None:
    app = create_app(settings.model_copy(update={"commands_wait_max_s": NO_RECHECK_S}))
    with serve(app) as url, httpx.Client(base_url=url, timeout=NO_RECHECK_S + 30) as http:
        register_nodes(http, ["n0"])
        notifier: CommandNotifier = app.state.notifier
        notifier.close_threadsafe()
        assert wait_until(lambda: notifier.closing, timeout=30)
        r = http.get("/v1/nodes/n0/commands", params={"wait_s": NO_RECHECK_S})
        assert (r.status_code, r.json()) == (200, {"commands": []})
    assert wait_log[0] == []  # it looked, and answered without a wait


@pytest.mark.parametrize("closed", [False, True])
def test_close_threadsafe_before_the_loop_is_bound_or_after_it_closed(closed: bool) -> None:
    import asyncio

    n = CommandNotifier()
    if closed:
        loop = asyncio.new_event_loop()
        n.bind(loop)
        loop.close()
    n.close_threadsafe()  # nothing to schedule on: no error, and nothing closes
    assert not n.closing
