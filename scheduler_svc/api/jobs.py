"""Jobs, their checkpoints, decisions, paths and commands."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import Query, Response
from sqlalchemy.orm import Session

from scheduler_svc.api import routing
from scheduler_svc.deps import FleetAuth, Reader, SessionDep, SettingsDep
from scheduler_svc.errors import (
    VALIDATION,
    Conflict,
    Forbidden,
    NotFound,
    Unauthorized,
    Unprocessable,
    responses,
)
from scheduler_svc.schemas import (
    CheckpointIn,
    CheckpointOut,
    CommandList,
    CommandOut,
    CommunicatorIn,
    DecisionList,
    DecisionOut,
    IterationsIn,
    IterationsOut,
    JobId,
    JobIn,
    JobMode,
    JobOut,
    JobPathsOut,
    RankIn,
    RankPathOut,
)
from scheduler_svc.services import redecide, registry
from scheduler_svc.services.decisions import job_view
from scheduler_svc.store import models as m
from scheduler_svc.store.repositories import (
    CommandRepo,
    CoordinationRepo,
    DecisionRepo,
    JobRepo,
)

router = routing.router(prefix="/v1/jobs", tags=["jobs"])


def job_out(session: Session, job: m.Job) -> JobOut:
    return JobOut(
        job_id=job.job_id,
        ranks=[RankIn(rank=r.rank, node=r.node, gpu=r.gpu) for r in job.ranks],
        checkpoint_interval_s=job.checkpoint_interval_s,
        reload_s=job.reload_s,
        detect_s=job.detect_s,
        timeout_s=job.timeout_s,
        last_checkpoint_at=job.last_checkpoint_at,
        last_checkpoint_iteration=job.last_checkpoint_iteration,
        last_checkpoint_kind=job.last_checkpoint_kind,
        slowdown_k=job.slowdown_k,
        comm_share=job.comm_share,
        dp_size=job.dp_size,
        tp_size=job.tp_size,
        pp_size=job.pp_size,
        allow_scaling=job.allow_scaling,
        spare_nodes=job.spare_nodes,
        node_replace_s=job.node_replace_s,
        notify_url=job.notify_url,
        mode=JobMode(job.mode),
        created_at=job.created_at,
        communicators=[
            CommunicatorIn(comm_id=c.comm_id, channels=c.channels, ranks=c.ranks)
            for c in CoordinationRepo(session).communicators(job.job_id)
        ],
        repair_estimate_s=job.repair_estimate_s,
        measured_k=job.measured_k,
        failed_over_at=job.failed_over_at,
    )


def decision_out(d: m.Decision) -> DecisionOut:
    return DecisionOut.model_validate(d, from_attributes=True)


def command_out(c: m.Command) -> CommandOut:
    return CommandOut.model_validate(c, from_attributes=True)


@router.post(
    "",
    status_code=201,
    operation_id="create_job",
    responses=responses(Unauthorized, Forbidden, Conflict, Unprocessable),
)
def create_job(body: JobIn, session: SessionDep, _: FleetAuth) -> JobOut:
    """Register a job: rank placement, checkpoint settings and where to notify."""
    return job_out(session, registry.create_job(session, body, datetime.now(UTC)))


@router.get("", operation_id="list_jobs", responses=responses(Unauthorized))
def list_jobs(session: SessionDep, _: Reader) -> list[JobOut]:
    """All registered jobs."""
    return [job_out(session, j) for j in JobRepo(session).all()]


@router.get("/{job_id}", operation_id="get_job", responses=responses(Unauthorized, NotFound))
def get_job(job_id: JobId, session: SessionDep, _: Reader) -> JobOut:
    """One job, with its current mode and newest checkpoint."""
    return job_out(session, registry.get_job(session, job_id))


@router.delete(
    "/{job_id}",
    status_code=204,
    operation_id="delete_job",
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def delete_job(job_id: JobId, session: SessionDep, _: FleetAuth) -> Response:
    """Forget a finished job with its decisions and commands."""
    registry.delete_job(session, job_id)
    return Response(status_code=204)


@router.post(
    "/{job_id}/checkpoints",
    status_code=201,
    operation_id="report_checkpoint",
    responses=responses(Unauthorized, Forbidden, NotFound) | VALIDATION,
)
def report_checkpoint(
    job_id: JobId, body: CheckpointIn, session: SessionDep, _: FleetAuth, settings: SettingsDep
) -> CheckpointOut:
    """Report a checkpoint; the newest one sets t_elapsed for later decisions."""
    current = registry.add_checkpoint(session, job_id, body, datetime.now(UTC), settings)
    return CheckpointOut(
        job_id=job_id, at=body.at, iteration=body.iteration, kind=body.kind, current=current
    )


@router.get(
    "/{job_id}/decisions",
    operation_id="list_decisions",
    responses=responses(Unauthorized, NotFound),
)
def list_decisions(
    job_id: JobId,
    session: SessionDep,
    _: Reader,
    limit: int = Query(100, ge=1, le=1000),
) -> DecisionList:
    """The job's decisions, newest first, each with its inputs, costs and reason."""
    registry.get_job(session, job_id)
    return DecisionList(
        decisions=[decision_out(d) for d in DecisionRepo(session).for_job(job_id, limit)]
    )


@router.get(
    "/{job_id}/paths", operation_id="get_paths", responses=responses(Unauthorized, NotFound)
)
def get_paths(job_id: JobId, session: SessionDep, _: Reader, settings: SettingsDep) -> JobPathsOut:
    """Primary and backup RNIC of every rank and whether each works under the open faults."""
    job = registry.get_job(session, job_id)
    view = job_view(session, job, settings.backup_cap_per_switch)
    ranks = []
    for r in view.conn.routes:
        g = view.plans[r.node].for_gpu(r.gpu)
        ranks.append(
            RankPathOut(
                rank=r.rank,
                node=r.node,
                gpu=r.gpu,
                primary=r.primary,
                backup=r.backup,
                primary_switch=g.primary_switch,
                backup_switch=g.backup_switch,
                rail_disjoint=g.rail_disjoint,
                primary_ok=r.primary_ok,
                backup_ok=r.backup_ok,
                active=r.active,
            )
        )
    return JobPathsOut(
        job_id=job_id,
        ranks=ranks,
        broken_pairs=view.conn.broken_pairs,
        total_pairs=view.conn.total_pairs,
        isolated_ranks=list(view.conn.isolated_ranks),
        failed_over_ranks=list(view.conn.failed_over_ranks),
        warnings=view.warnings,
    )


@router.get(
    "/{job_id}/commands",
    operation_id="list_job_commands",
    responses=responses(Unauthorized, NotFound),
)
def list_job_commands(job_id: JobId, session: SessionDep, _: Reader) -> CommandList:
    """Every command issued for the job and its delivery state."""
    registry.get_job(session, job_id)
    return CommandList(commands=[command_out(c) for c in CommandRepo(session).for_job(job_id)])


@router.post(
    "/{job_id}/iterations",
    operation_id="report_iterations",
    responses=responses(Unauthorized, Forbidden, NotFound) | VALIDATION,
)
def report_iterations(
    job_id: JobId, body: IterationsIn, session: SessionDep, _: FleetAuth, settings: SettingsDep
) -> IterationsOut:
    """Report iteration times; once steady, the measured k replaces the estimate and re-decides."""
    job = registry.lock_job(session, job_id)
    degraded = job.mode == "failed_over"
    measured, decision = redecide.on_iterations(
        session, job, body.iteration_time_s, datetime.now(UTC), settings
    )
    return IterationsOut(
        job_id=job_id,
        samples=len(body.iteration_time_s),
        degraded=degraded,
        measured_k=measured.k,
        trustworthy=measured.trustworthy,
        detail=measured.reason,
        decision_id=None if decision is None else decision.decision_id,
    )
