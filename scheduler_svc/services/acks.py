"""Acknowledgements from the ranks: the command state machine, and what a refusal means.

`applied` from every addressed rank settles a command. `too_late` (the rank was
already past the switch point, at `ops_done`) proposes the same plan later under
a new epoch. `failed` of an optional mitigation (an NVL transit, a fail-back) is
fallen back from (services/refusals.py); of a move (a failover, a channel plan) it
means those ranks cannot do what they were told: their node counts as unreachable,
which is evidence like any fault, and the job is reconciled under it. Any ack from
the node's agent is also word that the node is reachable (services/reach.py).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from scheduler_svc import metrics
from scheduler_svc.api.schemas.commands import AckIn
from scheduler_svc.config import Settings
from scheduler_svc.engine.fabric import WHOLE_DEVICE, FaultKind
from scheduler_svc.errors import NotFound, Unprocessable
from scheduler_svc.services import commands, reach, reconciler, refusals
from scheduler_svc.store import models as m
from scheduler_svc.store.commands import CommandRepo
from scheduler_svc.store.faults import FaultRepo
from scheduler_svc.store.jobs import JobRepo
from scheduler_svc.store.types import (
    SETTLED,
    UNREACHABLE_DEVICE,
    AckStatus,
    CommandKind,
    CommandState,
)
from scheduler_svc.store.uow import notify_nodes


def ack_command(
    session: Session,
    command_id: int,
    body: AckIn,
    now: datetime,
    settings: Settings,
    *,
    agent: str | None = None,
) -> m.Command:
    """Record the ack; `agent` names the node's agent when it is the one answering."""
    repo = CommandRepo(session)
    cmd = _addressed_command(repo, command_id, body)
    answering = body.answering()
    status = AckStatus(body.status)
    if agent is not None:
        # Heard from before anything else is locked (its jobs, in the one sorted order),
        # and before this ack's own meaning: a refusal may make the node unreachable anew.
        how = f"{agent} acknowledged command {command_id} ({status.value})"
        reach.heard_from(session, body.node, reach.How.ACK, how, now=now, settings=settings)
    job = None
    if status in (AckStatus.FAILED, AckStatus.TOO_LATE):
        # A refusal may re-trigger or reconcile under the job's row lock, and a re-trigger
        # holding that lock supersedes the job's commands; touching this command first and
        # the job second deadlocks two acks on PostgreSQL. Lock in the re-trigger's order,
        # then re-read what the lock holder may have changed.
        job = JobRepo(session).lock(cmd.job_id)
        session.refresh(cmd)
    repo.add_acks(
        m.CommandAck(
            command_id=command_id,
            node=body.node,
            rank=rank,
            status=status.value,
            detail=body.detail,
            ops_done=body.ops_done,
            at=now,
        )
        for rank in answering
    )
    metrics.COMMAND_ACKS.labels(status=status.value).inc(len(answering))
    if CommandState(cmd.state) not in SETTLED:
        _settle(session, repo, cmd, job, body, now=now, settings=settings)
    return cmd


def _addressed_command(repo: CommandRepo, command_id: int, body: AckIn) -> m.Command:
    """The command the ack is for, if it was sent to the answering node and its ranks."""
    cmd = repo.get(command_id)
    if cmd is None:
        raise NotFound(f"command {command_id} does not exist")
    if cmd.node != body.node:
        raise Unprocessable(
            f"node: command {command_id} was sent to {cmd.node!r}, not {body.node!r}"
        )
    if cmd.ranks:
        strangers = [r for r in body.answering() if r is not None and r not in cmd.ranks]
        if strangers:
            field = "ranks" if body.ranks is not None else "rank"
            raise Unprocessable(
                f"{field}: rank {strangers[0]} is not addressed by command {command_id}"
            )
    return cmd


def _settle(
    session: Session,
    repo: CommandRepo,
    cmd: m.Command,
    job: m.Job | None,
    body: AckIn,
    *,
    now: datetime,
    settings: Settings,
) -> None:
    """Move a command not yet settled on by what its ranks answered (`job` is locked for a
    refusal, and only then)."""
    status = AckStatus(body.status)
    if status == AckStatus.TOO_LATE:
        commands.transition(session, cmd, CommandState.FAILED, now)
        if job is not None:
            commands.retrigger(
                session, job, cmd, passed_ops=body.ops_done or 0, now=now, settings=settings
            )
        return
    if status == AckStatus.FAILED:
        commands.transition(session, cmd, CommandState.FAILED, now)
        detail = body.detail or "no detail"
        why = f"{cmd.kind} command {cmd.command_id} failed on {cmd.node} ({detail})"
        if job is not None and cmd.kind in refusals.OPTIONAL:
            refusals.refused(session, job, cmd, why, now=now, settings=settings)
        elif job is not None and cmd.kind not in NOT_A_MOVE:
            cannot_move(session, cmd, why, now, settings)
        return
    if status == AckStatus.APPLIED:
        applied = set(body.answering())  # most acks speak for all the command's ranks at once
        if None not in applied and not set(cmd.ranks) <= applied:
            applied = {a.rank for a in repo.acks(cmd.command_id) if a.status == AckStatus.APPLIED}
        if None in applied or set(cmd.ranks) <= applied:
            commands.transition(session, cmd, CommandState.APPLIED, now)
        else:
            commands.transition(session, cmd, CommandState.DELIVERED, now)
        return
    commands.transition(session, cmd, CommandState.DELIVERED, now)


# Kinds whose failure says nothing about whether the ranks' traffic can move.
NOT_A_MOVE = (CommandKind.ABORT, CommandKind.CHECKPOINT_NOW)


def cannot_move(
    session: Session, cmd: m.Command, why: str, now: datetime, settings: Settings
) -> None:
    """Ranks that cannot be moved: their node is unreachable evidence; reconcile its jobs.

    An abort needs nothing more: the job is already restarting. A checkpoint request
    moves no traffic: a rank that cannot take one says nothing about its paths (the
    CloudEvent asked the fleet manager too). The evidence lasts until the node's agent
    is heard from again (services/reach.py).
    """
    if cmd.kind in NOT_A_MOVE:
        return
    fault = FaultRepo(session).open_if_new(
        m.Fault(
            node=cmd.node,
            device=UNREACHABLE_DEVICE,
            port=WHOLE_DEVICE,
            kind=FaultKind.UNREACHABLE.value,
            opened_at=now,
            last_error_at=now,
            first_event_id=f"command:{cmd.command_id}",
            detail={"reason": why, "command_id": cmd.command_id},
        )
    )
    if fault is not None:
        metrics.FAULTS_OPENED.labels(kind=FaultKind.UNREACHABLE.value).inc()
        # Wake the node's polls as a command would: a renewal that would have skipped its
        # look (nothing new since its last empty one) must look, and so be heard.
        notify_nodes(session, [cmd.node])
        # Evidence on the node: every job with a rank there, not only the command's.
        jobs = JobRepo(session).job_ids_on_nodes({cmd.node})
        reconciler.reconcile_jobs(session, sorted({cmd.job_id, *jobs}), now, settings)
        return
    reconciler.reconcile_jobs(session, [cmd.job_id], now, settings)
