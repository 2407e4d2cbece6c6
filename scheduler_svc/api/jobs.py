"""Jobs, their checkpoints, decisions, paths and commands."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import Query, Response
from sqlalchemy.orm import Session

from scheduler_svc.api import routing
from scheduler_svc.api.deps import (
    FleetAuth,
    NowDep,
    Reader,
    SessionDep,
    SettingsDep,
    check_webhook_url,
)
from scheduler_svc.api.schemas.commands import CommandList, CommandOut
from scheduler_svc.api.schemas.decisions import (
    DecisionList,
    DecisionOut,
    IterationsIn,
    IterationsOut,
)
from scheduler_svc.api.schemas.fields import RANK_MAX, JobId, Name
from scheduler_svc.api.schemas.jobs import (
    CclIn,
    CheckpointIn,
    CheckpointOut,
    CommunicatorIn,
    JobIn,
    JobOut,
    MirrorFailureIn,
    MirrorFailureOut,
    RankIn,
)
from scheduler_svc.api.schemas.paths import (
    CommunicatorOut,
    JobPathsOut,
    JobProgressOut,
    RankProgressOut,
    StallOut,
)
from scheduler_svc.config import Settings
from scheduler_svc.errors import (
    VALIDATION,
    Conflict,
    ErrorBody,
    Forbidden,
    NotFound,
    Unauthorized,
    Unprocessable,
    responses,
)
from scheduler_svc.fleet.outbound import redact
from scheduler_svc.services import gcpause, reconciler, registry
from scheduler_svc.store import models as m
from scheduler_svc.store.ccl import CclRepo
from scheduler_svc.store.coordination import CoordinationRepo
from scheduler_svc.store.jobs import JobRepo
from scheduler_svc.store.types import CommandState, JobMode

router = routing.router(prefix="/v1/jobs", tags=["jobs"])

# A page of /paths: 1,024 ranks is 128 nodes of 8 GPUs, about 250 kB of JSON.
PATHS_PAGE = 1024
PATHS_PAGE_MAX = 8192
AfterRank = Annotated[
    int, Query(ge=-1, le=RANK_MAX, description="Start after this rank (the previous page's last)")
]
PathsLimit = Annotated[int, Query(ge=1, le=PATHS_PAGE_MAX, description="Ranks per page")]
OnNode = Annotated[Name | None, Query(description="Only the ranks on this node")]


def not_ahead(field: str, at: datetime, now: datetime, settings: Settings) -> None:
    """A reported time further ahead of the service's clock than the skew bound is refused:
    a checkpoint dated in the future would make every real one after it look older, and
    the next fault would be decided with t_elapsed 0 (a restart)."""
    skew = settings.observed_at_future_skew_s
    if at > now + timedelta(seconds=skew):
        raise Unprocessable(
            f"{field}: {at.isoformat()} is more than {skew:g} s ahead of the service's clock"
        )


def job_out(session: Session, job: m.Job, ranks: list[RankIn] | None = None) -> JobOut:
    """The job as stored; `ranks`, when the caller has just stored them, spares reading
    them back (65,536 rows for a large job)."""
    if ranks is None:
        # Stored ranks were validated on the way in: built without validating again.
        ranks = [
            RankIn.model_construct(rank=r, node=n, gpu=g)
            for r, n, g in JobRepo(session).rank_tuples(job.job_id)
        ]
    else:
        ranks = sorted(ranks, key=lambda r: r.rank)  # in rank order, as a read gives them
    return JobOut(
        job_id=job.job_id,
        ranks=ranks,
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
        spares_free=job.spares_free,
        node_replace_s=job.node_replace_s,
        nvl_cap_mb=job.nvl_cap_mb,
        notify_url=None if job.notify_url is None else redact(job.notify_url),
        mode=JobMode(job.mode),
        incarnation=job.incarnation,
        created_at=job.created_at,
        communicators=[
            CommunicatorIn(comm_id=c.comm_id, channels=c.channels, ranks=c.ranks)
            for c in registry.communicators_of(session, job.job_id)
        ],
        repair_estimate_s=job.repair_estimate_s,
        measured_k=job.measured_k,
        failed_over_at=job.failed_over_at,
        ccl=None if job.ccl is None else CclIn.model_validate(job.ccl),
        checkpoint_requested_after=registry.checkpoint_requested_after(job),
    )


def decision_out(d: m.Decision) -> DecisionOut:
    out = DecisionOut.model_validate(d, from_attributes=True)
    plan = d.plan or {}
    drop = list(plan.get("drop_nodes") or [])
    return out.model_copy(update={"drop_nodes": drop, "new_dp_size": plan.get("new_dp_size")})


def command_out(c: m.Command) -> CommandOut:
    return CommandOut.model_validate(c, from_attributes=True)


CREATE_JOB_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {
        "model": ErrorBody,
        "description": "The job exists, is not restarting and the post names no newer "
        "incarnation; a communicator is another "
        "job's; or a rank names a GPU another running job holds: the answer names that "
        "job and the GPU (ranks.N.gpu), and posting with replaces set to that job ends it",
    }
}


@router.post(
    "",
    status_code=201,
    operation_id="create_job",
    responses=responses(Unauthorized, Forbidden, Unprocessable) | CREATE_JOB_CONFLICT,
)
def create_job(
    body: JobIn, session: SessionDep, _: FleetAuth, settings: SettingsDep, now: NowDep
) -> JobOut:
    """Register a job: rank placement, checkpoint settings and where to notify.

    Posting a job that is restarting again is its new incarnation, and so is a post naming
    the next incarnation (the fleet manager restarted it for a reason of its own); 409
    otherwise. A GPU another running job holds is refused (409) unless the post replaces
    that job."""
    # Deliveries to a notify_url are always signed: without a secret the job is refused
    # here rather than accepted and never notified.
    if body.notify_url is not None and settings.notify_secret is None:
        raise Unprocessable(
            "notify_url: this service has no RAILOVER_NOTIFY_SECRET to sign deliveries "
            "with; set it, or subscribe under /v1/subscriptions (own secret)"
        )
    not_ahead("last_checkpoint_at", body.last_checkpoint_at, now, settings)
    if body.notify_url is not None:
        check_webhook_url("notify_url", str(body.notify_url), settings)
    with gcpause.paused():  # a whole job's objects, alive until the answer is built
        return job_out(session, registry.create_job(session, body, now, settings), body.ranks)


@router.get("", operation_id="list_jobs", responses=responses(Unauthorized, Forbidden))
def list_jobs(session: SessionDep, _: Reader) -> list[JobOut]:
    """All registered jobs."""
    return [job_out(session, j) for j in registry.list_jobs(session)]


@router.get(
    "/{job_id}", operation_id="get_job", responses=responses(Unauthorized, Forbidden, NotFound)
)
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
    responses=responses(Unauthorized, Forbidden, NotFound, Conflict) | VALIDATION,
)
def report_checkpoint(
    job_id: JobId,
    body: CheckpointIn,
    session: SessionDep,
    _: FleetAuth,
    settings: SettingsDep,
    now: NowDep,
) -> CheckpointOut:
    """Report a checkpoint; the newest one of the running incarnation sets t_elapsed for
    later decisions, and a restarting job's next incarnation's first one says it runs."""
    not_ahead("at", body.at, now, settings)
    current = registry.add_checkpoint(session, job_id, body, now, settings)
    job = registry.get_job(session, job_id)
    return CheckpointOut(
        job_id=job_id,
        at=body.at,
        iteration=body.iteration,
        kind=body.kind,
        current=current,
        checkpoint_requested_after=registry.checkpoint_requested_after(job),
    )


@router.post(
    "/{job_id}/mirror-failures",
    status_code=201,
    operation_id="report_mirror_failure",
    responses=responses(Unauthorized, Forbidden, NotFound)
    | VALIDATION
    | {200: {"description": "Already reported (a replay): nothing applied again"}},
)
def report_mirror_failure(
    job_id: JobId,
    body: MirrorFailureIn,
    *,
    response: Response,
    session: SessionDep,
    who: FleetAuth,
    settings: SettingsDep,
    now: NowDep,
) -> MirrorFailureOut:
    """A checkpoint node could not rebuild this iteration (FlowCheck): the job is asked for a
    normal checkpoint at its next iteration, and restart cost counts from the last one rebuilt."""
    not_ahead("at", body.at, now, settings)
    row, created = registry.add_mirror_failure(
        session, job_id, body, reported_by=who.token_id, now=now, settings=settings
    )
    if not created:
        response.status_code = 200
    job = registry.get_job(session, job_id)
    return MirrorFailureOut(
        id=row.id,
        job_id=job_id,
        iteration=row.iteration,
        at=row.at,
        received_at=row.received_at,
        created=created,
        checkpoint_requested_after=registry.checkpoint_requested_after(job),
    )


@router.get(
    "/{job_id}/decisions",
    operation_id="list_decisions",
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def list_decisions(
    job_id: JobId,
    session: SessionDep,
    _: Reader,
    limit: int = Query(100, ge=1, le=1000),
) -> DecisionList:
    """The job's decisions, newest first, each with its inputs, costs and reason."""
    return DecisionList(
        decisions=[decision_out(d) for d in registry.decisions_of(session, job_id, limit)]
    )


@router.get(
    "/{job_id}/paths",
    operation_id="get_paths",
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def get_paths(
    job_id: JobId,
    session: SessionDep,
    _: Reader,
    settings: SettingsDep,
    now: NowDep,
    *,
    after_rank: AfterRank = -1,
    limit: PathsLimit = PATHS_PAGE,
    node: OnNode = None,
) -> JobPathsOut:
    """Primary and backup RNIC of each rank, whether each works, and the one in use.

    Ranks come in rank order, a page at a time: pass `next_after_rank` back as
    `after_rank` for the next. The job-wide figures (pairs, isolated and failed-over
    ranks) are in every page.
    """
    return reconciler.job_paths(
        session, job_id, now, settings, page=reconciler.RankPage(after_rank, limit, node)
    )


@router.get(
    "/{job_id}/commands",
    operation_id="list_job_commands",
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def list_job_commands(
    job_id: JobId,
    session: SessionDep,
    _: Reader,
    state: Annotated[
        list[CommandState] | None,
        Query(description="Only commands in these states (repeat it); all when left out"),
    ] = None,
) -> CommandList:
    """Every command issued for the job and its delivery state, oldest first; `state`
    narrows it to, say, those still waiting for their ranks (`issued`, `delivered`)."""
    found = registry.commands_of(session, job_id, states=state)
    return CommandList(commands=[command_out(c) for c in found])


@router.post(
    "/{job_id}/iterations",
    operation_id="report_iterations",
    responses=responses(Unauthorized, Forbidden, NotFound) | VALIDATION,
)
def report_iterations(
    job_id: JobId,
    body: IterationsIn,
    session: SessionDep,
    _: FleetAuth,
    settings: SettingsDep,
    now: NowDep,
) -> IterationsOut:
    """Report iteration times; once steady, the measured k replaces the estimate and re-decides."""
    degraded, measured, decision = registry.record_iterations(
        session, job_id, body.iteration_time_s, now, settings
    )
    return IterationsOut(
        job_id=job_id,
        samples=len(body.iteration_time_s),
        degraded=degraded,
        measured_k=measured.k,
        trustworthy=measured.trustworthy,
        detail=measured.reason,
        decision_id=None if decision is None else decision.decision_id,
        checkpoint_requested_after=registry.checkpoint_requested_after(
            registry.get_job(session, job_id)
        ),
    )


@router.get(
    "/{job_id}/progress",
    operation_id="get_progress",
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def get_progress(job_id: JobId, session: SessionDep, _: Reader) -> JobProgressOut:
    """The job's communicators, each rank's ops_done, and collective stalls its CCL reported."""
    registry.get_job(session, job_id)
    coord = CoordinationRepo(session)
    # By unsigned id: the store orders ids >= 2**63 (kept as negative BIGINTs) first.
    comms = sorted(coord.communicators(job_id), key=lambda c: c.comm_id)
    return JobProgressOut(
        job_id=job_id,
        communicators=[
            CommunicatorOut(comm_id=c.comm_id, channels=c.channels, ranks=c.ranks, nranks=c.nranks)
            for c in comms
        ],
        progress=[
            RankProgressOut(
                comm_id=p.comm_id,
                rank=p.rank,
                ops_done=p.ops_done,
                at=p.at,
                rate_ops_per_s=p.rate_ops_per_s,
            )
            for p in coord.progress(job_id)
        ],
        stalls=[
            StallOut(
                node=s.node,
                comm_id=s.comm_id,
                rank=s.rank,
                seq_number=s.seq_number,
                func=s.func,
                open_s=s.open_s,
                observed_at=s.observed_at,
            )
            for s in CclRepo(session).stalls(c.comm_id for c in comms)
        ],
    )
