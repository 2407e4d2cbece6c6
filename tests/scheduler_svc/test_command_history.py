"""A decision reads the commands it needs, not the job's history of them.

A job's life leaves a row per node at every switch point it went through (a month of an
8,000-rank job is hundreds of thousands). A new fault's pass must find the
communicator's next epoch and any fail-back still on its way without loading those
rows: here a job with 200 settled switch points behind it decides a fault, and the
Command rows the service loads while it does are counted.
"""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
from sqlalchemy import event as orm_event

from scheduler_svc.config import Settings
from scheduler_svc.store import models as m
from scheduler_svc.store.db import make_engine, make_sessionmaker
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
