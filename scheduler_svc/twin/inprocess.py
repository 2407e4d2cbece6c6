"""Run the real service on loopback inside this process: the fleet twin, the demo, tests and
benchmarks (over real HTTP, on a clock the caller may move by hand)."""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

import uvicorn
from fastapi import FastAPI

from scheduler_svc.config import Settings
from scheduler_svc.main import create_app
from scheduler_svc.serving import server_config
from scheduler_svc.store.uow import Clock, system_clock

# Ports below the kernel's ephemeral range: a port handed out here is closed again before
# its daemon binds it, and one from the ephemeral range can be taken meanwhile by any
# outgoing connection on the machine (seen: an agent of the kill -9 test failing to bind
# its metrics port while the other test worker ran).
_LISTEN_PORTS = (20000, 32768)


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _LISTEN_PORTS[1]


def free_port() -> int:
    """A loopback port nothing listens on, for a daemon to bind: outside the ephemeral
    range where one is free, else whatever the kernel hands out."""
    top = min(_LISTEN_PORTS[1], _ephemeral_low())
    rng = random.SystemRandom()
    for _ in range(100):
        port = rng.randrange(_LISTEN_PORTS[0], top) if top > _LISTEN_PORTS[0] else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            chosen: int = s.getsockname()[1]
            return chosen
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        fallback: int = s.getsockname()[1]
        return fallback


class ManualClock:
    """A service's time that moves only when the test says: starts at `start`."""

    def __init__(self, start: datetime) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> datetime:
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now


class _Server(uvicorn.Server):
    """uvicorn's server, looking for `should_exit` every 10 ms rather than every 100 ms, and
    stopping as soon as its connections and tasks are done rather than after a fixed 100 ms
    pause: a test run starts and stops a thousand services, each after its last request."""

    async def main_loop(self) -> None:
        ticks = 0
        while not await self.on_tick(ticks // 10):  # on_tick counts its own 100 ms ticks
            ticks += 1
            await asyncio.sleep(0.01)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()  # idle ones close now, busy ones after their answer
        grace = self.config.timeout_graceful_shutdown
        deadline = None if grace is None else time.monotonic() + grace
        while (self.server_state.connections or self.server_state.tasks) and not self.force_exit:
            if deadline is not None and time.monotonic() > deadline:
                for task in self.server_state.tasks:
                    task.cancel(msg="the in-process service stopped")
                break
            await asyncio.sleep(0.01)
        for server in self.servers:
            await server.wait_closed()
        if not self.force_exit:
            await self.lifespan.shutdown()


@contextmanager
def local_service(
    settings: Settings, startup_timeout_s: float = 30.0, clock: Clock = system_clock
) -> Iterator[str]:
    """Serve `settings` on a free loopback port over real HTTP; yields the base URL.

    `clock` is the service's time (requests and the coordinator's deadlines alike).
    """
    with local_app(settings, startup_timeout_s, clock) as (_, url):
        yield url


@contextmanager
def local_app(
    settings: Settings, startup_timeout_s: float = 30.0, clock: Clock = system_clock
) -> Iterator[tuple[FastAPI, str]]:
    """`local_service`, yielding the running app too (its state: the coordinator, the
    engines) for a caller that drives its parts, such as a sweep at a moment it picks."""
    port = settings.port or free_port()
    settings = settings.model_copy(update={"host": "127.0.0.1", "port": port})
    app = create_app(settings, clock=clock)
    with served_app(app, port, startup_timeout_s) as url:
        yield app, url


@contextmanager
def served_app(
    app: FastAPI, port: int | None = None, startup_timeout_s: float = 30.0
) -> Iterator[str]:
    """Serve an app built by `create_app` (a test may add routes or swap parts of its
    state first) on loopback over real HTTP, once it answers /readyz; yields its URL."""
    port = port or free_port()
    config = server_config(
        app, app.state.settings, host="127.0.0.1", port=port, log_level="warning", lifespan="on"
    )
    server = _Server(config)
    thread = threading.Thread(target=server.run, name=f"railover-svc-{port}", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the service did not start on {url}")
        time.sleep(0.02)
    try:
        # urllib, not httpx: a new httpx client builds a TLS context first (20 ms, each
        # test). The whole start-up budget for the first answer: a loaded machine is slow.
        remaining = max(1.0, deadline - time.monotonic())
        with urllib.request.urlopen(f"{url}/readyz", timeout=remaining) as ready:  # noqa: S310
            if ready.status != 200:
                raise RuntimeError(f"the service on {url} is not ready: {ready.status}")
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=15)
