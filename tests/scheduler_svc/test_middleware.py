"""The service's ASGI middleware over real HTTP: request timing, the body limit, the audit.

Each is pure ASGI (main.py installs them); these pin what the answer, the metric and
the audit log show, whatever the middleware is built on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Response
from prometheus_client import REGISTRY
from sqlalchemy import event
from sqlalchemy.engine import Engine

from railover_testing.cluster_shapes import hgx_node
from railover_testing.local import served_app
from scheduler_svc.config import Settings
from scheduler_svc.main import create_app

SAMPLE = "railover_http_request_duration_seconds_count"


@contextmanager
def serving(app: FastAPI) -> Iterator[httpx.Client]:
    with served_app(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def make_app(settings: Settings) -> FastAPI:
    app = create_app(settings.model_copy(update={"host": "127.0.0.1", "max_body_bytes": 1024}))

    def boom() -> None:
        raise RuntimeError("route failed")

    app.add_api_route("/v1/boom", boom, methods=["POST"])
    return app


@pytest.fixture
def http(settings: Settings) -> Iterator[httpx.Client]:
    with serving(make_app(settings)) as client:
        yield client


def timed(method: str, route: str, status: int) -> float:
    labels = {"method": method, "route": route, "status": str(status)}
    return REGISTRY.get_sample_value(SAMPLE, labels) or 0.0


def audit(http: httpx.Client) -> list[tuple[str, str, int, str | None]]:
    entries = http.get("/v1/audit", params={"limit": 50}).json()["entries"]
    return [(e["method"], e["path"], e["status"], e["operation"]) for e in entries]


def test_requests_are_timed_by_route_template_and_status(http: httpx.Client) -> None:
    before = {
        "node": timed("GET", "/v1/nodes/{node}", 404),
        "jobs": timed("GET", "/v1/jobs", 200),
        "unmatched": timed("GET", "unmatched", 404),
        "health": timed("GET", "/healthz", 200),
    }
    assert http.get("/v1/nodes/nowhere").status_code == 404
    assert http.get("/v1/jobs").status_code == 200
    assert http.get("/v1/jobs").status_code == 200
    assert http.get("/no/such/route").status_code == 404
    assert http.get("/healthz").status_code == 200
    assert http.get("/metrics").status_code == 200
    assert timed("GET", "/v1/nodes/{node}", 404) == before["node"] + 1
    assert timed("GET", "/v1/jobs", 200) == before["jobs"] + 2
    assert timed("GET", "unmatched", 404) == before["unmatched"] + 1
    # Probes and scrapes are not counted (nor are they under any other name).
    assert timed("GET", "/healthz", 200) == before["health"] == 0.0
    assert not {"/healthz", "/readyz", "/metrics"} & routes_timed()


def routes_timed() -> set[str]:
    return {
        sample.labels["route"]
        for metric in REGISTRY.collect()
        if metric.name == "railover_http_request_duration_seconds"
        for sample in metric.samples
        if "route" in sample.labels
    }


def chunks(body: bytes, size: int = 100) -> Iterator[bytes]:
    """A body httpx sends chunked, with no Content-Length."""
    for start in range(0, len(body), size):
        yield body[start : start + size]


def test_body_limit_declared_and_streamed(http: httpx.Client) -> None:
    node = json.dumps(hgx_node()).encode()
    assert len(node) > 1024, "the node body must exceed the limit for this test"
    small = json.dumps({"gpus": [], "rnics": []}).encode()
    refused_before = timed("PUT", "unmatched", 413)

    # Declared too large: refused before the body is read, unparsed.
    r = http.put("/v1/nodes/n0", content=node, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["fields"][0]["field"] == "body", r.text
    # Streamed too large: read and counted, then refused the same way.
    r = http.put("/v1/nodes/n0", content=chunks(node), headers={"Content-Type": "application/json"})
    assert "content-length" not in r.request.headers
    assert r.status_code == 413 and r.json()["error"] == "too_large", r.text
    assert http.get("/v1/nodes/n0").status_code == 404
    # Streamed within the limit: the route reads the whole body as it was sent.
    r = http.put(
        "/v1/nodes/n1", content=chunks(small, 7), headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 200, r.text
    assert http.get("/v1/nodes/n1").json()["name"] == "n1"
    # Refused by the limit, no route ran: timed as unmatched, not audited.
    assert timed("PUT", "unmatched", 413) == refused_before + 2
    assert audit(http) == [("PUT", "/v1/nodes/n1", 200, "register_node")]


def test_writes_are_audited_before_the_answer_and_reads_are_not(http: httpx.Client) -> None:
    assert http.get("/v1/nodes").status_code == 200
    r = http.put("/v1/nodes/n0", json={"gpus": [], "rnics": []})
    assert r.status_code == 200
    # Refused writes are audited too, with their status.
    assert http.put("/v1/nodes/n0", json={"gpus": "x"}).status_code == 422
    assert http.post("/v1/deliveries/999/replay").status_code == 404
    # A write that raises is answered 500 by the outer handler, and not audited.
    # Connection: close, as uvicorn drops the connection after an exception escaped the
    # app, and a next request sent on it first could meet the reset.
    r = http.post("/v1/boom", headers={"Connection": "close"})
    assert r.status_code == 500 and r.json()["error"] == "internal_error"
    assert audit(http) == [
        ("POST", "/v1/deliveries/999/replay", 404, "replay_delivery"),
        ("PUT", "/v1/nodes/n0", 422, "register_node"),
        ("PUT", "/v1/nodes/n0", 200, "register_node"),
    ]


def test_an_audit_failure_leaves_the_answer_alone(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry written apart from the request's change (here a refused write's) that cannot
    be written leaves the answer as it was."""
    from scheduler_svc.fleet import service

    def broken(*_: Any) -> None:
        raise RuntimeError("audit store gone")

    monkeypatch.setattr(service, "_write_audit", broken)
    with serving(make_app(settings)) as http:
        r = http.put("/v1/nodes/n0", json={"gpus": "x"})
        assert r.status_code == 422, r.text
        assert http.get("/v1/nodes/n0").status_code == 404
        assert audit(http) == []


def test_a_committed_change_and_its_audit_entry_are_one_commit(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write whose route commits its change carries its audit entry in that commit: the
    separate path is not taken (it is broken here), and the store sees one commit."""
    from scheduler_svc.fleet import service

    def broken(*_: Any) -> None:
        raise AssertionError("written apart from its change")

    monkeypatch.setattr(service, "_write_audit", broken)
    commits: list[object] = []

    def committed(conn: object) -> None:
        commits.append(conn)

    with serving(make_app(settings)) as http:
        event.listen(Engine, "commit", committed)
        try:
            r = http.put("/v1/nodes/n0", json={"gpus": [], "rnics": []})
        finally:
            event.remove(Engine, "commit", committed)
        assert r.status_code == 200, r.text
        assert len(commits) == 1
        assert audit(http) == [("PUT", "/v1/nodes/n0", 200, "register_node")]
        (written,) = http.get("/v1/audit").json()["entries"]
        assert written["client"] == "127.0.0.1" and written["count"] == 1
        assert datetime.fromisoformat(written["at"]) <= datetime.now(UTC)


def test_the_status_recorded_with_the_change_is_the_one_answered() -> None:
    """A Response the route returns, else one it set on its `response`, else its declared."""
    from scheduler_svc.api.routing import answering_status

    set_on = Response()
    set_on.status_code = 200
    assert answering_status(Response(status_code=204), set_on, 201) == 204
    assert answering_status({"created": False}, set_on, 201) == 200
    untouched = Response()  # as FastAPI makes the `response` it passes: no status set
    untouched.status_code = None  # type: ignore[assignment]
    assert answering_status({"created": True}, untouched, 201) == 201
    assert answering_status({"created": True}, None, 202) == 202


def test_a_long_path_is_audited_cut_to_its_column(http: httpx.Client) -> None:
    """The path column holds 512 characters: a longer path is kept cut to them (PostgreSQL
    would refuse the row, and the entry would be lost)."""
    long = "/v1/nodes/" + "n" * 600
    assert http.put(long, json={"gpus": [], "rnics": []}).status_code == 422
    (entry,) = http.get("/v1/audit").json()["entries"]
    assert entry["path"] == long[:512]


def test_a_report_and_its_audit_entry_are_one_commit(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent's report carries its audit entry in the group commit of its evidence (the
    separate path is broken here), and a refused report is still written apart."""
    from scheduler_svc.fleet import service

    app = create_app(settings.model_copy(update={"host": "127.0.0.1"}))
    with serving(app) as http:
        assert http.put("/v1/nodes/n0", json=hgx_node()).status_code == 200
        report = {
            "event_id": "e-1",
            "node": "n0",
            "kind": "port_down",
            "device": "mlx5_0",
            "port": 1,
            "observed_at": datetime.now(UTC).isoformat(),
        }
        with monkeypatch.context() as patched, Transactions() as seen:
            patched.setattr(service, "_write_audit", _written_apart)
            r = http.post("/v1/events", json={"events": [report]})
        assert r.status_code == 202, r.text
        assert r.json()["faults_opened"] == 1
        writing = [t for t in seen.committed if "audit_log" in t or "events" in t]
        # One commit: the report, the evidence's stamp it moves on, its entry.
        assert writing == [{"events", "faults", "evidence_stamp", "audit_log"}]
        unknown = {**report, "event_id": "e-2", "node": "n9"}
        assert http.post("/v1/events", json={"events": [unknown]}).status_code == 404
        assert audit(http)[:2] == [
            ("POST", "/v1/events", 404, "post_events"),
            ("POST", "/v1/events", 202, "post_events"),
        ]


def _written_apart(*_: Any) -> None:
    raise AssertionError("written apart from its change")


class Transactions:
    """The tables each committed transaction inserted into, on every engine of this process
    (a background loop's commits that insert nothing show as empty sets)."""

    def __init__(self) -> None:
        self.committed: list[set[str]] = []
        self._open: dict[int, set[str]] = {}

    def _statement(self, conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.startswith("INSERT INTO "):
            self._open.setdefault(id(conn), set()).add(statement.split()[2])

    def _commit(self, conn: Any) -> None:
        self.committed.append(self._open.pop(id(conn), set()))

    def __enter__(self) -> Transactions:
        event.listen(Engine, "before_cursor_execute", self._statement)
        event.listen(Engine, "commit", self._commit)
        return self

    def __exit__(self, *_: object) -> None:
        event.remove(Engine, "before_cursor_execute", self._statement)
        event.remove(Engine, "commit", self._commit)
