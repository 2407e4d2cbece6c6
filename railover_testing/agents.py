"""Running agents in-process, and a stand-in for the service's agent endpoints.

The tests and the demo both run agents inside one Python process: ``AgentThread`` runs one agent on
its own event loop in a thread. ``StandInService`` speaks the v1 agent
endpoints over real loopback HTTP (idempotent events by event_id, long-polled
commands, acks) for tests that need to make the service misbehave on cue; the
end-to-end test runs against the real service.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from agent.config import AgentSettings
from agent.runner import Agent
from railover_testing.local import free_port
from railover_testing.sysfs_node import FixtureNode
from railover_testing.waiting import wait_for


def short_socket_path() -> Path:
    # sun_path holds 108 bytes; pytest's tmp_path can be longer than that.
    return Path(tempfile.mkdtemp(prefix="ra", dir="/tmp")) / "agent.sock"


def settings_for(
    sysfs_root: Path,
    work: Path,
    service_url: str,
    rail_map: Path | None = None,
    **overrides: Any,
) -> AgentSettings:
    work.mkdir(parents=True, exist_ok=True)
    values: dict[str, Any] = {
        "service_url": service_url,
        "node_name": "n0",
        "sysfs_root": sysfs_root,
        "proc_root": work,
        "rail_map": rail_map,
        "spool_dir": work / "spool",
        "socket": short_socket_path(),
        "poll_interval_s": 0.1,
        "metrics_host": "127.0.0.1",
        "metrics_port": 0,
        "retry_max_backoff_s": 0.3,
        "command_wait_s": 1.0,
        "request_timeout_s": 2.0,
        "command_hold_s": 2.0,
    }
    values.update(overrides)
    return AgentSettings(**values)


class AgentThread:
    """One agent process's worth of work, in a thread with its own event loop."""

    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self.agent = Agent(settings)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._ready = threading.Event()

    def _main(self) -> None:
        async def go() -> None:
            self.loop = asyncio.get_running_loop()
            task = asyncio.create_task(self.agent.run())
            waiter = asyncio.create_task(self.agent.wait_ready())
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                waiter.cancel()
                await task  # failed at start: record the error before "ready"
            self._ready.set()
            await task

        try:
            asyncio.run(go())
        except BaseException as exc:  # surfaced to the test by stop()
            self.error = exc
        finally:
            self._ready.set()

    def start(self) -> AgentThread:
        self._thread.start()
        assert self._ready.wait(20), "agent did not become ready"
        if self.error is not None:
            raise self.error
        return self

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run fn on the agent's loop and return its result."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(_wrap(fn), self.loop).result(5)

    def stop(self) -> None:
        if self.loop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.agent.stop)
        # Generous: on a loaded 2-core machine shutdown drains the spool and closes
        # every plugin connection first.
        self._thread.join(45)
        assert not self._thread.is_alive(), f"agent did not stop; its tasks:\n{self._task_stacks()}"
        if self.error is not None:
            raise self.error

    def _task_stacks(self) -> str:
        """Where each task of the agent's loop waits (read from another thread: a diagnostic)."""
        if self.loop is None:
            return "(no loop)"
        out = io.StringIO()
        for task in list(asyncio.all_tasks(self.loop)):
            task.print_stack(limit=8, file=out)
        return out.getvalue()


async def _wrap(fn: Callable[[], Any]) -> Any:
    return fn()


@contextlib.contextmanager
def node_agents(
    built: Mapping[str, tuple[FixtureNode, Path]],
    work: Path,
    service_url: str,
    *,
    register_timeout_s: float,
    **overrides: Any,
) -> Iterator[dict[str, AgentThread]]:
    """One running agent per node of `built` (sysfs_node.build_cluster), each with its
    work directory under `work`; yields them once every one has registered its node, and
    stops every one on the way out, even when another fails to stop."""
    agents: dict[str, AgentThread] = {}
    with contextlib.ExitStack() as running:
        for name, (node, rail_map) in built.items():
            settings = settings_for(
                node.root, work / name, service_url, rail_map, node_name=name, **overrides
            )
            agents[name] = AgentThread(settings).start()
            running.callback(agents[name].stop)
        wait_for(
            "every agent to register its node",
            lambda: all(a.agent.registered for a in agents.values()),
            register_timeout_s,
            lambda: {n: a.agent.registered for n, a in agents.items()},
        )
        yield agents


@dataclass
class StandInState:
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: dict[str, dict[str, Any]] = field(default_factory=dict)
    event_order: list[str] = field(default_factory=list)
    posts: int = 0
    duplicates: int = 0
    commands: list[dict[str, Any]] = field(default_factory=list)
    delivered: set[int] = field(default_factory=set)
    acks: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    # Event ids the stand-in refuses with 422, to exercise dead-lettering.
    poison: set[str] = field(default_factory=set)
    # Respond 503 to the next N event posts.
    fail_next: int = 0
    # Event ids the stand-in breaks on: any batch holding one is answered 500, always.
    crash_on: set[str] = field(default_factory=set)
    # Respond 503 to the next N ack posts (each try of the agent's client counts).
    fail_acks: int = 0
    # While set and closed, an ack post waits (up to 10 s) for it to open: a slow service.
    ack_gate: threading.Event | None = None
    ack_posts: int = 0
    token: str | None = None
    lock: threading.Condition = field(default_factory=threading.Condition)


class StandInService:
    def __init__(self, port: int = 0, state: StandInState | None = None) -> None:
        self.state = state or StandInState()
        st = self.state

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _body(self) -> Any:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n)) if n else None

            def _send(self, code: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                # The agent may hang up on a long poll while it stops.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(data)

            def _authorised(self) -> bool:
                if st.token is None:
                    return True
                if self.headers.get("Authorization") == f"Bearer {st.token}":
                    return True
                self._send(401, {"error": "unauthorized", "detail": "bad token"})
                return False

            def do_PUT(self) -> None:
                body = self._body()
                if not self._authorised():
                    return
                parts = urlsplit(self.path).path.strip("/").split("/")
                if parts[:2] == ["v1", "nodes"] and len(parts) == 3:
                    with st.lock:
                        st.nodes[parts[2]] = body
                    self._send(200, {"name": parts[2], **body})
                else:
                    self._send(404, {"error": "not_found", "detail": self.path})

            def do_POST(self) -> None:
                body = self._body()
                if not self._authorised():
                    return
                parts = urlsplit(self.path).path.strip("/").split("/")
                if parts == ["v1", "events"]:
                    with st.lock:
                        st.posts += 1
                        if st.fail_next:
                            st.fail_next -= 1
                            self._send(503, {"error": "unavailable", "detail": "test"})
                            return
                        evs = body["events"]
                        if any(e["event_id"] in st.crash_on for e in evs):
                            self._send(500, {"error": "internal_error", "detail": "test"})
                            return
                        bad = [e["event_id"] for e in evs if e["event_id"] in st.poison]
                        if bad:
                            self._send(422, {"error": "invalid", "detail": f"events: {bad}"})
                            return
                        acc = dup = 0
                        for e in evs:
                            if e["event_id"] in st.events:
                                dup += 1
                            else:
                                acc += 1
                                st.events[e["event_id"]] = e
                                st.event_order.append(e["event_id"])
                        st.duplicates += dup
                        st.lock.notify_all()
                    self._send(202, {"accepted": acc, "duplicates": dup})
                elif parts[:2] == ["v1", "commands"] and parts[3:] == ["acks"]:
                    with st.lock:
                        st.ack_posts += 1
                        gate = st.ack_gate
                        st.lock.notify_all()
                    if gate is not None:
                        gate.wait(10)
                    with st.lock:
                        if st.fail_acks:
                            st.fail_acks -= 1
                            self._send(503, {"error": "unavailable", "detail": "test"})
                            return
                        st.acks.append((int(parts[2]), body))
                        st.delivered.add(int(parts[2]))
                        st.lock.notify_all()
                    self._send(200, {"ok": True})
                else:
                    self._send(404, {"error": "not_found", "detail": self.path})

            def do_GET(self) -> None:
                if not self._authorised():
                    return
                u = urlsplit(self.path)
                parts = u.path.strip("/").split("/")
                if parts[:2] == ["v1", "nodes"] and parts[3:] == ["commands"]:
                    wait_s = float(parse_qs(u.query).get("wait_s", ["0"])[0])
                    deadline = time.monotonic() + wait_s
                    with st.lock:
                        while True:
                            out = [c for c in st.commands if c["command_id"] not in st.delivered]
                            left = deadline - time.monotonic()
                            if out or left <= 0:
                                break
                            st.lock.wait(min(left, 0.2))
                    self._send(200, {"commands": out})
                else:
                    self._send(404, {"error": "not_found", "detail": self.path})

        # A port of its own below the ephemeral range (local.free_port): restarted on it,
        # the stand-in could otherwise find it taken by an agent's own retry connecting
        # from that very port (a TCP self-connect to the dead port).
        for attempt in range(20):
            try:
                bind = port or free_port()
                self._httpd = ThreadingHTTPServer(("127.0.0.1", bind), Handler)
                break
            except OSError:
                if port or attempt == 19:
                    raise
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def add_command(self, cmd: dict[str, Any]) -> None:
        with self.state.lock:
            self.state.commands.append(cmd)
            self.state.lock.notify_all()

    def wait_for(self, predicate: Any, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        with self.state.lock:
            while not predicate(self.state):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.state.lock.wait(min(left, 0.05))
        return True
