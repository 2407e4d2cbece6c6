"""The command stream: one server-sent-event response per agent that stays open.

Read here line by line off the wire (httpx's raw lines, parsed by this file's own
reader, not the agent's httpx-sse), so the format is checked as bytes: `event:`,
`id:`, one `data:` line of JSON, a blank line; and `: keepalive` comments. Each
stream asks for a heartbeat the test can count, and an age it never reaches
unless the test is about the age.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.exc import OperationalError

from railover_testing.waiting import wait_until
from scheduler_svc import metrics
from scheduler_svc.api import commands as commands_api
from scheduler_svc.config import Settings
from scheduler_svc.main import create_app
from scheduler_svc.services.delivery import CommandNotifier
from tests.scheduler_svc.helpers import event, job_body, register_nodes
from tests.scheduler_svc.test_ack_node_scope import tokens  # noqa: F401
from tests.scheduler_svc.test_delivery import serve
from tests.scheduler_svc.test_listen import NO_RECHECK_S, WOKEN_WITHIN_S, looks  # noqa: F401

# A stream's age in these tests unless the test is about it: never reached.
NEVER_S = 3600.0


class Stream:
    """One stream read in a thread: what came, in order, as (kind, id, data)."""

    def __init__(self, url: str, node: str, headers: dict[str, str] | None = None, **params: Any):
        self.items: list[tuple[str, int | None, Any]] = []
        self.status: int | None = None
        self.content_type = ""
        self.error: str | None = None
        self._changed = threading.Condition()
        self._client = httpx.Client(base_url=url, headers=headers or {}, timeout=NO_RECHECK_S)
        self._args = (f"/v1/nodes/{node}/commands/stream", params)
        self._sock: socket.socket | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        path, params = self._args
        try:
            with self._client.stream("GET", path, params=params) as resp:
                self.status, self.content_type = resp.status_code, resp.headers["content-type"]
                # Closing the client would not end a read blocked in another thread; shutting
                # the socket down does, as an agent that died would.
                self._sock = resp.extensions["network_stream"].get_extra_info("socket")
                if resp.status_code != 200:
                    resp.read()
                    self._add(("refused", None, resp.json()))
                    return
                fields: dict[str, str] = {}
                for line in resp.iter_lines():
                    if line == ": keepalive":
                        self._add(("keepalive", None, None))
                    elif line:
                        name, _, value = line.partition(": ")
                        assert name in ("event", "id", "data") and name not in fields, line
                        fields[name] = value
                    elif fields:  # a blank line ends an event
                        ident = int(fields["id"]) if "id" in fields else None
                        self._add((fields["event"], ident, json.loads(fields["data"])))
                        fields = {}
        except httpx.HTTPError as exc:  # the test closed it, or the service went away
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            with self._changed:
                self._changed.notify_all()

    def _add(self, item: tuple[str, int | None, Any]) -> None:
        with self._changed:
            self.items.append(item)
            self._changed.notify_all()

    def kinds(self) -> list[str]:
        return [k for k, _, _ in self.items]

    def wait(self, what: str, pred: Any, timeout: float = WOKEN_WITHIN_S) -> None:
        with self._changed:
            ok = self._changed.wait_for(lambda: pred(self), timeout)
        assert ok, f"{what}: the stream had {self.items} (error {self.error})"

    def ended(self) -> bool:
        return not self._thread.is_alive()

    def close(self) -> None:
        if self._sock is not None and not self.ended():
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(30)
        assert self.ended(), "the stream's reader did not end"
        self._client.close()


@contextmanager
def stream(url: str, node: str, **kw: Any) -> Iterator[Stream]:
    s = Stream(url, node, **kw)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def app(settings: Settings) -> FastAPI:
    # Nobody acknowledges here: no re-issue of an unacknowledged command may come meanwhile.
    update = {"commands_stream_max_s": NEVER_S, "command_ack_timeout_s": NEVER_S}
    return create_app(settings.model_copy(update=update))


def listening(app: FastAPI) -> bool:
    """Every commit reaches this replica (watermark read or LISTEN in effect)."""
    notifier: CommandNotifier = app.state.notifier
    return notifier.listening


def setup_job(http: httpx.Client) -> None:
    register_nodes(http, ["n0", "n1"])
    assert http.post("/v1/jobs", json=job_body("j1", ["n0", "n1"])).status_code == 201


def fault_on_n1(http: httpx.Client) -> None:
    r = http.post("/v1/events", json={"events": [event("n1", device="mlx5_6", after_s=3000)]})
    assert r.status_code == 202, r.text


def commands(s: Stream) -> list[tuple[int | None, str, list[int], str]]:
    return [(i, d["kind"], d["ranks"], d["state"]) for k, i, d in s.items if k == "command"]


def test_a_command_is_sent_once_as_it_is_issued(app: FastAPI) -> None:
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        setup_job(http)
        with stream(url, "n1", heartbeat_s=NO_RECHECK_S) as s:
            s.wait("ready", lambda s: s.items)
            assert s.status == 200 and s.content_type.startswith("text/event-stream")
            (ready,) = s.items
            assert ready[:2] == ("ready", None)
            assert ready[2]["heartbeat_s"] == NO_RECHECK_S
            assert 0.9 * NEVER_S <= ready[2]["ends_in_s"] <= NEVER_S
            fault_on_n1(http)
            s.wait("the failover command", commands)
            (cmd,) = commands(s)
            assert cmd[1:] == ("failover", [14], "delivered")
            # The event's id is the command's, and the long-poll has nothing left to give.
            assert http.get("/v1/nodes/n1/commands").json() == {"commands": []}
            listed = http.get("/v1/jobs/j1/commands").json()
            ids = [c["command_id"] for c in listed["commands"] if c["node"] == "n1"]
            assert ids == [cmd[0]]
            assert s.kinds() == ["ready", "command"]  # once, and nothing else meanwhile
            assert not s.ended()


def test_a_quiet_stream_sends_keepalives_without_reading_the_store(
    app: FastAPI,
    looks: list[str],  # noqa: F811
) -> None:
    """While the watermark (SQLite) or LISTEN (PostgreSQL) holds, a heartbeat's end finds
    nothing unannounced to read: after the first look, none."""
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        register_nodes(http, ["n0"])
        assert wait_until(lambda: listening(app), timeout=30)
        with stream(url, "n0", heartbeat_s=1, include_unacked="false") as s:
            s.wait("three keepalives", lambda s: s.kinds().count("keepalive") >= 3, 60)
            assert s.kinds()[:4] == ["ready", "keepalive", "keepalive", "keepalive"]
    assert looks == ["n0"]


def test_a_stream_that_asks_for_unacked_commands_looks_for_them_once(
    app: FastAPI,
    looks: list[str],  # noqa: F811
) -> None:
    """The first look (with unacknowledged commands) leaves no empty look to skip on: the
    first heartbeat looks once more, and from then on none."""
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        register_nodes(http, ["n0"])
        assert wait_until(lambda: listening(app), timeout=30)
        with stream(url, "n0", heartbeat_s=1) as s:
            s.wait("three keepalives", lambda s: s.kinds().count("keepalive") >= 3, 60)
    assert looks == ["n0", "n0"]


def test_a_reconnect_is_sent_the_delivered_unacknowledged_commands_again(app: FastAPI) -> None:
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        setup_job(http)
        with stream(url, "n1", heartbeat_s=NO_RECHECK_S) as first:
            first.wait("ready", lambda s: s.items)
            fault_on_n1(http)
            first.wait("the failover command", commands)
        (sent,) = commands(first)
        # The first stream broke before an ack: the next one, by default, gets it again.
        with stream(url, "n1", heartbeat_s=NO_RECHECK_S) as again:
            again.wait("the command again", commands)
            assert commands(again) == [sent]
        # Asked without them, a stream sends only what is new: nothing here.
        with stream(url, "n1", heartbeat_s=1, include_unacked="false") as bare:
            bare.wait("a keepalive", lambda s: "keepalive" in s.kinds(), 60)
            assert commands(bare) == []
        # Acknowledged applied, it is sent to nobody again.
        ack = {"node": "n1", "status": "applied", "detail": ""}
        assert http.post(f"/v1/commands/{sent[0]}/acks", json=ack).status_code == 200
        with stream(url, "n1", heartbeat_s=1) as after:
            after.wait("a keepalive", lambda s: "keepalive" in s.kinds(), 60)
            assert commands(after) == []


def test_a_stream_ends_at_its_age(settings: Settings) -> None:
    app = create_app(settings.model_copy(update={"commands_stream_max_s": 1.0}))
    ended = metrics.COMMAND_STREAM_ENDS.labels("max_age")
    before = ended._value.get()
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        register_nodes(http, ["n0"])
        with stream(url, "n0", heartbeat_s=NO_RECHECK_S) as s:
            s.wait("the end", lambda s: s.ended(), 60)
            assert s.kinds() == ["ready", "end"]
            assert 0.9 <= s.items[0][2]["ends_in_s"] <= 1.0
            assert s.items[-1][2] == {"reason": "max_age"}
            assert s.error is None  # ended by the service, whole: not cut
    assert ended._value.get() == before + 1


def test_a_stopping_service_ends_its_streams_and_opens_none_to_wait(app: FastAPI) -> None:
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        register_nodes(http, ["n0", "n1"])
        with stream(url, "n0", heartbeat_s=NO_RECHECK_S) as s:
            s.wait("ready", lambda s: s.items)
            notifier: CommandNotifier = app.state.notifier
            notifier.close_threadsafe()
            s.wait("the end", lambda s: s.ended())
            assert s.kinds() == ["ready", "end"] and s.items[-1][2] == {"reason": "stopping"}
        with stream(url, "n1", heartbeat_s=NO_RECHECK_S) as late:
            late.wait("the end", lambda s: s.ended())
            assert late.kinds() == ["ready", "end"]
            assert late.items[-1][2] == {"reason": "stopping"}


def test_a_store_that_fails_mid_stream_ends_it_as_unavailable(
    app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = commands_api._take
    calls: list[str] = []

    def take(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[2])
        if len(calls) > 1:
            raise OperationalError("SELECT", {}, Exception("the store went away"))
        return real(*args, **kwargs)

    monkeypatch.setattr(commands_api, "_take", take)
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        register_nodes(http, ["n0"])
        with stream(url, "n0", heartbeat_s=NO_RECHECK_S) as s:
            s.wait("ready", lambda s: s.items)
            notifier: CommandNotifier = app.state.notifier
            notifier.notify_threadsafe(["n0"])  # woken: it looks, and the look fails
            s.wait("the end", lambda s: s.ended())
        assert s.kinds() == ["ready", "end"] and s.items[-1][2] == {"reason": "unavailable"}
        # At the start, the same failure is the long-poll's 503, not a stream.
        with stream(url, "n0") as refused:
            refused.wait("the answer", lambda s: s.ended())
        assert (refused.status, refused.items[0][2]["error"]) == (503, "unavailable")
    assert calls == ["n0", "n0", "n0"]


def test_a_client_that_leaves_closes_its_stream(app: FastAPI) -> None:
    gone = metrics.COMMAND_STREAM_ENDS.labels("client_gone")
    before = gone._value.get()
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        register_nodes(http, ["n0"])
        open_before = metrics.COMMAND_STREAMS._value.get()
        with stream(url, "n0", heartbeat_s=NO_RECHECK_S) as s:
            s.wait("ready", lambda s: s.items)
            assert metrics.COMMAND_STREAMS._value.get() == open_before + 1
        # Left while it waited (no heartbeat due for minutes): the service notices at once.
        assert wait_until(lambda: metrics.COMMAND_STREAMS._value.get() == open_before, 30)
        assert wait_until(lambda: gone._value.get() == before + 1, 30)


@pytest.mark.parametrize(
    ("who", "node", "status"), [("n0", "n1", 403), ("fleet", "n1", 200), (None, "n1", 401)]
)
def test_a_stream_is_an_agents_own_node_only(
    app: FastAPI,
    tokens: dict[str, str],  # noqa: F811
    who: str | None,
    node: str,
    status: int,
) -> None:
    headers = {"Authorization": f"Bearer {tokens[who]}"} if who else {}
    with serve(app) as url:
        with stream(url, node, headers=headers, heartbeat_s=NO_RECHECK_S) as s:
            s.wait("the answer", lambda s: s.items)
        assert s.status == status, s.items
        if status != 200:
            assert s.kinds() == ["refused"]
            assert s.content_type == "application/json"


@pytest.mark.parametrize(
    ("params", "field"),
    [({"heartbeat_s": 0.5}, "heartbeat_s"), ({"heartbeat_s": 301}, "heartbeat_s")],
)
def test_a_heartbeat_out_of_bounds_is_refused_by_name(
    app: FastAPI, params: dict[str, Any], field: str
) -> None:
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        r = http.get("/v1/nodes/n0/commands/stream", params=params)
        assert r.status_code == 422
        assert field in r.text
