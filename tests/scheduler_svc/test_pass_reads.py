"""A fault's pass asks the store once for each row it needs (issue 33: statements per report).

The pass reads the job's communicators and the open faults on its nodes; what it then
writes refers back to some of them: the decision's CloudEvent names its fault, and a
switch point takes its communicator's next epoch. Those come from the rows the same
transaction already read, not from one more SELECT each by primary key; the implicit
communicator of a job that registered none has no row to look for. Counted on the
service's engines (it runs in this process) with SQLAlchemy's cursor hook.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler_svc.config import Settings
from scheduler_svc.services import reconciler
from scheduler_svc.store import models as m
from scheduler_svc.store import uow
from scheduler_svc.store.db import make_engine, make_sessionmaker
from tests.scheduler_svc.helpers import event, job_body, register_nodes
from tests.sql_statements import statements

NODES = ["a", "b"]
# What `session.get` sends for a fault or a communicator not in the identity map.
BY_PRIMARY_KEY = re.compile(
    r"FROM (faults WHERE faults\.id = |"
    r"communicators WHERE communicators\.job_id = \S+ AND communicators\.comm_id = )"
)


@pytest.mark.parametrize(
    ("communicators", "comm_id"),
    [([], 0), ([{"comm_id": 77, "channels": 16}], 77)],
    ids=["implicit", "registered"],
)
def test_a_faults_pass_reads_no_row_twice(
    http: httpx.Client, settings: Settings, communicators: list[dict[str, int]], comm_id: int
) -> None:
    register_nodes(http, NODES)
    body = job_body("j", NODES, communicators=communicators)
    assert http.post("/v1/jobs", json=body).status_code == 201
    with statements() as seen:
        r = http.post("/v1/events", json={"events": [event("a", after_s=2400)]})
    assert r.status_code == 202 and len(r.json()["decisions"]) == 1, r.text
    assert any(s.startswith("INSERT INTO commands") for s in seen)  # the hook saw the pass
    assert [s for s in seen if BY_PRIMARY_KEY.search(s)] == []
    # A registered communicator's row keeps its count of epochs; only the implicit one,
    # which has no row, counts from its commands.
    counted = [s for s in seen if s.startswith("SELECT max(commands.epoch)")]
    assert bool(counted) == (not communicators)
    # What the rows read once served is what a fresh read gives.
    db = make_engine(settings.db_url)
    try:
        with make_sessionmaker(db)() as s:
            created = s.scalars(
                select(m.OutboxEvent).where(m.OutboxEvent.type.like("%decision.created"))
            ).one()
            fault = s.scalars(select(m.Fault)).one()
            assert created.data["fault"] == {
                "node": fault.node,
                "device": fault.device,
                "port": fault.port,
                "kind": fault.kind,
            }
            assert (fault.node, fault.device) == ("a", "mlx5_0")
            # Each switch point of the pass took the next epoch (a failover, then the
            # channel plan beside it on a registered communicator), and the row kept it.
            epochs = set(s.scalars(select(m.Command.epoch).where(m.Command.comm_id == comm_id)))
            assert epochs == set(range(1, len(epochs) + 1))
            comm = s.get(m.Communicator, ("j", comm_id))
            assert (comm is None) == (not communicators)
            if comm is not None:
                assert comm.epoch == max(epochs)
    finally:
        db.dispose()


def test_each_jobs_pass_lets_go_of_the_rows_it_held(http: httpx.Client, settings: Settings) -> None:
    """A sweep reconciles many jobs in one session: each job's rows (a large job's
    communicators carry every rank) leave the identity map when its pass ends."""
    register_nodes(http, NODES)
    comms = [{"comm_id": 77, "channels": 16}]
    assert http.post("/v1/jobs", json=job_body("j", NODES, communicators=comms)).status_code == 201
    db = make_engine(settings.db_url)
    try:
        with make_sessionmaker(db)() as s:
            reconciler.reconcile_jobs(s, ["j"], datetime.now(UTC), settings)
            assert [o for o in s.identity_map.values() if isinstance(o, m.Communicator)] == []
            state = reconciler.job_state(s, s.get_one(m.Job, "j"))  # what a pass holds
            assert [c.comm_id for c in state.communicators] == [77]
            assert [o for o in s.identity_map.values() if isinstance(o, m.Communicator)] != []
            s.rollback()
    finally:
        db.dispose()


def test_a_pass_that_failed_before_holding_anything_releases_nothing() -> None:
    """reconcile_jobs releases after every job, also one whose pass raised before it read
    a row: a release with nothing held must not raise in its place."""
    with Session() as s:
        uow.release(s)
        uow.hold(s, [m.Job(job_id="j")])
        uow.release(s)
        uow.release(s)
