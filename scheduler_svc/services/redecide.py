"""Re-decisions: after a failed command, at a checkpoint, and when the measured k moves."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from scheduler_svc.config import Settings
from scheduler_svc.engine import coordination as coord
from scheduler_svc.services import ccl, coordination
from scheduler_svc.services.decisions import (
    decide_for_job,
    inputs_now,
    issue_commands,
    job_view,
    record_decision,
)
from scheduler_svc.store import models as m
from scheduler_svc.store.repositories import CoordinationRepo, DecisionRepo, JobRepo


def after_failed_ack(
    session: Session, cmd: m.Command, detail: str, now: datetime, settings: Settings
) -> m.Decision | None:
    """A rank past the switch point gets a later one; a rank that cannot move, a re-decision."""
    if coordination.on_failed_ack(session, cmd, detail, now, settings):
        return None
    if "too_late" in detail:
        return None
    why = f"{cmd.kind} command {cmd.command_id} failed on {cmd.node} ({detail or 'no detail'})"
    return cannot_move(session, cmd, now, settings, why)


def cannot_move(
    session: Session, cmd: m.Command, now: datetime, settings: Settings, why: str
) -> m.Decision | None:
    """A command that failed for good: its node's ranks count as having no path left.

    An abort needs no new decision: the job is already restarting.
    """
    if cmd.kind == "abort":
        return None
    job = JobRepo(session).lock(cmd.job_id)
    if job is None:
        return None
    return decide_for_job(
        session,
        job,
        trigger=f"command:{cmd.command_id}:failed",
        fault=None,
        at=now,
        now=now,
        settings=settings,
        note=why,
        unreachable=frozenset({cmd.node}),
    )


def on_checkpoint(
    session: Session, job: m.Job, cp: m.Checkpoint, now: datetime, settings: Settings
) -> m.Decision | None:
    """At a checkpoint while failed over: restart cleanly now, or keep running degraded?"""
    latest = DecisionRepo(session).for_job(job.job_id, 1)
    k = job.measured_k or (latest[0].inputs.get("k") if latest else None) or settings.default_k[0]
    repair = job.repair_estimate_s or settings.default_repair_s
    degraded_for = (now - job.failed_over_at).total_seconds() if job.failed_over_at else 0.0
    remaining = max(0.0, repair - degraded_for)
    restart, reason = coord.restart_at_checkpoint(k=k, reload_s=job.reload_s, repair_s=remaining)
    row = record_decision(
        session,
        job,
        trigger=f"checkpoint:{cp.id}",
        fault=None,
        action="restart" if restart else "none",
        reason=reason,
        inputs=inputs_now(session, job, now, settings),
        costs_s={"restart": job.reload_s, "failover": (k - 1) * remaining},
        costs_gpu_s={},
        plan={"repair_in_s": remaining, "k": k},
        now=now,
    )
    if row is not None and restart:
        job.mode = "restarting"
    if row is not None and restart and not ccl.is_stock_nccl(job):  # stock NCCL: no commands
        issue_commands(
            session,
            job,
            row,
            job_view(session, job, settings.backup_cap_per_switch),
            timedelta(seconds=settings.command_ack_timeout_s),
        )
    return row


def on_iterations(
    session: Session, job: m.Job, seconds: list[float], now: datetime, settings: Settings
) -> tuple[coord.MeasuredK, m.Decision | None]:
    """Keep healthy and failed-over iteration times; re-decide when a steady k changes the input."""
    repo = CoordinationRepo(session)
    degraded = job.mode == "failed_over"
    repo.add_samples(
        [
            m.IterationSample(job_id=job.job_id, at=now, seconds=s, degraded=degraded)
            for s in seconds
        ]
    )
    measured = coord.measured_k(
        repo.samples(job.job_id, degraded=False),
        repo.samples(job.job_id, degraded=True),
        min_samples=settings.measured_k_min_samples,
    )
    if not degraded or not measured.trustworthy or measured.k is None:
        return measured, None
    latest = DecisionRepo(session).for_job(job.job_id, 1)
    used = float(latest[0].inputs.get("k", 1.0)) if latest else 1.0
    job.measured_k = measured.k
    if abs(measured.k - used) <= settings.measured_k_tolerance * used:
        return measured, None
    decision = decide_for_job(
        session,
        job,
        trigger=f"measured_k:{job.decision_count + 1}",
        fault=None,
        at=now,
        now=now,
        settings=settings,
        note=f"measured k {measured.k:.3f} ({measured.reason}) replaces {used:.3f}",
    )
    return measured, decision
