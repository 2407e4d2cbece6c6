"""The statements of the busiest requests are built once, and only those that load
objects go through the ORM's execute (issue 33, and the twin's polls and
acknowledgements of issue 29).

Building a SQLAlchemy statement (its clauses, then its cache key) took longer than
SQLite took to run it, so the store keeps those of a poll, an acknowledgement and a
fault report as module statements with bound parameters. Here every statement built
while the service answers such a request is counted, in this process, by wrapping
the constructors: none of them builds one.

`Session.execute` costs a column select twice what the session's connection does, and
an UPDATE of a mapped class seven times (its bulk-update path), so column reads and
Core writes go to the connection (`store/plain.py`); each statement the session's own
execute runs for these requests is listed here.
"""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine
from sqlalchemy import event as sa_event
from sqlalchemy.orm import ORMExecuteState, Session
from sqlalchemy.sql import dml, selectable

from tests.scheduler_svc.helpers import event, job_body, register_nodes

BUILT = (selectable.Select, dml.Insert, dml.Update, dml.Delete)


def under_a_route(stack: Iterable[traceback.FrameSummary]) -> bool:
    """Whether a route of the service is on the stack: the coordinator's sweeps and the
    outbox worker run beside the requests, and are not counted."""
    return any("scheduler_svc/api/" in f.filename for f in stack)


def warmed(http: httpx.Client, rounds: int = 1) -> None:
    """A job on nodes a and b, and `rounds` of a report, a poll and an acknowledgement on
    one node and the next: the ORM builds and compiles each table's INSERT, and an UPDATE
    for each set of columns changed, on its first flush in the process, and keeps them."""
    register_nodes(http, ["a", "b"])
    assert http.post("/v1/jobs", json=job_body("j", ["a", "b"])).status_code == 201
    for node, device, after_s in (("a", "mlx5_0", 2400), ("b", "mlx5_2", 2401))[:rounds]:
        report(http, node, device, after_s)
        ack(http, node, poll(http, node))


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
            if under_a_route(stack):
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
    warmed(http)
    with built(monkeypatch) as seen:
        report(http, "b", "mlx5_2", 2401)
    assert seen == Counter()
    with built(monkeypatch) as seen:
        command = poll(http, "b")
    assert seen == Counter()
    with built(monkeypatch) as seen:
        ack(http, "b", command)
    assert seen == Counter()


@contextmanager
def through_the_orm() -> Iterator[list[str]]:
    """Each statement the ORM's execute ran meanwhile under a route: the mapped class's
    name for a load of objects, else the statement's text."""
    seen: list[str] = []

    def executed(state: ORMExecuteState) -> None:
        if not under_a_route(traceback.extract_stack()):
            return
        described = getattr(state.statement, "column_descriptions", [])
        loaded = [d["type"].__name__ for d in described if d.get("type") is d.get("entity")]
        whole = state.is_select and loaded and len(loaded) == len(described)
        seen.append(" ".join(loaded) if whole else " ".join(str(state.statement).split()))

    sa_event.listen(Session, "do_orm_execute", executed)
    try:
        yield seen
    finally:
        sa_event.remove(Session, "do_orm_execute", executed)


def test_only_reads_of_objects_go_through_the_orms_execute(http: httpx.Client) -> None:
    """A report, a poll and an acknowledgement: what the session's own execute runs is a
    load of objects the request changes or hands on, each named here; every column
    read and every Core write goes to the connection."""
    warmed(http)
    with through_the_orm() as seen:
        report(http, "b", "mlx5_2", 2401)
    # The open fault on the part (make_room), the job under its lock, its newest
    # checkpoint, its communicators, then the commands it supersedes.
    assert seen == ["Fault", "Job", "Checkpoint", "Communicator", "Command"]
    with through_the_orm() as seen:
        command = poll(http, "b")
    assert seen == ["Command"]  # the commands it takes
    with through_the_orm() as seen:
        ack(http, "b", command)
    assert seen == ["Command", "Fault"]  # the command, and the node's unreachability


@contextmanager
def compiled_anew() -> Iterator[list[str]]:
    """Each statement sent meanwhile under a route that SQLAlchemy compiled rather than
    took from its cache (a miss, or a statement with no cache key), but for transaction
    control."""
    seen: list[str] = []

    def sent(*args: Any) -> None:  # before_cursor_execute(conn, cursor, sql, params, ctx, many)
        if not under_a_route(traceback.extract_stack()):
            return
        sql, context = args[2], args[4]
        hit = getattr(context, "cache_hit", None)
        control = sql.split()[0].upper() in {"BEGIN", "SAVEPOINT", "RELEASE", "ROLLBACK"}
        if hit is not None and hit.name in {"CACHE_MISS", "NO_CACHE_KEY"} and not control:
            seen.append(" ".join(sql.split())[:120])

    sa_event.listen(Engine, "before_cursor_execute", sent)
    try:
        yield seen
    finally:
        sa_event.remove(Engine, "before_cursor_execute", sent)


def test_every_statement_of_a_poll_an_ack_and_a_report_is_compiled_once(
    http: httpx.Client,
) -> None:
    """SQLAlchemy's dialect-specific ON CONFLICT inserts have no cache key and were
    compiled anew for every report (278 us a fault on SQLite); every statement these
    requests send comes compiled from the cache once each has run (the ORM compiles
    its flush's UPDATE once per set of columns changed: two rounds warm them)."""
    warmed(http, rounds=2)
    with compiled_anew() as seen:
        report(http, "a", "mlx5_4", 2402)
        ack(http, "a", poll(http, "a"))
    assert seen == []
