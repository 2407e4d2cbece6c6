"""The statements of the busiest requests are built once (issue 33, and the twin's
polls and acknowledgements of issue 29).

Building a SQLAlchemy statement (its clauses, then its cache key) took longer than
SQLite took to run it, so the store keeps those of a poll, an acknowledgement and a
fault report as module statements with bound parameters. Here every statement built
while the service answers such a request is counted, in this process, by wrapping
the constructors: none of them builds one.
"""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from sqlalchemy.sql import dml, selectable

from tests.scheduler_svc.helpers import event, job_body, register_nodes

BUILT = (selectable.Select, dml.Insert, dml.Update, dml.Delete)


@contextmanager
def built(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Each statement built meanwhile under a route of the service, by where it was built
    (not the coordinator's sweeps nor the outbox worker, which run beside the requests)."""
    seen: Counter[str] = Counter()
    on = [True]
    for cls in BUILT:
        real = cls.__init__

        def init(
            self: Any, *args: Any, _real: Any = real, _kind: str = cls.__name__, **kw: Any
        ) -> None:
            stack = traceback.extract_stack()[:-1] if on[0] else []
            if any("scheduler_svc/api/" in f.filename for f in stack):
                ours = [f for f in stack if "scheduler_svc" in f.filename]
                seen[f"{_kind} in {ours[-1].name}"] += 1
            _real(self, *args, **kw)

        monkeypatch.setattr(cls, "__init__", init)
    try:
        yield seen
    finally:
        on[0] = False


def poll(http: httpx.Client, node: str) -> dict[str, Any]:
    polled = http.get(f"/v1/nodes/{node}/commands")
    assert polled.status_code == 200 and polled.json()["commands"], polled.text
    return dict(polled.json()["commands"][0])


def ack(http: httpx.Client, node: str, command: dict[str, Any]) -> None:
    body = {"node": node, "status": "applied"}
    acked = http.post(f"/v1/commands/{command['command_id']}/acks", json=body)
    assert acked.status_code == 200, acked.text


def report(http: httpx.Client, node: str, device: str, after_s: float) -> None:
    r = http.post("/v1/events", json={"events": [event(node, device=device, after_s=after_s)]})
    assert r.status_code == 202 and len(r.json()["decisions"]) == 1, r.text


def test_a_poll_an_ack_and_a_report_build_no_statement_of_their_own(
    http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_nodes(http, ["a", "b"])
    assert http.post("/v1/jobs", json=job_body("j", ["a", "b"])).status_code == 201
    # A first round: the ORM builds each table's INSERT, UPDATE and DELETE on its first
    # flush in the process, and keeps them.
    report(http, "a", "mlx5_0", 2400)
    ack(http, "a", poll(http, "a"))
    with built(monkeypatch) as seen:
        report(http, "b", "mlx5_2", 2401)
    assert seen == Counter()
    with built(monkeypatch) as seen:
        command = poll(http, "b")
    assert seen == Counter()
    with built(monkeypatch) as seen:
        ack(http, "b", command)
    assert seen == Counter()
