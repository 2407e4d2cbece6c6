"""The gauges read from the store at each /metrics scrape, so every replica reports the truth.

A scrape of an 8,192-node fleet must stay cheap for the service and for Prometheus, so
what it reads and exports grows with what is broken, not with the fleet: the ports
are counted by rail and health in the store (one row per rail and port state), and
only the ports that are not ok (not ACTIVE, or under an open fault), and the nodes
holding them, get series of their own. Jobs, faults and waiting commands are read
whole: a fleet has hundreds of those, not tens of thousands.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import cast

from prometheus_client import Gauge
from sqlalchemy import func, or_, select, tuple_
from sqlalchemy.orm import Session

from scheduler_svc import metrics
from scheduler_svc.engine.decision import total_saved_gpu_s
from scheduler_svc.services.status import (
    MAX_OPEN_FAULTS,
    PortHealth,
    failed_over_since,
    port_health,
)
from scheduler_svc.store import models as m
from scheduler_svc.store.commands import CommandRepo
from scheduler_svc.store.faults import FaultRepo
from scheduler_svc.store.jobs import DecisionRepo, JobRepo
from scheduler_svc.store.types import JobMode

HEALTHS = ("ok", "down", "fault")


@dataclass(frozen=True)
class Levels:
    """What the store-derived gauges show, read in one session."""

    open_faults: int
    # (rail, health) -> ports; every rail with a fabric port has all three healths
    ports: dict[tuple[int, str], int]
    unhealthy: list[PortHealth]
    jobs_by_mode: dict[str, int]
    failed_over_s: dict[str, float]
    # (job_id, "measured" | "predicted") -> k
    slowdown: dict[tuple[str, ...], float]
    commands_unacknowledged: dict[str, int]
    oldest_unacknowledged_s: float
    saved_gpu_seconds: float


def _port_counts(session: Session, unhealthy: list[PortHealth]) -> dict[tuple[int, str], int]:
    """Ports by (rail, health): the store counts them by rail and state; the few under an
    open fault move from their state's count to "fault"."""
    # rail is not null here (the where clause); the column's type cannot say so
    by_state = cast(
        Iterable[tuple[int, str, int]],
        session.execute(
            select(m.Rnic.rail, m.Rnic.state, func.count())
            .where(m.Rnic.rail.is_not(None))
            .group_by(m.Rnic.rail, m.Rnic.state)
        ).tuples(),
    )
    counts: Counter[tuple[int, str]] = Counter()
    for rail, state, n in by_state:
        counts[(rail, "ok" if state == "ACTIVE" else "down")] += n
        for health in HEALTHS:
            counts[(rail, health)] += 0
    for p in unhealthy:
        if p.health == "fault":
            counts[(p.rail, "ok" if p.state == "ACTIVE" else "down")] -= 1
            counts[(p.rail, "fault")] += 1
    return dict(counts)


def _unhealthy_ports(session: Session, faults: list[m.Fault]) -> list[PortHealth]:
    """The fabric ports not ACTIVE or on a device under an open fault."""
    faulted = {(f.node, f.device) for f in faults}
    only = m.Rnic.state != "ACTIVE"
    if faulted:
        only = or_(only, tuple_(m.Rnic.node, m.Rnic.name).in_(sorted(faulted)))
    return [p for p in port_health(session, faults, only=only) if p.health != "ok"]


def read_levels(session: Session, now: datetime) -> Levels:
    """The gauges' values; the caller's session is only read from."""
    faults = list(FaultRepo(session).all(open_only=True, limit=MAX_OPEN_FAULTS))
    unhealthy = _unhealthy_ports(session, faults)
    decisions = DecisionRepo(session)
    latest = decisions.latest_per_job()
    last_failover = decisions.latest_per_job(action="failover")
    jobs = JobRepo(session).all()
    failed_over: dict[str, float] = {}
    slowdown: dict[tuple[str, ...], float] = {}
    for job in jobs:
        since = failed_over_since(job, last_failover)
        failed_over[job.job_id] = 0.0 if since is None else max(0.0, (now - since).total_seconds())
        if job.slowdown_k is not None:
            slowdown[(job.job_id, "measured")] = job.slowdown_k
        inputs = (latest[job.job_id].inputs or {}) if job.job_id in latest else {}
        # A decision that used the measured k predicted nothing; show only model or default k.
        if inputs.get("k") is not None and inputs.get("k_source") != "measured":
            slowdown[(job.job_id, "predicted")] = inputs["k"]
    pending, oldest = CommandRepo(session).unacknowledged()
    return Levels(
        open_faults=len(faults),
        ports=_port_counts(session, unhealthy),
        unhealthy=unhealthy,
        jobs_by_mode=dict(Counter(job.mode for job in jobs)),
        failed_over_s=failed_over,
        slowdown=slowdown,
        commands_unacknowledged=pending,
        oldest_unacknowledged_s=0.0 if oldest is None else max(0.0, (now - oldest).total_seconds()),
        saved_gpu_seconds=total_saved_gpu_s(s for _, s in decisions.actions_and_saved()),
    )


class _LabelledGauge:
    """Sets a labelled gauge to exactly the given series, removing those no longer present.

    Removing only the stale label sets (rather than clearing first) means a scrape
    running concurrently never sees the gauge empty.
    """

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        self.known: set[tuple[str, ...]] = set()

    def sync(self, values: dict[tuple[str, ...], float]) -> None:
        for labels, value in values.items():
            self.gauge.labels(*labels).set(value)
        for stale in self.known - values.keys():
            self.gauge.remove(*stale)
        self.known = set(values)


_lock = threading.Lock()
_ports = _LabelledGauge(metrics.RNIC_PORTS)
_unhealthy = _LabelledGauge(metrics.RNIC_UNHEALTHY)
_nodes = _LabelledGauge(metrics.NODE_UNHEALTHY_PORTS)
_failed_over = _LabelledGauge(metrics.JOB_FAILED_OVER)
_slowdown = _LabelledGauge(metrics.JOB_SLOWDOWN_K)


def refresh(levels: Levels) -> None:
    """Set the store-derived gauges to `levels`."""
    ports: dict[tuple[str, ...], float] = {
        (str(rail), health): float(n) for (rail, health), n in levels.ports.items()
    }
    unhealthy: dict[tuple[str, ...], float] = {
        (p.node, p.device, str(p.port), str(p.rail), p.health): 1.0 for p in levels.unhealthy
    }
    per_node = Counter(p.node for p in levels.unhealthy)
    with _lock:
        metrics.OPEN_FAULTS.set(levels.open_faults)
        for mode in JobMode:
            metrics.JOBS.labels(mode=mode.value).set(levels.jobs_by_mode.get(mode.value, 0))
        _ports.sync(ports)
        _unhealthy.sync(unhealthy)
        _nodes.sync({(node,): float(n) for node, n in per_node.items()})
        _failed_over.sync({(job,): s for job, s in levels.failed_over_s.items()})
        _slowdown.sync(levels.slowdown)
        for state in ("issued", "delivered"):
            metrics.COMMANDS_UNACKNOWLEDGED.labels(state=state).set(
                levels.commands_unacknowledged.get(state, 0)
            )
        metrics.COMMAND_OLDEST_UNACKNOWLEDGED.set(levels.oldest_unacknowledged_s)
        metrics.GPU_SECONDS_SAVED.set(levels.saved_gpu_seconds)
