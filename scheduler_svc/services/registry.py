"""Nodes, jobs, checkpoints and commands: validation that needs the store, then the write."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection
from datetime import datetime

from sqlalchemy.orm import Session

from scheduler_svc import metrics
from scheduler_svc.api.schemas.jobs import CheckpointIn, JobIn, MirrorFailureIn
from scheduler_svc.api.schemas.nodes import NodeIn
from scheduler_svc.config import Settings
from scheduler_svc.engine import coordination as coord
from scheduler_svc.engine.decision import ib_timeout_s
from scheduler_svc.engine.state import Desired
from scheduler_svc.errors import Conflict, NotFound, Unprocessable
from scheduler_svc.services import (
    commands,
    fabric,
    losses,
    node_plans,
    reconciler,
    topology_checks,
)
from scheduler_svc.store import models as m
from scheduler_svc.store.commands import CommandRepo, NodeLook
from scheduler_svc.store.coordination import CoordinationRepo
from scheduler_svc.store.jobs import DecisionRepo, JobRepo
from scheduler_svc.store.nodes import NodeRepo
from scheduler_svc.store.types import CommandKind, CommandState, JobMode

log = logging.getLogger(__name__)


def register_node(
    session: Session, name: str, body: NodeIn, now: datetime, settings: Settings
) -> m.Node:
    """Create or replace a node's topology; what a job used and is now missing is a fault.

    A GPU or RNIC port that disappears opens a topology-loss fault that keeps the
    lost part's description (so paths are still planned on the topology the job
    was placed on, with that part failed); registering it again closes the fault.
    """
    topology_checks.check_pci_unique(body)
    repo = NodeRepo(session)
    before = repo.get(name)
    old_gpus = {} if before is None else {g.index: g for g in before.gpus}
    old_rnics = {} if before is None else {(r.name, r.port): r for r in before.rnics}
    gpus = [g.model_dump() for g in body.gpus]
    rnics = [r.model_dump() for r in body.rnics]
    node, changed = repo.replace_topology(name, gpus, rnics, now)
    if changed:
        # Before this transaction's own reconcile caches plans of the new topology: they are
        # kept under the new stamp, which a rollback takes away for good.
        repo.bump_fleet()
    node_plans.store(node, settings.backup_cap_per_switch)
    new_gpus = {g["index"] for g in gpus}
    new_rnics = {(r["name"], r["port"]) for r in rnics}
    touched = losses.close_returned(session, name, new_gpus, new_rnics, now=now)
    if changed and before is not None:
        touched |= losses.gpus_lost(session, name, old_gpus, new_gpus, now=now)
        touched |= losses.rnics_lost(session, name, old_rnics, new_rnics, now=now)
    if touched or changed:
        reconciler.reconcile_jobs(session, JobRepo(session).job_ids_on_node(name), now, settings)
    if changed:
        fabric.PLANS.keep(session, node, settings.backup_cap_per_switch)
    return node


def get_node(session: Session, name: str) -> m.Node:
    node = NodeRepo(session).get(name)
    if node is None:
        raise NotFound(f"node {name!r} is not registered")
    return node


def list_nodes(session: Session) -> list[m.Node]:
    return list(NodeRepo(session).all())


def create_job(session: Session, body: JobIn, now: datetime, settings: Settings) -> m.Job:
    """Register a job; posting a restarting job again is its new incarnation, and so is a
    post naming the next incarnation of a job the service did not restart."""
    topology_checks.check_merged_nics(session, body)
    jobs = JobRepo(session)
    existing = jobs.lock(body.job_id)
    if existing is not None:
        if existing.mode != JobMode.RESTARTING:
            if body.incarnation is None or body.incarnation <= existing.incarnation:
                raise Conflict(
                    f"job {body.job_id!r} already exists (incarnation {existing.incarnation}); "
                    f"post incarnation {existing.incarnation + 1} if the fleet manager "
                    "restarted it, or DELETE it first to re-register"
                )
            # Restarted for a reason the service never saw (a node died, the program
            # failed): the fleet manager's post naming the next incarnation is its word,
            # as a restart decision would have been.
            existing.mode = JobMode.RESTARTING.value
        return _repost(session, existing, body, now, settings)
    # The job is refused whole: nothing of it is stored.
    _validate_ranks(session, body)
    claim_gpus(session, body)
    timeout = body.timeout_s
    if timeout is None:
        # JobIn's validator guarantees both IB fields when timeout_s is absent.
        timeout = ib_timeout_s(body.ib_timeout or 0, body.ib_retry_cnt or 0)
    job = m.Job(
        job_id=body.job_id,
        created_at=now,
        checkpoint_interval_s=body.checkpoint_interval_s,
        reload_s=body.reload_s,
        detect_s=body.detect_s,
        timeout_s=timeout,
        last_checkpoint_at=body.last_checkpoint_at,
        last_checkpoint_iteration=body.last_checkpoint_iteration,
        slowdown_k=body.slowdown_k,
        comm_share=body.comm_share,
        dp_size=body.dp_size,
        tp_size=body.tp_size,
        pp_size=body.pp_size,
        allow_scaling=body.allow_scaling,
        spare_nodes=body.spare_nodes if body.spares_free is None else body.spares_free > 0,
        spares_free=body.spares_free,
        node_replace_s=body.node_replace_s,
        nvl_cap_mb=body.nvl_cap_mb,
        notify_url=None if body.notify_url is None else str(body.notify_url),
        mode=JobMode.NORMAL.value,
        decision_count=0,
        placement_id=uuid.uuid4().hex,
        incarnation=body.incarnation or 1,
    )
    job.repair_estimate_s = body.repair_estimate_s
    job.ccl = None if body.ccl is None else body.ccl.model_dump(mode="json")
    taken = CoordinationRepo(session).jobs_of_comm(c.comm_id for c in body.communicators)
    if taken:
        comm_id, other = next(iter(taken.items()))
        raise Conflict(f"communicators: comm_id {comm_id} is already registered by job {other!r}")
    placed = [(r.rank, r.node, r.gpu) for r in body.ranks]
    jobs.add(job, placed)
    reconciler.INDEXES.seed(session, job, placed)
    session.add_all(
        m.Communicator(
            job_id=body.job_id, comm_id=c.comm_id, channels=c.channels, ranks=c.ranks, epoch=0
        )
        for c in body.communicators
    )
    # Faults may already be open on its nodes: the job starts under them.
    reconciler.reconcile_jobs(session, [job.job_id], now, settings)
    return job


def _validate_ranks(session: Session, body: JobIn) -> None:
    nodes = NodeRepo(session)
    wanted = {r.node for r in body.ranks}
    gpus = nodes.gpus_of(wanted)
    if len(gpus) < len(wanted):  # which of the others are registered (with no GPU)
        gpus = nodes.gpu_indexes(wanted)
    problems = []
    for i, r in enumerate(body.ranks):
        on_node = gpus.get(r.node)
        if on_node is None:
            problems.append(f"ranks[{i}].node: node {r.node!r} is not registered")
        elif r.gpu not in on_node:
            problems.append(f"ranks[{i}].gpu: node {r.node!r} has no GPU {r.gpu}")
        if len(problems) >= 20:
            problems.append("... (first 20 problems shown)")
            break
    if problems:
        raise Unprocessable(problems)


def claim_gpus(session: Session, body: JobIn) -> None:
    """The job's ranks may only name GPUs no other running job holds (Conflict otherwise,
    naming the holder and a GPU), unless the post says it `replaces` that job: the one it
    names is then ended as DELETE ends a job, before this one is placed.

    Two jobs on one GPU would each take the other's processes for its own: the agent
    tells jobs' processes apart by what they announce, and a CCL that names no job only
    by rank numbers, which both jobs use. Checked under the placement lock, so two
    posts at once cannot both take a GPU. A `replaces` naming a job that no longer
    exists ends nothing.
    """
    jobs = JobRepo(session)
    jobs.lock_placement()
    if body.replaces is not None:
        replaced = jobs.lock(body.replaces)
        if replaced is not None:
            jobs.delete(replaced)
    held = jobs.gpu_holders({r.node for r in body.ranks}, besides=body.job_id)
    if not held:
        return
    for i, r in enumerate(body.ranks):
        holder = held.get((r.node, r.gpu))
        if holder is not None:
            raise Conflict(
                f"ranks[{i}].gpu: GPU {r.gpu} of node {r.node!r} is held by running job "
                f"{holder!r}; end it first (DELETE /v1/jobs/{holder}), or post this job "
                f'with "replaces": "{holder}"'
            )


def _repost(session: Session, job: m.Job, body: JobIn, now: datetime, settings: Settings) -> m.Job:
    """The fleet manager restarted the job under the same id: a new incarnation.

    Placement, layout (a scaled restart comes back at its new DP size) and checkpoint
    come from the new post; the decision history, and with it the restart verdicts and
    the repair clock of the faults still open, stay.
    """
    if body.incarnation is not None and body.incarnation <= job.incarnation:
        raise Conflict(
            f"incarnation: job {job.job_id!r} ended incarnation {job.incarnation}; post "
            f"incarnation {job.incarnation + 1} or later (or leave it out)"
        )
    _validate_ranks(session, body)
    claim_gpus(session, body)
    taken = {
        c: j
        for c, j in CoordinationRepo(session)
        .jobs_of_comm(c.comm_id for c in body.communicators)
        .items()
        if j != job.job_id
    }
    if taken:
        comm_id, other = next(iter(taken.items()))
        raise Conflict(f"communicators: comm_id {comm_id} is already registered by job {other!r}")
    placed = [(r.rank, r.node, r.gpu) for r in body.ranks]
    JobRepo(session).replace_ranks(job, placed)
    job.placement_id = uuid.uuid4().hex
    reconciler.INDEXES.seed(session, job, placed)
    job.last_checkpoint_at = body.last_checkpoint_at
    job.last_checkpoint_iteration = body.last_checkpoint_iteration
    job.dp_size, job.tp_size, job.pp_size = body.dp_size, body.tp_size, body.pp_size
    job.allow_scaling = body.allow_scaling
    # The new incarnation resumed from the posted checkpoint and FlowCheck rebuilds from
    # it afresh: the iterations the old one lost are no longer behind its newest one.
    JobRepo(session).clear_mirror_failures(job.job_id)
    # Epochs go on from the ended incarnation's: (communicator, epoch) names one plan.
    epochs = {c.comm_id: c.epoch for c in CoordinationRepo(session).communicators(job.job_id)}
    for c in list(CoordinationRepo(session).communicators(job.job_id)):
        session.delete(c)
    session.flush()
    session.add_all(
        m.Communicator(
            job_id=job.job_id,
            comm_id=c.comm_id,
            channels=c.channels,
            ranks=c.ranks,
            epoch=max(epochs.get(c.comm_id, 0), commands.max_epoch(session, job.job_id, c.comm_id)),
        )
        for c in body.communicators
    )
    start_incarnation(session, job, body.incarnation or job.incarnation + 1, now)
    session.flush()
    reconciler.reconcile_jobs(session, [job.job_id], now, settings)
    return job


def start_incarnation(session: Session, job: m.Job, incarnation: int, now: datetime) -> None:
    """A restarting job runs again as `incarnation`: what is still on its way to the ended
    one (its ABORTs above all) is withdrawn, so none reaches the new processes, and the
    ended one's op counts are forgotten."""
    for cmd in CommandRepo(session).job_commands(
        job.job_id, [k.value for k in CommandKind], commands.WAITING
    ):
        commands.transition(session, cmd, CommandState.SUPERSEDED, now)
    job.incarnation = incarnation
    job.incarnation_started_at = now
    # The new processes count their collectives from their own start: the ended
    # incarnation's op counts would put every switch point far ahead of them.
    CoordinationRepo(session).clear_progress(job.job_id)
    # Still restarting, with no restart time: reconcile starts the new incarnation.
    job.restart_decided_at = None
    log.info("job %s: incarnation %d starts", job.job_id, incarnation)


def list_jobs(session: Session) -> list[m.Job]:
    return list(JobRepo(session).all())


def communicators_of(session: Session, job_id: str) -> list[m.Communicator]:
    return list(CoordinationRepo(session).communicators(job_id))


def decisions_of(session: Session, job_id: str, limit: int) -> list[m.Decision]:
    """The job's decisions, newest first (NotFound for an unknown job)."""
    get_job(session, job_id)
    return list(DecisionRepo(session).for_job(job_id, limit))


def commands_of(
    session: Session, job_id: str, states: Collection[CommandState] | None = None
) -> list[m.Command]:
    get_job(session, job_id)
    return list(CommandRepo(session).for_job(job_id, states))


def get_job(session: Session, job_id: str) -> m.Job:
    job = JobRepo(session).get(job_id)
    if job is None:
        raise NotFound(f"job {job_id!r} does not exist")
    return job


def lock_job(session: Session, job_id: str) -> m.Job:
    """The job under its row lock (the one decisions serialise on), or NotFound."""
    job = JobRepo(session).lock(job_id)
    if job is None:
        raise NotFound(f"job {job_id!r} does not exist")
    return job


def delete_job(session: Session, job_id: str) -> None:
    JobRepo(session).delete(get_job(session, job_id))


def add_checkpoint(
    session: Session, job_id: str, body: CheckpointIn, now: datetime, settings: Settings
) -> bool:
    """Record a checkpoint; it becomes the newest usable one unless an older report arrives late.

    A failed-over job that checkpoints is re-decided: a clean restart now may
    beat running degraded until the repair.
    """
    job = lock_job(session, job_id)
    incarnation = checkpoint_incarnation(job, body)
    cp = m.Checkpoint(
        job_id=job_id,
        at=body.at,
        iteration=body.iteration,
        kind=body.kind,
        received_at=now,
        incarnation=incarnation,
    )
    JobRepo(session).add_checkpoint(cp)
    if incarnation < job.incarnation or (
        incarnation == job.incarnation and job.mode == JobMode.RESTARTING
    ):
        return False  # an ended incarnation's: history, nothing of the job changes
    if incarnation > job.incarnation:
        # The restart acknowledged: the next incarnation runs, on the same placement.
        start_incarnation(session, job, incarnation, now)
    if body.spares_free is not None:  # the fleet manager's word on spares, as of now
        job.spare_nodes, job.spares_free = body.spares_free > 0, body.spares_free
    elif body.spare_nodes is not None:
        job.spare_nodes, job.spares_free = body.spare_nodes, None
    current = body.at > job.last_checkpoint_at
    if current:
        job.last_checkpoint_at = body.at
        job.last_checkpoint_iteration = body.iteration
        job.last_checkpoint_kind = body.kind
    # A checkpoint is the fleet manager's word that the job runs (a restarting job's new
    # incarnation) and, while failed over, a moment to restart cleanly: reconcile says.
    reconciler.reconcile_job(session, job, now, settings)
    return current


def checkpoint_incarnation(job: m.Job, body: CheckpointIn) -> int:
    """The incarnation a checkpoint belongs to, by what it says (never by when it came).

    Named, it is that one; a number beyond the next is Conflict (no such incarnation can
    have run), and so is the next while the job is not restarting. Unnamed, it is the
    job's current incarnation, except that a restarting job's checkpoint taken after the
    restart decision is the next one's (the restarted job reporting in).
    """
    restarting = job.mode == JobMode.RESTARTING
    if body.incarnation is None:
        after = job.restart_decided_at is not None and body.at > job.restart_decided_at
        return job.incarnation + 1 if restarting and after else job.incarnation
    if body.incarnation > job.incarnation + (1 if restarting else 0):
        raise Conflict(
            f"incarnation: job {job.job_id!r} runs incarnation {job.incarnation}"
            + ("" if restarting else " and is not restarting")
            + f"; incarnation {body.incarnation} has not started (post the job again)"
        )
    return body.incarnation


def add_mirror_failure(
    session: Session,
    job_id: str,
    body: MirrorFailureIn,
    *,
    reported_by: str | None,
    now: datetime,
    settings: Settings,
) -> tuple[m.MirrorFailure, bool]:
    """Record that a checkpoint node could not rebuild an iteration; reconcile the job.

    The failure is evidence: reconcile then wants a normal checkpoint after that
    iteration, which goes out as a checkpoint_now command and a CloudEvent. A report of
    an iteration already recorded (a replay, or a second checkpoint node) changes
    nothing and returns the stored one with created False.
    """
    job = lock_job(session, job_id)
    repo = JobRepo(session)
    known = repo.mirror_failure(job_id, body.iteration)
    if known is not None:
        return known, False
    row = m.MirrorFailure(
        job_id=job_id,
        iteration=body.iteration,
        at=body.at,
        received_at=now,
        reported_by=reported_by,
    )
    repo.add_mirror_failure(row)
    metrics.MIRROR_FAILURES.inc()
    reconciler.reconcile_job(session, job, now, settings)
    return row, True


def checkpoint_requested_after(job: m.Job) -> int | None:
    """What the last reconcile pass wanted: a checkpoint newer than this iteration."""
    return Desired.from_json(job.desired).checkpoint_after


def record_iterations(
    session: Session, job_id: str, seconds: list[float], now: datetime, settings: Settings
) -> tuple[bool, coord.MeasuredK, m.Decision | None]:
    """Keep healthy and failed-over iteration times; a steady k is evidence for reconcile.

    Returns (degraded, the measurement, the re-decision it caused if any).
    """
    job = lock_job(session, job_id)
    repo = CoordinationRepo(session)
    degraded = job.mode == JobMode.FAILED_OVER
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
        return degraded, measured, None
    job.measured_k = measured.k
    return degraded, measured, reconciler.reconcile_job(session, job, now, settings)


def look_for_node(session: Session, node: str, include_unacked: bool) -> NodeLook:
    """A poll's one read: whether commands wait for the node, and whether it is held
    unreachable (services/reach.py clears that when its agent is the one polling)."""
    return CommandRepo(session).look(node, include_unacked)


def take_commands(
    session: Session, node: str, now: datetime, include_unacked: bool = False
) -> list[m.Command]:
    return commands.take_for_node(session, node, now, include_unacked)


def other_jobs_ranks(session: Session, node: str, cmds: list[m.Command]) -> dict[int, list[int]]:
    """Per command: the rank numbers other jobs hold on its node (sorted), for the agent to
    tell whether a plugin client that named no job can be this command's job's process."""
    if not cmds:
        return {}
    held = JobRepo(session).ranks_on_node(node)
    return {
        c.command_id: sorted({r for job, ranks in held.items() if job != c.job_id for r in ranks})
        for c in cmds
    }
