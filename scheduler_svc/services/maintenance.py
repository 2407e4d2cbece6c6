"""Planned maintenance: schedule a window, list it, cancel it, and step it through its phases.

A window is evidence like a fault: `engine.fabric` derives from its times alone
whether its target is out of service (from the lead time before its start until
the damping period after its end), and `reconcile` moves the jobs that use it.
Scheduling, cancelling and the coordinator's sweep only record the window and
name the jobs on its target; the sweep is where the passing of time is noticed.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from scheduler_svc.api.schemas.maintenance import (
    MaintenanceIn,
    MaintenanceList,
    MaintenanceOut,
    MaintenanceTarget,
)
from scheduler_svc.config import Settings
from scheduler_svc.engine import fabric as health
from scheduler_svc.engine.fabric import MaintenancePhase
from scheduler_svc.engine.state import Mode
from scheduler_svc.errors import Conflict, NotFound, Unprocessable
from scheduler_svc.fleet import EventType, emit
from scheduler_svc.services import fabric, reconciler
from scheduler_svc.store import models as m
from scheduler_svc.store.jobs import JobRepo
from scheduler_svc.store.maintenance import MaintenanceRepo
from scheduler_svc.store.nodes import NodeRepo

# How far ahead a window may be planned.
HORIZON = timedelta(days=365)
ENDED = (MaintenancePhase.ENDED, MaintenancePhase.DONE)
STARTED = (MaintenancePhase.ACTIVE, *ENDED)


def _check_target(session: Session, t: MaintenanceTarget) -> None:
    """The target names registered parts, or a 422 naming the field that does not."""
    repo = NodeRepo(session)
    if t.switch is not None:
        if not repo.switch_known(t.switch):
            raise Unprocessable(f"target.switch: no registered RNIC is on switch {t.switch!r}")
        return
    assert t.node is not None
    node = NodeRepo(session).get(t.node)
    if node is None:
        raise Unprocessable(f"target.node: node {t.node!r} is not registered")
    if t.device is None:
        return
    ports = {r.port for r in node.rnics if r.name == t.device}
    if not ports:
        raise Unprocessable(f"target.device: node {t.node!r} has no RNIC {t.device!r}")
    if t.port is not None and t.port not in ports:
        raise Unprocessable(f"target.port: {t.node}/{t.device} has no port {t.port}")


def target_nodes(session: Session, row: m.MaintenanceWindow) -> list[str]:
    if row.switch is not None:
        return NodeRepo(session).nodes_on_switch(row.switch)
    return [row.node] if row.node is not None else []


def out(
    row: m.MaintenanceWindow, now: datetime, settings: Settings, decisions: list[str] | None = None
) -> MaintenanceOut:
    target = MaintenanceTarget(
        switch=row.switch,
        node=row.node,
        device=row.device,
        port=(row.port or None) if row.device is not None else None,
    )
    return MaintenanceOut(
        id=row.id,
        target=target,
        start_at=row.start_at,
        end_at=row.end_at,
        moves_at=row.moves_at,
        reason=row.reason,
        phase=fabric.window(row).phase(now, settings.failback_damping_s).value,
        created_at=row.created_at,
        cancelled_at=row.cancelled_at,
        would_restart=list(row.would_restart or []),
        decisions=decisions or [],
    )


def _data(row: m.MaintenanceWindow, **extra: Any) -> dict[str, Any]:
    return {
        "id": row.id,
        "target": {
            "switch": row.switch,
            "node": row.node,
            "device": row.device,
            "port": row.port or None,
        },
        "start_at": row.start_at.isoformat(),
        "end_at": row.end_at.isoformat(),
        "moves_at": row.moves_at.isoformat(),
        "reason": row.reason,
        "would_restart": list(row.would_restart or []),
        **extra,
    }


def _announce(session: Session, row: m.MaintenanceWindow, type: str, now: datetime) -> None:
    label = fabric.window(row).label
    emit(
        session,
        type,
        job_id=None,
        subject=f"maintenance/{row.id}/{label}",
        data=_data(row, cancelled=row.cancelled_at is not None),
        now=now,
    )


def would_restart(
    session: Session,
    row: m.MaintenanceWindow,
    job_ids: list[str],
    now: datetime,
    settings: Settings,
) -> list[str]:
    """Jobs that reconcile would restart once the window is open, with what is known now."""
    at = max(now, row.start_at)
    found = []
    for job_id in job_ids:
        job = JobRepo(session).get(job_id)
        if job is None or job.mode == Mode.RESTARTING.value:
            continue
        _, _, result = reconciler.current(session, job, at, settings)
        if result.desired.mode == Mode.RESTARTING:
            found.append(job_id)
    return found


def schedule(
    session: Session, body: MaintenanceIn, *, by: str | None, now: datetime, settings: Settings
) -> MaintenanceOut:
    """Record a window; jobs move now if its lead time has begun."""
    _check_target(session, body.target)
    if body.start_at > now + HORIZON:
        raise Unprocessable(
            f"start_at: more than {HORIZON.days} days ahead; schedule it closer to the date"
        )
    end_at = body.start_at + timedelta(seconds=body.duration_s)
    if end_at <= now:
        raise Unprocessable(
            f"start_at: the window ended at {end_at.isoformat()}, before now ({now.isoformat()})"
        )
    t = body.target
    row = MaintenanceRepo(session).add(
        m.MaintenanceWindow(
            switch=t.switch,
            node=t.node,
            device=t.device,
            port=(t.port or health.WHOLE_DEVICE) if t.device is not None else health.WHOLE_DEVICE,
            start_at=body.start_at,
            end_at=end_at,
            moves_at=body.start_at - timedelta(seconds=settings.maintenance_lead_s),
            reason=body.reason,
            created_at=now,
            created_by=by,
            phase=MaintenancePhase.SCHEDULED.value,
            would_restart=[],
        )
    )
    jobs = JobRepo(session).job_ids_on_nodes(target_nodes(session, row))
    row.would_restart = would_restart(session, row, jobs, now, settings)
    _announce(session, row, EventType.MAINTENANCE_SCHEDULED, now)
    made = _step(session, row, now, settings, jobs)
    return out(row, now, settings, [d.decision_id for d in made])


def listing(
    session: Session, *, include_done: bool, limit: int, now: datetime, settings: Settings
) -> MaintenanceList:
    rows = MaintenanceRepo(session).listing(include_done=include_done, limit=limit)
    return MaintenanceList(maintenance=[out(r, now, settings) for r in rows])


def cancel(session: Session, window_id: int, now: datetime, settings: Settings) -> MaintenanceOut:
    """End a window now: its jobs fail back (after the damping period if it had started)."""
    row = MaintenanceRepo(session).get(window_id, lock=True)
    if row is None:
        raise NotFound(f"maintenance {window_id} does not exist")
    if row.cancelled_at is not None or now >= row.end_at:
        raise Conflict(f"maintenance {window_id} is already over")
    row.cancelled_at = now
    made = _step(session, row, now, settings)
    return out(row, now, settings, [d.decision_id for d in made])


def due(session: Session, now: datetime) -> list[int]:
    return MaintenanceRepo(session).due(now)


def advance(session: Session, window_id: int, now: datetime, settings: Settings) -> None:
    """The coordinator's step for one due window (claimed again: another replica may act)."""
    row = MaintenanceRepo(session).claim(window_id, now)
    if row is not None:
        _step(session, row, now, settings)


def _step(
    session: Session,
    row: m.MaintenanceWindow,
    now: datetime,
    settings: Settings,
    jobs: list[str] | None = None,
) -> list[m.Decision]:
    """Move the stored phase to the one the times give, announce it, reconcile on a change."""
    w = fabric.window(row)
    damping = settings.failback_damping_s
    was, phase = MaintenancePhase(row.phase), w.phase(now, damping)
    row.phase, row.due_at = phase.value, w.next_change(now, damping)
    if phase == was:
        return []
    if phase in STARTED and was not in STARTED and w.until > w.starts_at:
        _announce(session, row, EventType.MAINTENANCE_STARTED, now)
    if phase in ENDED and was not in ENDED:
        _announce(session, row, EventType.MAINTENANCE_ENDED, now)
    if (phase in health.OUT_OF_SERVICE) == (was in health.OUT_OF_SERVICE):
        return []
    if jobs is None:
        jobs = JobRepo(session).job_ids_on_nodes(target_nodes(session, row))
    return reconciler.reconcile_jobs(session, jobs, now, settings)
