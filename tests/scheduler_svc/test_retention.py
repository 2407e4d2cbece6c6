"""Retention (services/retention.py): each bounded table loses what is past its bound,
and keeps everything else. On both stores."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from scheduler_svc.config import Settings
from scheduler_svc.fleet.repositories import CANCELLED, DEAD, DELIVERED, PENDING
from scheduler_svc.services import retention
from scheduler_svc.store import models as m
from scheduler_svc.store.db import make_engine, make_sessionmaker

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)


def count(sessions: sessionmaker[Session], model: type[m.Base], *where: Any) -> int:
    with sessions() as s:
        return int(s.scalar(select(func.count()).select_from(model).where(*where)) or 0)


def test_prune_keeps_each_table_within_its_bound(db_url: str) -> None:
    settings = Settings(db_url=db_url, dead_letters_max=100)
    engine = make_engine(settings.sqlalchemy_url)
    sessions = make_sessionmaker(engine)
    try:
        with sessions() as s, s.begin():
            for i, age in enumerate((8 * DAY, 6 * DAY)):
                s.add(
                    m.Event(
                        event_id=f"e{i}", node="n0", kind="port_down", device="mlx5_0", port=1,
                        observed_at=NOW - age, received_at=NOW - age, payload={}, fault_id=None,
                    )
                )  # fmt: skip
            for i, age in enumerate((31 * DAY, 29 * DAY)):
                s.add(
                    m.AuditEntry(
                        at=NOW - age, token_id=None, role=None, method="*", path="*",
                        operation=None, status=401, client=f"10.0.0.{i}", detail=None, count=3,
                    )
                )  # fmt: skip
            old = m.OutboxEvent(
                event_id="old",
                type="t",
                subject="s",
                job_id=None,
                data={},
                created_at=NOW - 9 * DAY,
            )
            new = m.OutboxEvent(
                event_id="new", type="t", subject="s", job_id=None, data={}, created_at=NOW
            )
            s.add_all([old, new])
            s.flush()
            states = [(DELIVERED, old), (CANCELLED, old), (PENDING, old)]
            states += [(DEAD, new)] * 150
            for i, (state, ev) in enumerate(states):
                s.add(
                    m.Delivery(
                        outbox_id=ev.id, target="sub:x", lane=f"sub:x/{i}", url="http://h/",
                        state=state, attempts=1, next_attempt_at=ev.created_at,
                        created_at=ev.created_at,
                        delivered_at=ev.created_at if state == DELIVERED else None,
                        dead_at=ev.created_at if state == DEAD else None,
                    )
                )  # fmt: skip
            job = m.Job(
                job_id="j", created_at=NOW, checkpoint_interval_s=3600, reload_s=600,
                detect_s=0, timeout_s=30, last_checkpoint_at=NOW, mode="normal",
                decision_count=0, placement_id="p", incarnation=1,
            )  # fmt: skip
            s.add(job)
            s.flush()
            s.add_all(
                m.IterationSample(job_id="j", at=NOW, seconds=float(i), degraded=i % 2 == 1)
                for i in range(130)
            )
        deleted = retention.prune(sessions, NOW, settings)
        assert deleted == {
            "events": 1,
            "audit_log": 1,
            "deliveries": 2,
            "dead_letters": 50,
            "iteration_samples": 30,
        }
        # The newest 50 of each side are the ones kept.
        with sessions() as s:
            seconds = s.scalars(select(m.IterationSample.seconds)).all()
        assert sorted(seconds) == [float(i) for i in range(30, 130)]
        assert count(sessions, m.Event) == 1
        assert count(sessions, m.AuditEntry) == 1
        # The pending delivery of the old event is kept, and so is its event.
        assert count(sessions, m.Delivery, m.Delivery.state == PENDING) == 1
        assert count(sessions, m.Delivery, m.Delivery.state == DEAD) == 100
        assert count(sessions, m.OutboxEvent) == 2
        # The newest dead letters are the ones kept.
        with sessions() as s:
            kept = s.scalars(select(m.Delivery.lane).where(m.Delivery.state == DEAD)).all()
        assert sorted(kept, key=lambda lane: int(lane.split("/")[1]))[0] == "sub:x/53"
        # A second pass has nothing left to do.
        assert set(retention.prune(sessions, NOW, settings).values()) == {0}
    finally:
        engine.dispose()
