"""Nodes, jobs, checkpoints and commands: validation that needs the store, then the write."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from scheduler_svc import metrics
from scheduler_svc.config import Settings
from scheduler_svc.engine.decision import ib_timeout_s
from scheduler_svc.errors import Conflict, NotFound, Unprocessable
from scheduler_svc.fleet import emit_command_change
from scheduler_svc.schemas import AckIn, CheckpointIn, JobIn, NodeIn
from scheduler_svc.services import redecide
from scheduler_svc.store import models as m
from scheduler_svc.store.repositories import CommandRepo, CoordinationRepo, JobRepo, NodeRepo


def register_node(session: Session, name: str, body: NodeIn, now: datetime) -> m.Node:
    gpus = [g.model_dump() for g in body.gpus]
    rnics = [r.model_dump() for r in body.rnics]
    node, _changed = NodeRepo(session).replace_topology(name, gpus, rnics, now)
    return node


def get_node(session: Session, name: str) -> m.Node:
    node = NodeRepo(session).get(name)
    if node is None:
        raise NotFound(f"node {name!r} is not registered")
    return node


def list_nodes(session: Session) -> list[m.Node]:
    return list(NodeRepo(session).all())


def create_job(session: Session, body: JobIn, now: datetime) -> m.Job:
    jobs = JobRepo(session)
    if jobs.get(body.job_id) is not None:
        raise Conflict(f"job {body.job_id!r} already exists; DELETE it first to re-register")
    nodes = NodeRepo(session).get_many({r.node for r in body.ranks})
    problems = []
    for i, r in enumerate(body.ranks):
        node = nodes.get(r.node)
        if node is None:
            problems.append(f"ranks[{i}].node: node {r.node!r} is not registered")
        elif r.gpu not in {g.index for g in node.gpus}:
            problems.append(f"ranks[{i}].gpu: node {r.node!r} has no GPU {r.gpu}")
        if len(problems) >= 20:
            problems.append("... (first 20 problems shown)")
            break
    if problems:
        # The job is refused whole: nothing of it is stored.
        raise Unprocessable(problems)
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
        spare_nodes=body.spare_nodes,
        node_replace_s=body.node_replace_s,
        notify_url=None if body.notify_url is None else str(body.notify_url),
        mode="normal",
        decision_count=0,
    )
    job.ranks = [
        m.JobRank(job_id=body.job_id, rank=r.rank, node=r.node, gpu=r.gpu) for r in body.ranks
    ]
    job.repair_estimate_s = body.repair_estimate_s
    job.ccl = None if body.ccl is None else body.ccl.model_dump(mode="json")
    taken = CoordinationRepo(session).jobs_of_comm(c.comm_id for c in body.communicators)
    if taken:
        comm_id, other = next(iter(taken.items()))
        raise Conflict(f"communicators: comm_id {comm_id} is already registered by job {other!r}")
    jobs.add(job)
    session.add_all(
        m.Communicator(
            job_id=body.job_id, comm_id=c.comm_id, channels=c.channels, ranks=c.ranks, epoch=0
        )
        for c in body.communicators
    )
    return job


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
    cp = m.Checkpoint(
        job_id=job_id, at=body.at, iteration=body.iteration, kind=body.kind, received_at=now
    )
    JobRepo(session).add_checkpoint(cp)
    if body.at <= job.last_checkpoint_at:
        return False
    job.last_checkpoint_at = body.at
    job.last_checkpoint_iteration = body.iteration
    job.last_checkpoint_kind = body.kind
    if job.mode == "failed_over":
        redecide.on_checkpoint(session, job, cp, now, settings)
    return True


def has_pending_commands(session: Session, node: str, include_unacked: bool) -> bool:
    return CommandRepo(session).has_pending(node, include_unacked)


def take_commands(
    session: Session, node: str, now: datetime, include_unacked: bool = False
) -> list[m.Command]:
    """Commands not yet delivered to the node (with `include_unacked`, also delivered ones
    still waiting for an acknowledgement), marking new ones delivered.

    Delivery is at least once: an agent that lost a delivered command asks again
    with `include_unacked` when it starts, and a command nobody acknowledges by
    its deadline is re-issued under a new id (see services.sweeps).
    """
    cmds = list(CommandRepo(session).pending_for_node(node, include_unacked))
    for c in cmds:
        if c.state == "issued":
            c.state = "delivered"
            c.delivered_at = now
            emit_command_change(session, c)
    return cmds


def ack_command(
    session: Session, command_id: int, body: AckIn, now: datetime, settings: Settings
) -> m.Command:
    repo = CommandRepo(session)
    cmd = repo.get(command_id)
    if cmd is None:
        raise NotFound(f"command {command_id} does not exist")
    if cmd.node != body.node:
        raise Unprocessable(
            f"node: command {command_id} was sent to {cmd.node!r}, not {body.node!r}"
        )
    if body.rank is not None and cmd.ranks and body.rank not in cmd.ranks:
        raise Unprocessable(f"rank: rank {body.rank} is not addressed by command {command_id}")
    if body.status == "failed":
        # A failed ack may re-trigger or re-decide under the job's row lock, and a
        # re-trigger holding that lock supersedes the job's commands; touching this
        # command first and the job second deadlocks two acks on PostgreSQL. Lock in
        # the re-trigger's order, then re-read what the lock holder may have changed.
        JobRepo(session).lock(cmd.job_id)
        session.refresh(cmd)
    repo.add_ack(
        m.CommandAck(
            command_id=command_id,
            node=body.node,
            rank=body.rank,
            status=body.status,
            detail=body.detail,
            at=now,
        )
    )
    metrics.COMMAND_ACKS.labels(status=body.status).inc()
    if cmd.state in ("superseded", "failed", "applied"):
        return cmd
    if body.status == "failed":
        cmd.state, cmd.completed_at = "failed", now
        emit_command_change(session, cmd)
        redecide.after_failed_ack(session, cmd, body.detail, now, settings)
        return cmd
    if body.status == "applied":
        applied = {a.rank for a in repo.acks(command_id) if a.status == "applied"}
        if body.rank is None or None in applied or set(cmd.ranks) <= applied:
            cmd.state, cmd.completed_at = "applied", now
    elif cmd.state == "issued":
        cmd.state, cmd.delivered_at = "delivered", now
    emit_command_change(session, cmd)  # only if the state changed above
    return cmd
