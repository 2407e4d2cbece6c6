"""Retention: every stored table that grows with what callers send is kept bounded.

Pruned here, in batches of BATCH rows per transaction (short write locks), once every
RETENTION_EVERY_S by the coordinator:

- events (every agent report): RAILOVER_EVENTS_RETENTION_S after they were received.
  Their ids are the reports' idempotency keys: a report replayed after that long is
  taken as new, and decided as old as it is.
- the audit log: RAILOVER_AUDIT_RETENTION_S. Refused requests without credentials are
  one entry per peer, status and minute (fleet/service.py RefusedTally), not one each.
- webhook and fleet-action deliveries finished (delivered, dead, cancelled):
  RAILOVER_DELIVERIES_RETENTION_S, with the events no delivery needs any more; dead
  letters at most RAILOVER_DEAD_LETTERS_MAX besides, the oldest going first;
- iteration samples: the newest SAMPLES_READ of each job and side, all that is read.

Everything else that grows with input is owned by a job (its decisions, commands, acks,
checkpoints, progress, stalls, mirror failures: deleted with the job) or by a registered
node, fault or maintenance window, each bounded by the fleet's size. A job that lives
long and reports a checkpoint or a mirror failure every iteration keeps each such row
until it is deleted: those histories are read (the newest checkpoint of an incarnation,
the highest iteration) and have no bound yet.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from scheduler_svc import metrics
from scheduler_svc.config import Settings
from scheduler_svc.fleet.repositories import AuditRepo, OutboxRepo
from scheduler_svc.store.coordination import CoordinationRepo
from scheduler_svc.store.faults import EventRepo
from scheduler_svc.store.uow import unit_of_work

log = logging.getLogger(__name__)
BATCH = 5000
# Batches per table per pass: a backlog is worked off over several passes, never in one
# long one.
MAX_BATCHES = 20
RETENTION_EVERY_S = 60.0


def prune(sessions: sessionmaker[Session], now: datetime, settings: Settings) -> dict[str, int]:
    """One pass over every bounded table; returns the rows deleted per table."""
    events_before = now - timedelta(seconds=settings.events_retention_s)
    audit_before = now - timedelta(seconds=settings.audit_retention_s)
    deliveries_before = now - timedelta(seconds=settings.deliveries_retention_s)
    steps: dict[str, Callable[[Session], int]] = {
        "events": lambda s: EventRepo(s).prune(events_before, BATCH),
        "audit_log": lambda s: AuditRepo(s).prune(audit_before, BATCH),
        "deliveries": lambda s: OutboxRepo(s).prune_finished(deliveries_before, BATCH),
        "dead_letters": lambda s: OutboxRepo(s).bound_dead(settings.dead_letters_max, BATCH),
        "iteration_samples": lambda s: CoordinationRepo(s).bound_samples(),
    }
    deleted: dict[str, int] = {}
    for table, step in steps.items():
        total = 0
        for _ in range(MAX_BATCHES):
            with unit_of_work(sessions) as session:
                n = step(session)
            total += n
            if n < BATCH:
                break
        deleted[table] = total
        if total:
            metrics.PRUNED.labels(table).inc(total)
    if any(deleted.values()):
        log.info("retention: deleted %s", ", ".join(f"{t} {n}" for t, n in deleted.items() if n))
    return deleted
