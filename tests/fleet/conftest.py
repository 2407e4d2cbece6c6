"""Loopback stand-ins for what the fleet module talks to: a webhook receiver and an API server."""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kubernetes
import kubernetes_validate
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from railover_testing.waiting import wait_for
from scheduler_svc.fleet.signing import SIGNATURE_HEADER, verify
from scheduler_svc.store.db import make_sessionmaker


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return make_sessionmaker(engine)


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
        def enough() -> list[Received]:
            got = self.accepted()
            return got if len({r.event["id"] for r in got}) >= n else []

        return wait_for(f"the receiver to accept {n} events", enough, timeout_s, self.accepted)

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
    status: int = 0


# The kubernetes client's major version is the Kubernetes minor it was generated for.
KUBE_VERSION = f"1.{kubernetes.__version__.split('.')[0]}.0"
SMP = "application/strategic-merge-patch+json"
_RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_TIME_FIELDS = {"lastHeartbeatTime", "lastTransitionTime", "timeAdded", "firstTimestamp"}
_TIME_FIELDS |= {"lastTimestamp", "eventTime", "creationTimestamp"}


class Invalid(Exception):
    """What the API server answers 422 Invalid for."""


def _server_rules(obj: Any, where: str = "") -> None:
    """Checks the API server makes that the OpenAPI schema does not carry (enums, formats)."""
    if isinstance(obj, list):
        for i, item in enumerate(obj):
            _server_rules(item, f"{where}[{i}]")
        return
    if not isinstance(obj, dict):
        return
    for key, value in obj.items():
        if key in _TIME_FIELDS and value is not None and not _RFC3339.match(str(value)):
            raise Invalid(f"{where}.{key}: {value!r} is not an RFC 3339 time")
        _server_rules(value, f"{where}.{key}")
    if where.endswith(("taints]", "taints")) or "taints[" in where:
        if obj.get("effect") not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise Invalid(f"{where}.effect: Unsupported value: {obj.get('effect')!r}")
        if not _LABEL_VALUE.match(str(obj.get("value") or "")):
            raise Invalid(f"{where}.value: {obj.get('value')!r} is not a label value")


def validate(obj: dict[str, Any]) -> None:
    """The whole object, strictly (unknown fields refused), as the API server would."""
    try:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise Invalid(exc.message) from exc
    _server_rules(obj)
    if obj["kind"] == "Event":
        if obj.get("type") not in ("Normal", "Warning"):
            raise Invalid(f"type: Unsupported value: {obj.get('type')!r}")
        if not _SUBDOMAIN.match(obj["metadata"]["name"]) or len(obj["metadata"]["name"]) > 253:
            raise Invalid(f"metadata.name: {obj['metadata']['name']!r} is not a DNS subdomain")


def _without_directives(patch: Any) -> Any:
    """A patch as the partial object it describes: `$patch` entries and null deletions out."""
    if isinstance(patch, dict):
        return {
            k: _without_directives(v)
            for k, v in patch.items()
            if v is not None and not k.startswith("$")
        }
    if isinstance(patch, list):
        return [
            _without_directives(v)
            for v in patch
            if not (isinstance(v, dict) and v.get("$patch") == "delete")
        ]
    return patch


def strategic_merge(target: dict[str, Any], patch: dict[str, Any], path: str = "") -> None:
    """Strategic merge as Node needs it: status.conditions merge by `type`, other lists
    (spec.taints has no patch strategy) are replaced, null deletes a key."""
    for key, value in patch.items():
        here = f"{path}.{key}"
        if value is None:
            target.pop(key, None)
        elif here == ".status.conditions":
            merged = {c["type"]: c for c in target.get(key, [])}
            for c in value:
                if c.get("$patch") == "delete":
                    merged.pop(c["type"], None)
                else:
                    merged[c["type"]] = {**merged.get(c["type"], {}), **c}
            target[key] = list(merged.values())
        elif isinstance(value, dict):
            strategic_merge(target.setdefault(key, {}), value, here)
        else:
            target[key] = value


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
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
    """An API server for the calls Railover makes: Nodes and their status, core/v1 Events.

    It keeps real objects, applies patches the way the API server does, validates every
    object and patch against the OpenAPI schema of KUBE_VERSION and answers like the API
    server: 422 Invalid (the object unchanged), 409 Conflict for a stale
    resourceVersion, 409 AlreadyExists for an Event name taken, 415 for a patch type
    it does not take, 404 NotFound. Every call is recorded with the status answered.
    """

    url: str = ""
    calls: list[ApiCall] = field(default_factory=list)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    version: int = 41
    lock: threading.Lock = field(default_factory=threading.Lock)
    # A change made "by someone else" right after the next GET, to provoke a Conflict.
    interfere_once: Callable[[dict[str, Any]], None] | None = None

    def add_node(self, name: str, taints: list[dict[str, Any]] | None = None) -> None:
        node: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {"taints": list(taints or [])},
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "lastHeartbeatTime": "2026-11-29T11:00:00Z",
                        "lastTransitionTime": "2026-11-29T11:00:00Z",
                    }
                ]
            },
        }
        self._bump(node)
        validate(node)
        self.nodes[name] = node

    def _bump(self, obj: dict[str, Any]) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)

    def node(self, name: str) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.nodes[name])

    def condition(self, name: str, type_: str) -> dict[str, Any] | None:
        found = [c for c in self.node(name)["status"].get("conditions", []) if c["type"] == type_]
        return found[0] if found else None

    def refused(self) -> list[ApiCall]:
        return [c for c in self.calls if c.status >= 400 and c.status != 409]

    def handle(self, method: str, path: str, ctype: str | None, body: Any) -> tuple[int, Any]:
        with self.lock:
            try:
                return self._handle(method, path, ctype, body)
            except Invalid as exc:
                return 422, _status(422, "Invalid", str(exc))

    def _handle(self, method: str, path: str, ctype: str | None, body: Any) -> tuple[int, Any]:
        parts = path.split("?", maxsplit=1)[0].strip("/").split("/")
        if parts[:3] == ["api", "v1", "nodes"] and len(parts) in (4, 5):
            name = parts[3]
            if name not in self.nodes:
                return 404, _status(404, "NotFound", f'nodes "{name}" not found')
            node = self.nodes[name]
            if method == "GET" and len(parts) == 4:
                answer = copy.deepcopy(node)
                if self.interfere_once is not None:
                    self.interfere_once(node)
                    self._bump(node)
                    self.interfere_once = None
                return 200, answer
            if method == "PATCH":
                if ctype != SMP:
                    return 415, _status(415, "UnsupportedMediaType", f"{ctype} not taken here")
                return self._patch(node, body, status=len(parts) == 5 and parts[4] == "status")
        if (
            method == "POST"
            and len(parts) == 5
            and parts[:3] == ["api", "v1", "namespaces"]
            and parts[4] == "events"
        ):
            validate(body)
            ns = parts[3]
            if body["metadata"].get("namespace", ns) != ns:
                raise Invalid("metadata.namespace does not match the request's namespace")
            key = (ns, body["metadata"]["name"])
            if key in self.events:
                return 409, _status(409, "AlreadyExists", f'events "{key[1]}" already exists')
            stored = copy.deepcopy(body)
            stored["metadata"]["namespace"] = ns
            self._bump(stored)
            self.events[key] = stored
            return 201, stored
        return 404, _status(404, "NotFound", f"{method} {path} is not served here")

    def _patch(self, node: dict[str, Any], patch: Any, *, status: bool) -> tuple[int, Any]:
        if not isinstance(patch, dict):
            raise Invalid("a strategic merge patch is a JSON object")
        partial = _without_directives(patch)
        validate({"apiVersion": "v1", "kind": "Node", **partial})
        # As the API server does: the status subresource changes status only, the main
        # resource everything but status.
        if status and set(patch) - {"status", "metadata"}:
            raise Invalid(
                f"nodes/status takes status only, not {sorted(set(patch) - {'status', 'metadata'})}"
            )
        if not status and "status" in patch:
            raise Invalid("status is changed through nodes/status")
        wanted = patch.get("metadata", {}).get("resourceVersion")
        if wanted is not None and wanted != node["metadata"]["resourceVersion"]:
            name = node["metadata"]["name"]
            return 409, _status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on nodes "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
            )
        result = copy.deepcopy(node)
        patch = copy.deepcopy(patch)
        patch.get("metadata", {}).pop("resourceVersion", None)
        strategic_merge(result, patch)
        validate(result)
        self._bump(result)
        node.clear()
        node.update(result)
        return 200, copy.deepcopy(node)


@pytest.fixture
def k8s() -> Iterator[K8sStandIn]:
    api = K8sStandIn()
    for name in ("n0", "n1", "n2", "n3", "n7"):
        api.add_node(
            name, taints=[{"key": "gpu.example/maintenance", "effect": "PreferNoSchedule"}]
        )

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length)) if length else None
            call = ApiCall(self.command, self.path, self.headers.get("Content-Type"), body)
            status, payload = api.handle(call.method, call.path, call.content_type, body)
            call.status = status
            api.calls.append(call)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._serve()

        def do_PATCH(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def log_message(self, *_: Any) -> None:
            pass

    server, api.url = _serve(Handler)
    yield api
    server.shutdown()
