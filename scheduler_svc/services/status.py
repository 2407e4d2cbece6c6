"""The cluster at a glance: what the status page, GET /v1/status and the store gauges show.

One snapshot of the store feeds all three, so the page, the API and Prometheus
never disagree about which ports are broken or which jobs run failed over.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import datetime

from prometheus_client import Gauge
from sqlalchemy.orm import Session

from scheduler_svc import metrics
from scheduler_svc.engine.decision import total_saved_gpu_s
from scheduler_svc.engine.fabric import WHOLE_DEVICE, FaultHealth
from scheduler_svc.schemas import (
    DecisionBriefOut,
    FaultOut,
    JobStatusOut,
    NodeStatusOut,
    RailCellOut,
    StatusOut,
)
from scheduler_svc.store import models as m
from scheduler_svc.store.models import JobMode
from scheduler_svc.store.repositories import (
    CommandRepo,
    DecisionRepo,
    FaultRepo,
    JobRepo,
    NodeRepo,
)

# Far above any real number of open faults; the bound keeps one scrape cheap if it ever is not.
MAX_OPEN_FAULTS = 10_000


def _brief(d: m.Decision) -> DecisionBriefOut:
    inputs = d.inputs or {}
    return DecisionBriefOut(
        decision_id=d.decision_id,
        action=d.action,
        reason=d.reason,
        trigger=d.trigger,
        created_at=d.created_at,
        k=inputs.get("k"),
        k_source=inputs.get("k_source"),
        t_elapsed_s=inputs.get("t_elapsed_s"),
        threshold_s=inputs.get("threshold_s"),
        costs_s=d.costs_s,
        costs_gpu_s=d.costs_gpu_s,
    )


def _cells(node: m.Node, faults: dict[tuple[str, str, int], m.Fault]) -> list[RailCellOut]:
    cells = []
    for r in node.rnics:
        if r.rail is None:  # storage and management NICs carry no GPU traffic
            continue
        fault = faults.get((node.name, r.name, r.port)) or faults.get(
            (node.name, r.name, WHOLE_DEVICE)
        )
        health = "fault" if fault is not None else "ok" if r.state == "ACTIVE" else "down"
        cells.append(
            RailCellOut(
                rail=r.rail,
                device=r.name,
                port=r.port,
                switch=r.switch,
                state=r.state,
                health=health,
                fault_kind=None if fault is None else fault.kind,
            )
        )
    return sorted(cells, key=lambda c: (c.rail, c.device, c.port))


def build_status(session: Session, now: datetime) -> StatusOut:
    """Read the snapshot; the caller's session is only read from."""
    faults = FaultRepo(session).all(open_only=True, limit=MAX_OPEN_FAULTS)
    by_port = {(f.node, f.device, f.port): f for f in faults}
    nodes = [
        NodeStatusOut(name=n.name, updated_at=n.updated_at, rails=_cells(n, by_port))
        for n in NodeRepo(session).all()
    ]
    decisions = DecisionRepo(session)
    latest = decisions.latest_per_job()
    last_failover = decisions.latest_per_job(action="failover")
    counts = JobRepo(session).rank_counts()
    jobs = []
    for job in JobRepo(session).all():
        ranks, on_nodes = counts.get(job.job_id, (0, []))
        newest = latest.get(job.job_id)
        since = last_failover.get(job.job_id)
        jobs.append(
            JobStatusOut(
                job_id=job.job_id,
                mode=JobMode(job.mode),
                ranks=ranks,
                nodes=on_nodes,
                last_checkpoint_at=job.last_checkpoint_at,
                slowdown_k=job.slowdown_k,
                failed_over_since=(
                    since.created_at if since is not None and job.mode == "failed_over" else None
                ),
                latest_decision=None if newest is None else _brief(newest),
            )
        )
    saved = decisions.actions_and_saved()
    pending, oldest = CommandRepo(session).unacknowledged()
    return StatusOut(
        generated_at=now,
        rails=sorted({c.rail for n in nodes for c in n.rails}),
        nodes=nodes,
        open_faults=[fault_out(f) for f in faults],
        jobs=jobs,
        decisions_by_action=dict(Counter(action for action, _ in saved)),
        saved_gpu_seconds=total_saved_gpu_s(s for _, s in saved),
        commands_unacknowledged=pending,
        oldest_unacknowledged_at=oldest,
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
_rnic_up = _LabelledGauge(metrics.RNIC_UP)
_failed_over = _LabelledGauge(metrics.JOB_FAILED_OVER)
_slowdown = _LabelledGauge(metrics.JOB_SLOWDOWN_K)


def refresh_metrics(status: StatusOut) -> None:
    """Set the store-derived gauges from a snapshot (called on every /metrics scrape)."""
    now = status.generated_at
    rnic: dict[tuple[str, ...], float] = {
        (n.name, c.device, str(c.port), str(c.rail)): 1.0 if c.health == "ok" else 0.0
        for n in status.nodes
        for c in n.rails
    }
    failed: dict[tuple[str, ...], float] = {
        (j.job_id,): (
            0.0
            if j.failed_over_since is None
            else max(0.0, (now - j.failed_over_since).total_seconds())
        )
        for j in status.jobs
    }
    k: dict[tuple[str, ...], float] = {}
    for j in status.jobs:
        if j.slowdown_k is not None:
            k[(j.job_id, "measured")] = j.slowdown_k
        d = j.latest_decision
        # A decision that used the measured k predicted nothing; show only model or default k.
        if d is not None and d.k is not None and d.k_source != "measured":
            k[(j.job_id, "predicted")] = d.k
    modes = Counter(j.mode.value for j in status.jobs)
    with _lock:
        metrics.OPEN_FAULTS.set(len(status.open_faults))
        for mode in JobMode:
            metrics.JOBS.labels(mode=mode.value).set(modes.get(mode.value, 0))
        _rnic_up.sync(rnic)
        _failed_over.sync(failed)
        _slowdown.sync(k)
        for state in ("issued", "delivered"):
            metrics.COMMANDS_UNACKNOWLEDGED.labels(state=state).set(
                status.commands_unacknowledged.get(state, 0)
            )
        oldest = status.oldest_unacknowledged_at
        metrics.COMMAND_OLDEST_UNACKNOWLEDGED.set(
            0.0 if oldest is None else max(0.0, (now - oldest).total_seconds())
        )
        metrics.GPU_SECONDS_SAVED.set(status.saved_gpu_seconds)


def fault_out(f: m.Fault, health: FaultHealth | None = None) -> FaultOut:
    """A fault as the API shows it (port null when the whole RNIC failed)."""
    return FaultOut(
        id=f.id,
        node=f.node,
        device=f.device,
        port=f.port or None,
        kind=f.kind,
        opened_at=f.opened_at,
        switch=f.switch,
        cleared_at=f.cleared_at,
        resolved_at=f.resolved_at,
        resolved_reason=f.resolved_reason,
        resolved_by=f.resolved_by,
        last_error_at=f.last_error_at,
        health=None if health is None else health.health.value,
        clears_at=None if health is None else health.clears_at,
        evidence={"first_event_id": f.first_event_id, **(f.detail or {})},
    )
