"""Loopback stand-ins for what the fleet module talks to: a webhook receiver and a k8s API."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from railover_testing.agents import wait_until
from scheduler_svc.fleet.signing import SIGNATURE_HEADER, verify


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int
    at: float

    @property
    def event(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed


@dataclass
class Receiver:
    """Records every POST; answers 500 while `fail` says so (a callable of the event)."""

    url: str = ""
    requests: list[Received] = field(default_factory=list)
    fail: Callable[[dict[str, Any]], bool] = lambda _e: False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def accepted(self) -> list[Received]:
        with self.lock:
            return [r for r in self.requests if r.status == 200]

    def wait_for(self, n: int, timeout_s: float = 20.0) -> list[Received]:
        def enough() -> bool:
            return len({r.event["id"] for r in self.accepted()}) >= n

        if not wait_until(enough, timeout=timeout_s):
            raise AssertionError(f"receiver got {len(self.accepted())} events, wanted {n}")
        return self.accepted()

    def verify_all(self, secret: str) -> None:
        with self.lock:
            for r in self.requests:
                verify(secret, r.headers.get(SIGNATURE_HEADER.lower()), r.body)


def _serve(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            event = json.loads(body)
            status = 500 if rec.fail(event) else 200
            with rec.lock:
                rec.requests.append(
                    Received(
                        self.path,
                        {k.lower(): v for k, v in self.headers.items()},
                        body,
                        status,
                        time.monotonic(),
                    )
                )
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server, rec.url = _serve(Handler)
    yield rec
    server.shutdown()


@dataclass
class ApiCall:
    method: str
    path: str
    content_type: str | None
    body: Any
    status: int = 0  # what the stand-in answered


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    """A metav1.Status, the body the API server sends with an error."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


@dataclass
class K8sStandIn:
    """Answers the few calls Railover makes like an API server would, and records them."""

    url: str = ""
    calls: list[ApiCall] = field(default_factory=list)
    taints: list[dict[str, Any]] = field(default_factory=list)
    # Every write moves it on; a PATCH naming an older one is a 409 Conflict.
    resource_version: int = 42
    # Names already created, per collection: a second POST is a 409 AlreadyExists.
    created: set[tuple[str, str]] = field(default_factory=set)
    # Someone else writes the node right after each GET (a racing controller).
    racing_writer: bool = False

    def node(self, name: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "resourceVersion": str(self.resource_version)},
            "spec": {"taints": self.taints},
            "status": {},
        }


@pytest.fixture
def k8s() -> Iterator[K8sStandIn]:
    api = K8sStandIn(taints=[{"key": "gpu.example/maintenance", "effect": "PreferNoSchedule"}])

    class Handler(BaseHTTPRequestHandler):
        def _record(self) -> Any:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length)) if length else None
            api.calls.append(
                ApiCall(self.command, self.path, self.headers.get("Content-Type"), body)
            )
            return body

        def _answer(self, status: int, payload: Any) -> None:
            api.calls[-1].status = status
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._record()
            self._answer(200, api.node(self.path.rsplit("/", 1)[-1]))
            if api.racing_writer:
                api.resource_version += 1

        def do_PATCH(self) -> None:
            body = self._record()
            name = self.path.split("/")[4]
            wanted = (body.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and wanted != str(api.resource_version):
                message = (
                    f'Operation cannot be fulfilled on nodes "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again"
                )
                self._answer(409, _status(409, "Conflict", message))
                return
            api.resource_version += 1
            self._answer(200, api.node(name))

        def do_POST(self) -> None:
            body = self._record()
            collection = self.path.rsplit("/", 1)[-1]
            name = body["metadata"]["name"]
            if (collection, name) in api.created:
                message = f'{collection} "{name}" already exists'
                self._answer(409, _status(409, "AlreadyExists", message))
                return
            api.created.add((collection, name))
            self._answer(201, body)

        def log_message(self, *_: Any) -> None:
            pass

    server, api.url = _serve(Handler)
    yield api
    server.shutdown()
