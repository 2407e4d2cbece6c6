"""Optional mitigations the ranks refused: the job falls back, it is never restarted for it.

An NVL transit, channel weights or a fail-back acknowledged `failed` says the ranks cannot take that
mitigation, not that their traffic cannot move: they still run what they ran before it,
s-Bond on their backups. So the refusal is recorded in the job's desired state, where
reconcile reads it (engine.reconcile.refusals), never as evidence against the node:

- NVL_TRANSIT refused (a plugin of ABI 1, say): the communicator runs s-Bond only. Its
  transit commands still on their way are withdrawn, the refusing ranks' transit GPUs
  leave what they were told, and the communicator is not asked for a transit again
  until the job restarts.
- FAILBACK refused: no rank applies the switch point (its siblings on other nodes are
  withdrawn), and the ranks it was returning stay on their backup in the desired and in
  the commanded state alike (those whose FAILOVER it had withdrawn on its way never left
  their primary: they are not held), so the views and the commands agree and nothing is sent
  again. The fail-back is tried again once the damping period
  (RAILOVER_FAILBACK_DAMPING_S) has passed: reconcile_job leaves the job due then, and
  the coordinator's sweep reconciles it.

- BALANCE refused (a plugin that rejects the weights): the switch point is withdrawn on
  every node, and the communicator runs the DCR plan instead (a REBALANCE with the same
  disabled channels, sent at once), and is not asked for weights again until the job
  restarts.

FAILOVER and REBALANCE failures keep their meaning (acks.cannot_move), as do an ABORT's
and a CHECKPOINT_NOW's (nothing more).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime

from sqlalchemy.orm import Session

from scheduler_svc import metrics
from scheduler_svc.config import Settings
from scheduler_svc.engine.intents import failback_refused, transit_refused
from scheduler_svc.engine.state import Desired, HeldBack
from scheduler_svc.services import commands, reconciler
from scheduler_svc.store import models as m
from scheduler_svc.store.commands import CommandRepo
from scheduler_svc.store.types import CommandKind, CommandState

log = logging.getLogger(__name__)

# Kinds whose failure is a refusal to fall back from, not a node that cannot move.
OPTIONAL = (CommandKind.NVL_TRANSIT, CommandKind.FAILBACK, CommandKind.BALANCE)


def refused(
    session: Session,
    job: m.Job,
    cmd: m.Command,
    why: str,
    *,
    now: datetime,
    settings: Settings,
) -> None:
    """Ranks refused `cmd` (one of OPTIONAL, failed now): record it, reconcile the locked job."""
    if cmd.kind == CommandKind.NVL_TRANSIT:
        _transit(session, job, cmd, why, now)
    elif cmd.kind == CommandKind.BALANCE:
        _balance(session, job, cmd, why, now)
    else:
        _failback(session, job, cmd, why, now=now, settings=settings)
    metrics.MITIGATIONS_REFUSED.labels(kind=cmd.kind).inc()
    log.warning("job %s: %s; falling back", job.job_id, why)
    reconciler.reconcile_jobs(session, [job.job_id], now, settings)


def _transit(session: Session, job: m.Job, cmd: m.Command, why: str, now: datetime) -> None:
    desired = Desired.from_json(job.desired)
    job.desired = replace(desired, no_transit={**desired.no_transit, cmd.comm_id: why}).to_json()
    ranks = set(cmd.ranks) | _withdraw(session, job, cmd, now, same_epoch=False)
    told = transit_refused(Desired.from_json(job.commanded), cmd.comm_id, ranks)
    job.commanded = told.to_json()


def _balance(session: Session, job: m.Job, cmd: m.Command, why: str, now: datetime) -> None:
    """The switch point is off on every node (none applies a plan some refused); the
    communicator's next plan, sent at once, is its DCR plan."""
    desired = Desired.from_json(job.desired)
    job.desired = replace(desired, no_balance={**desired.no_balance, cmd.comm_id: why}).to_json()
    _withdraw(session, job, cmd, now, same_epoch=True)


def _withdraw(
    session: Session, job: m.Job, cmd: m.Command, now: datetime, *, same_epoch: bool
) -> set[int]:
    """Withdraw the commands of `cmd`'s kind still on their way to its communicator (of
    its epoch alone, when `same_epoch`); the ranks they addressed."""
    ranks: set[int] = set()
    for other in CommandRepo(session).comm_commands(
        job.job_id, cmd.comm_id, [cmd.kind], commands.WAITING
    ):
        if same_epoch and other.epoch != cmd.epoch:
            continue
        if commands.transition(session, other, CommandState.SUPERSEDED, now):
            ranks |= set(other.ranks)
    return ranks


def _failback(
    session: Session,
    job: m.Job,
    cmd: m.Command,
    why: str,
    *,
    now: datetime,
    settings: Settings,
) -> None:
    siblings = CommandRepo(session).switch_points(
        job.job_id, CommandKind.FAILBACK.value, {(cmd.comm_id, cmd.epoch)}
    )
    for other in siblings:
        commands.transition(session, other, CommandState.SUPERSEDED, now)
    members = {r for c in siblings for r in c.ranks}
    returning = (commands.returning_of(session, siblings or [cmd]) or set()) & members
    ranks = tuple(sorted(commands.left_their_primary(session, job, returning)))
    if not ranks:
        return  # nobody of it was ever moved (or no record of who was): nobody to hold
    desired = Desired.from_json(job.desired)
    others = tuple(h for h in desired.held if h.comm_id != cmd.comm_id)
    job.desired = replace(desired, held=(*others, HeldBack(cmd.comm_id, ranks, now, why))).to_json()
    # What the ranks still run is what reconcile holds them on: the commanded state says so.
    _, _, out = reconciler.current(session, job, now, settings)
    told = failback_refused(Desired.from_json(job.commanded), out.desired, cmd.comm_id, ranks)
    job.commanded = told.to_json()
