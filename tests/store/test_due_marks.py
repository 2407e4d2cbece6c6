"""A report marks the jobs on its nodes due, in one statement (`JobRepo.mark_due_on_nodes`):
the coordinator's fallback should the pass that follows the report's commit never run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

from scheduler_svc.store import models as m
from scheduler_svc.store.db import make_engine, make_sessionmaker
from scheduler_svc.store.jobs import JobRepo
from tests.conftest import truncate_pg
from tests.sql_statements import statements
from tests.store.test_repositories import job

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def due(session: Session) -> dict[str, datetime | None]:
    return dict(session.execute(select(m.Job.job_id, m.Job.reconcile_due_at)).tuples().all())


def test_the_jobs_on_the_nodes_are_named_and_marked_unless_due_sooner(session: Session) -> None:
    jobs = JobRepo(session)
    for job_id, nodes in (("j1", ["n0", "n1"]), ("j2", ["n1"]), ("j3", ["n2"]), ("j4", ["n0"])):
        jobs.add(job(job_id, nodes))
    sooner, later = NOW - timedelta(seconds=30), NOW + timedelta(hours=1)
    session.get_one(m.Job, "j2").reconcile_due_at = sooner  # a failed pass's retry
    session.get_one(m.Job, "j4").reconcile_due_at = later  # a refused fail-back's retry
    session.flush()
    with statements(session.get_bind().engine) as seen:
        assert jobs.mark_due_on_nodes({"n1", "n0"}, NOW) == ["j1", "j2", "j4"]
    assert len(seen) == 1
    assert due(session) == {"j1": NOW, "j2": sooner, "j3": None, "j4": NOW}
    with statements(session.get_bind().engine) as seen:
        assert jobs.mark_due_on_nodes({"n9"}, NOW) == []
        assert jobs.mark_due_on_nodes(set(), NOW) == []
    assert len(seen) == 1  # no nodes, no statement


@pytest.mark.postgres
def test_a_job_a_pass_holds_is_named_but_not_waited_for(pg_url: str) -> None:
    """On PostgreSQL a pass holds its job's row locked for the whole pass; a report
    names that job (to be reconciled once the pass ends) without queueing behind it."""
    truncate_pg(pg_url)
    engine: Engine = make_engine(pg_url)
    sessions = make_sessionmaker(engine)
    try:
        with sessions.begin() as s:
            JobRepo(s).add(job("held", ["n0"]))
            JobRepo(s).add(job("free", ["n0"]))
        with sessions() as pass_, pass_.begin():
            assert JobRepo(pass_).lock("held") is not None
            with sessions() as report, report.begin():
                report.execute(text("SET LOCAL lock_timeout = '5s'"))
                assert JobRepo(report).mark_due_on_nodes({"n0"}, NOW) == ["free", "held"]
                assert due(report) == {"free": NOW, "held": None}
    finally:
        truncate_pg(pg_url)
        engine.dispose()
