"""A decision reads the commands it needs, not the job's history of them.

A job's life leaves a row per node at every switch point it went through (a month of an
8,000-rank job is hundreds of thousands). A new fault's pass must find the
communicator's next epoch and any fail-back still on its way without loading those
rows: here a job with 200 settled switch points behind it decides a fault, and the
Command rows the service loads while it does are counted.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import event as orm_event

from scheduler_svc.config import Settings
from scheduler_svc.store import models as m
from scheduler_svc.store.commands import CommandRepo
from scheduler_svc.store.db import make_engine, make_sessionmaker, upgrade
from tests.scheduler_svc.helpers import event, job_body, register_nodes

NODES = ["a", "b"]
HISTORY = 100  # switch points of each kind (failover, then fail-back), all settled


def settled_history(settings: Settings) -> None:
    """Switch points of the job's implicit communicator, each applied on both nodes."""
    now = datetime.now(UTC)
    db = make_engine(settings.db_url)
    try:
        with make_sessionmaker(db)() as s, s.begin():
            s.add_all(
                m.Command(
                    node=node,
                    job_id="j",
                    kind="failover" if epoch % 2 else "failback",
                    epoch=epoch,
                    comm_id=0,
                    ranks=[0] if node == "a" else [8],
                    state="applied",
                    created_at=now,
                    completed_at=now,
                    incarnation=1,
                )
                for epoch in range(1, 2 * HISTORY + 1)
                for node in NODES
            )
    finally:
        db.dispose()


def test_a_fault_after_a_long_history_loads_only_the_commands_it_issues(
    http: httpx.Client, settings: Settings
) -> None:
    register_nodes(http, NODES)
    assert http.post("/v1/jobs", json=job_body("j", NODES)).status_code == 201
    settled_history(settings)
    loaded: list[m.Command] = []

    def load(target: m.Command, _context: object) -> None:
        loaded.append(target)

    orm_event.listen(m.Command, "load", load)
    try:
        r = http.post("/v1/events", json={"events": [event("a", after_s=2400)]})
    finally:
        orm_event.remove(m.Command, "load", load)
    assert r.status_code == 202 and len(r.json()["decisions"]) == 1
    issued = http.get("/v1/jobs/j/commands", params={"state": "issued"}).json()["commands"]
    assert {(c["kind"], c["epoch"]) for c in issued} == {("failover", 2 * HISTORY + 1)}
    assert [c.epoch for c in loaded if c.epoch <= 2 * HISTORY] == []


def test_the_queries_for_live_commands_search_an_index_not_the_history(tmp_path: Path) -> None:
    """SQLite's plan for each query a pass or a sweep makes for commands: a search on an
    index that names the state or the switch point, never the job's rows walked one by
    one (`SEARCH commands USING INDEX ix_commands_job_id (job_id=?)`) nor the table
    scanned. The planner chooses without statistics here, as in a service's store."""
    url = f"sqlite:///{tmp_path / 'plans.db'}"
    upgrade(url)
    db = make_engine(url)
    sent: list[tuple[str, Any]] = []
    orm_event.listen(db, "before_cursor_execute", lambda *a: sent.append((a[2], a[3])))
    waiting = ["issued", "delivered"]
    try:
        with make_sessionmaker(db)() as s:
            repo = CommandRepo(s)
            repo.job_commands("j", ["failback"], waiting)
            repo.comm_commands("j", 0, ["failover", "failback"], waiting)
            repo.max_epoch("j", 0, ["failover"])
            repo.switch_points("j", "failback", {(0, 3), (1, 4)})
            repo.overdue_commands(datetime.now(UTC))
            repo.unacknowledged()
            queries = [(q, p) for q, p in sent if "FROM commands" in q]
            explain = s.connection().exec_driver_sql
            plans = [
                (q, " / ".join(r[3] for r in explain(f"EXPLAIN QUERY PLAN {q}", p)))
                for q, p in queries
            ]
    finally:
        db.dispose()
    assert len(plans) == 8  # two switch points, two queries; the gauges are two more
    for query, plan in plans:
        assert "SEARCH commands USING" in plan and "SCAN commands" not in plan, (query, plan)
        assert "(job_id=?)" not in plan, (query, plan)
        assert "state=?" in plan or "comm_id=?" in plan, (query, plan)
