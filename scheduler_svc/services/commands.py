"""Commands: one state machine for every transition, and sending what reconcile asks for.

Every change of a command's state goes through `transition`, which stamps it and
writes the io.railover.command.<state> outbox event in the same transaction.
`issue` turns the engine's intents (engine.intents.command_diff) into rows:
failovers and NVL transits at once, channel changes (DCR, balance with its
weights) and fail-backs at one switch point per communicator, aborts to every node.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from scheduler_svc import metrics
from scheduler_svc.config import Settings
from scheduler_svc.engine import coordination as coord
from scheduler_svc.engine.intents import Intent, IntentKind
from scheduler_svc.engine.state import IMPLICIT_COMM
from scheduler_svc.fleet import emit_command_change
from scheduler_svc.store import models as m
from scheduler_svc.store import types as store_types
from scheduler_svc.store.commands import CommandRepo
from scheduler_svc.store.coordination import CoordinationRepo
from scheduler_svc.store.types import CommandKind, CommandState
from scheduler_svc.store.uow import notify_nodes

log = logging.getLogger(__name__)

SWITCH_KINDS = tuple(k.value for k in store_types.SWITCH_KINDS)
WAITING = tuple(s.value for s in store_types.WAITING)
ALL_KINDS = tuple(k.value for k in CommandKind)
_ALLOWED: dict[CommandState, tuple[CommandState, ...]] = {
    CommandState.ISSUED: (
        CommandState.DELIVERED,
        CommandState.APPLIED,
        CommandState.SUPERSEDED,
        CommandState.FAILED,
    ),
    CommandState.DELIVERED: (CommandState.APPLIED, CommandState.SUPERSEDED, CommandState.FAILED),
}


def transition(session: Session, cmd: m.Command, to: CommandState, now: datetime) -> bool:
    """Move a command to `to` if that is a legal step; announce it. False when it is not."""
    current = CommandState(cmd.state)
    if to not in _ALLOWED.get(current, ()):
        return False
    cmd.state = to.value
    if to == CommandState.DELIVERED:
        cmd.delivered_at = now
    elif to in (CommandState.APPLIED, CommandState.FAILED):
        cmd.completed_at = now
    emit_command_change(session, cmd)
    if to == CommandState.FAILED:
        metrics.COMMANDS_FAILED.labels(kind=cmd.kind).inc()
    return True


def issue(
    session: Session,
    job: m.Job,
    intents: Sequence[Intent],
    rank_nodes: Mapping[int, str],
    *,
    decision_id: str | None,
    now: datetime,
    settings: Settings,
) -> list[m.Command]:
    """Rows for the engine's intents; switch points for the coordinated ones.

    Each intent takes the next epoch of its communicator: one sequence per communicator
    over every kind and every incarnation, so (communicator, epoch) names one plan, and a
    later command is always of a newer epoch than what it follows.
    """
    made: list[m.Command] = []
    if any(i.kind == IntentKind.ABORT for i in intents):
        _supersede_moves(session, job, now)
    for intent in intents:
        if intent.kind == IntentKind.FAILBACK and intent.returning:
            _withdraw_moves(session, job, set(intent.returning), now, settings)
        if intent.coordinated:
            made += switch_point(
                session,
                job,
                comm_id=intent.comm_id,
                ranks=list(intent.ranks),
                rank_nodes=rank_nodes,
                kind=CommandKind(intent.kind.value),
                disabled_channels=list(intent.disabled_channels),
                channel_weights=list(intent.weights),
                split_ratio=intent.split_ratio if intent.weights else None,
                returning=list(intent.returning) if intent.kind == IntentKind.FAILBACK else None,
                decision_id=decision_id,
                now=now,
                settings=settings,
            )
            continue
        made += _issue_to_nodes(
            session, job, intent, rank_nodes, decision_id=decision_id, now=now, settings=settings
        )
    return made


def _supersede_moves(session: Session, job: m.Job, now: datetime) -> None:
    """A restart overrides every move still on its way."""
    for cmd in CommandRepo(session).job_commands(
        job.job_id, [k.value for k in CommandKind if k != CommandKind.ABORT], WAITING
    ):
        transition(session, cmd, CommandState.SUPERSEDED, now)


def _issue_to_nodes(
    session: Session,
    job: m.Job,
    intent: Intent,
    rank_nodes: Mapping[int, str],
    *,
    decision_id: str | None,
    now: datetime,
    settings: Settings,
) -> list[m.Command]:
    """An intent no switch point coordinates: one row per node of its ranks, of a new epoch."""
    transit = dict(intent.transit)
    if intent.kind == IntentKind.CHECKPOINT_NOW:
        # One request stands: a newer failed iteration replaces the older ask.
        withdraw(session, job, CommandKind.CHECKPOINT_NOW, now)
    by_node = _ranks_by_node(intent.ranks, rank_nodes)
    if not by_node:
        return []
    epoch = next_epoch(session, job, intent.comm_id)
    rows = [
        m.Command(
            node=node,
            job_id=job.job_id,
            decision_id=decision_id,
            kind=intent.kind.value,
            epoch=epoch,
            comm_id=intent.comm_id,
            ranks=sorted(ranks),
            disabled_channels=[],
            # NVL_TRANSIT: each node is told its own ranks' transit GPUs.
            transit=[[r, transit[r]] for r in sorted(ranks) if r in transit],
            transit_mb_per_channel=transit_mb(settings) if transit else None,
            created_at=now,
            ack_deadline_at=now + timedelta(seconds=settings.command_ack_timeout_s),
            iteration=intent.iteration,
            incarnation=job.incarnation,
        )
        for node, ranks in sorted(by_node.items())
    ]
    CommandRepo(session).add_all(rows)
    notify_nodes(session, by_node)
    metrics.COMMANDS_ISSUED.labels(kind=intent.kind.value).inc(len(rows))
    return rows


def _ranks_by_node(ranks: Iterable[int], rank_nodes: Mapping[int, str]) -> dict[str, list[int]]:
    """The ranks placed on each node (a rank no longer placed is left out)."""
    by_node: dict[str, list[int]] = {}
    for r in ranks:
        if r in rank_nodes:
            by_node.setdefault(rank_nodes[r], []).append(r)
    return by_node


def _withdraw_moves(
    session: Session, job: m.Job, returning: Set[int], now: datetime, settings: Settings
) -> None:
    """A FAILOVER still on its way to ranks that now return is withdrawn: sent (or sent
    again, unanswered) after the fail-back, it would move them onto a backup that may be
    dead by now. One that moves other ranks too goes on for those alone."""
    for cmd in CommandRepo(session).job_commands(job.job_id, [CommandKind.FAILOVER.value], WAITING):
        if not returning & set(cmd.ranks):
            continue
        staying = [r for r in cmd.ranks if r not in returning]
        if transition(session, cmd, CommandState.SUPERSEDED, now) and staying:
            CommandRepo(session).add_all([_again(cmd, now, settings, attempt=1, ranks=staying)])
            notify_nodes(session, [cmd.node])


def left_their_primary(session: Session, job: m.Job, ranks: set[int]) -> set[int]:
    """Of `ranks`, those this incarnation's newest FAILOVER moved to their backup: one a
    fail-back withdrew on its way (_withdraw_moves), or one the ranks refused, moved
    nobody, so a rank whose newest FAILOVER is such never left its primary (a refused or
    overtaken fail-back keeps it nowhere else)."""
    newest: dict[int, m.Command] = {}
    repo = CommandRepo(session)
    for c in repo.incarnation_commands(job.job_id, job.incarnation, CommandKind.FAILOVER):
        newest.update((r, c) for r in c.ranks if r in ranks)
    gone = (CommandState.SUPERSEDED, CommandState.FAILED)
    return {r for r, c in newest.items() if CommandState(c.state) not in gone}


def transit_mb(settings: Settings) -> int:
    """MB a transit GPU gives one channel: the service's per-channel cost, whole MB."""
    return max(1, int(settings.nvl_mb_per_channel))


def withdraw(session: Session, job: m.Job, kind: CommandKind, now: datetime) -> int:
    """Supersede the job's commands of `kind` still on their way; how many there were."""
    waiting = CommandRepo(session).job_commands(job.job_id, [kind.value], WAITING)
    return sum(transition(session, c, CommandState.SUPERSEDED, now) for c in waiting)


def switch_point(
    session: Session,
    job: m.Job,
    *,
    comm_id: int,
    ranks: list[int],
    rank_nodes: Mapping[int, str],
    kind: CommandKind,
    disabled_channels: list[int],
    decision_id: str | None,
    channel_weights: list[float] | None = None,
    split_ratio: float | None = None,
    returning: list[int] | None = None,
    now: datetime,
    settings: Settings,
    passed_ops: int = 0,
) -> list[m.Command]:
    """One trigger for every rank of a communicator, under a new epoch, superseding older ones.

    `returning` (FAILBACK) names the ranks it returns to their primary, on every row.
    `passed_ops` is an op count some rank is known to have passed (a trigger it
    reported too late for): the new trigger counts from it even when the stored
    progress, a poll or two old, is still below it.
    """
    epoch = next_epoch(session, job, comm_id)
    members = set(ranks)
    point = _projected_switch_point(
        session, job, comm_id, members, passed_ops=passed_ops, now=now, settings=settings
    )
    _supersede_covered(session, job, comm_id, members, now=now)
    by_node = _ranks_by_node(ranks, rank_nodes)
    cmds = [
        m.Command(
            node=node,
            job_id=job.job_id,
            decision_id=decision_id,
            kind=kind.value,
            epoch=epoch,
            comm_id=comm_id,
            ops_done=point.ops_done,
            disabled_channels=disabled_channels,
            channel_weights=list(channel_weights or []),
            split_ratio=split_ratio,
            ranks=sorted(rs),
            returning=None if returning is None else sorted(returning),
            created_at=now,
            ack_deadline_at=now + timedelta(seconds=settings.command_ack_timeout_s),
            incarnation=job.incarnation,
        )
        for node, rs in sorted(by_node.items())
    ]
    CommandRepo(session).add_all(cmds)
    notify_nodes(session, by_node)
    metrics.COMMANDS_ISSUED.labels(kind=kind.value).inc(len(cmds))
    log.info(
        "%s for job %s comm %d at ops_done %d (epoch %d; %s)",
        *(kind.value, job.job_id, comm_id, point.ops_done, epoch, point.reason),
    )
    return cmds


def _supersede_covered(
    session: Session,
    job: m.Job,
    comm_id: int,
    members: set[int],
    *,
    now: datetime,
) -> None:
    """Supersede the communicator's switch points on their way that the new one covers."""
    for old in CommandRepo(session).comm_commands(job.job_id, comm_id, SWITCH_KINDS, WAITING):
        # What this switch point covers: a registered communicator's switch points all
        # name every member; a job without one is told its fail-backs rank by rank, and
        # one rank's leaves another's standing.
        if members.issuperset(old.ranks):
            transition(session, old, CommandState.SUPERSEDED, now)


def _projected_switch_point(
    session: Session,
    job: m.Job,
    comm_id: int,
    members: Set[int],
    *,
    passed_ops: int,
    now: datetime,
    settings: Settings,
) -> coord.SwitchPoint:
    """The op count the members switch at, from their progress and the delivery latency."""
    progress = [
        p for p in CoordinationRepo(session).progress(job.job_id, comm_id) if p.rank in members
    ]
    rates = sorted(p.rate_ops_per_s for p in progress if p.rate_ops_per_s)
    rate = rates[-1] if rates else None
    # A progress sample is an agent poll and a POST old by now: the ranks have
    # run on at their rate since, so count from where they are projected to be.
    projected = [
        p.ops_done + int((rate or 0.0) * max(0.0, (now - p.at).total_seconds())) for p in progress
    ]
    latency = CommandRepo(session).delivery_latency_s() or settings.delivery_latency_default_s
    return coord.switch_point(
        max_ops_done=max([passed_ops, *projected]),
        op_rate_per_s=rate,
        delivery_latency_s=latency,
        min_offset=settings.switch_min_offset_ops,
        safety=settings.switch_safety,
    )


@dataclass(frozen=True)
class Overtaken:
    """A fail-back switch point on its way that a new failover overtook: superseded."""

    comm_id: int
    epoch: int
    ranks: tuple[int, ...]  # every rank it was sent to
    returning: tuple[int, ...]  # those it was returning to their primary


def overtake_returns(
    session: Session, job: m.Job, staying: Set[int], now: datetime, *, rank_by_rank: bool
) -> list[Overtaken]:
    """Supersede each fail-back on its way that would take one of `staying` (ranks the
    job now keeps on their backup) to its primary; what each one was.

    A switch point is all or nothing, so the whole of it goes, on every node, unless some
    node already applied it (then its op count has passed: the ranks are back, and
    moving them again is an ordinary failover). The ranks it was returning never left
    their backups. A job told `rank_by_rank` (no registered communicator) agreed no op
    count: each node's row stands alone, and one node applying its own says nothing of
    another's.
    """
    repo = CommandRepo(session)
    # The fail-backs still waiting, then every row of their switch points: a job's whole
    # history of fail-backs is read only where one is live (most passes read none).
    kind = CommandKind.FAILBACK.value
    live_points = {(c.comm_id, c.epoch) for c in repo.job_commands(job.job_id, [kind], WAITING)}
    rows = repo.switch_points(job.job_id, kind, live_points)
    groups: dict[tuple[int, int, str], list[m.Command]] = {}
    for c in rows:
        groups.setdefault((c.comm_id, c.epoch, c.node if rank_by_rank else ""), []).append(c)
    out = []
    for (comm_id, epoch, _), cmds in sorted(groups.items()):
        ranks = {r for c in cmds for r in c.ranks}
        live = [c for c in cmds if c.state in WAITING]  # a retry supersedes its first try
        settled = any(c.state in (CommandState.APPLIED, CommandState.FAILED) for c in cmds)
        if not live or settled or not ranks & staying:
            continue
        for c in live:
            transition(session, c, CommandState.SUPERSEDED, now)
        said = returning_of(session, cmds)
        returning = ranks if said is None else said & ranks  # unsaid: all it named
        out.append(Overtaken(comm_id, epoch, tuple(sorted(ranks)), tuple(sorted(returning))))
        log.info(
            "job %s: a failover overtook the fail-back of comm %d (epoch %d): superseded",
            job.job_id,
            comm_id,
            epoch,
        )
    return out


def returning_of(session: Session, cmds: Sequence[m.Command]) -> set[int] | None:
    """The ranks a fail-back's rows return to their primary: as the rows say; on rows older
    than that column, as its decision recorded them; None when nothing says."""
    if cmds[0].returning is not None:
        return set(cmds[0].returning)
    decision_id = cmds[0].decision_id
    decision = None if decision_id is None else session.get(m.Decision, decision_id)
    if decision is None or "returning" not in (decision.plan or {}):
        return None
    return {int(r["rank"]) for r in decision.plan["returning"]}


def next_epoch(session: Session, job: m.Job, comm_id: int) -> int:
    """The communicator's next epoch, taken (its row keeps the count; a job's implicit
    communicator, which has no row, counts from its commands)."""
    # The implicit communicator (0) never has a row: every registered or announced
    # communicator has a CCL id above 0.
    comm = None if comm_id == IMPLICIT_COMM else session.get(m.Communicator, (job.job_id, comm_id))
    epoch = (comm.epoch if comm is not None else max_epoch(session, job.job_id, comm_id)) + 1
    if comm is not None:
        comm.epoch = epoch
    return epoch


def max_epoch(session: Session, job_id: str, comm_id: int, kinds: Sequence[str] = ALL_KINDS) -> int:
    """The highest epoch the communicator's commands of `kinds` have had."""
    return CommandRepo(session).max_epoch(job_id, comm_id, kinds)


def retrigger(
    session: Session,
    job: m.Job,
    cmd: m.Command,
    *,
    passed_ops: int,
    now: datetime,
    settings: Settings,
) -> list[m.Command]:
    """A rank was past the switch point: the same plan at a later point, under a new epoch.

    Only the current epoch re-triggers, so many ranks reporting the same late
    trigger produce one new switch point, never a chain.
    """
    if cmd.kind not in SWITCH_KINDS:
        return []
    # The newest switch point only: a failover since (a newer epoch) does not replace it.
    if cmd.epoch != max_epoch(session, job.job_id, cmd.comm_id, SWITCH_KINDS):
        return []
    same = CommandRepo(session).switch_points(job.job_id, cmd.kind, {(cmd.comm_id, cmd.epoch)})
    ranks = sorted({r for c in same for r in c.ranks})
    rank_nodes = {r: c.node for c in same for r in c.ranks}
    metrics.RETRIGGERS.inc()
    return switch_point(
        session,
        job,
        comm_id=cmd.comm_id,
        ranks=ranks,
        rank_nodes=rank_nodes,
        kind=CommandKind(cmd.kind),
        disabled_channels=list(cmd.disabled_channels),
        channel_weights=list(cmd.channel_weights),
        split_ratio=cmd.split_ratio,
        returning=None if cmd.returning is None else list(cmd.returning),
        decision_id=cmd.decision_id,
        now=now,
        settings=settings,
        passed_ops=max(passed_ops, cmd.ops_done),
    )


def _again(
    cmd: m.Command,
    now: datetime,
    settings: Settings,
    *,
    attempt: int,
    ranks: list[int] | None = None,
) -> m.Command:
    """`cmd` issued again under a new id (for `ranks` of it, when given), its deadline
    counted from now."""
    return m.Command(
        node=cmd.node,
        job_id=cmd.job_id,
        decision_id=cmd.decision_id,
        kind=cmd.kind,
        epoch=cmd.epoch,
        comm_id=cmd.comm_id,
        ops_done=cmd.ops_done,
        disabled_channels=list(cmd.disabled_channels),
        channel_weights=list(cmd.channel_weights),
        split_ratio=cmd.split_ratio,
        transit=[list(t) for t in cmd.transit],
        transit_mb_per_channel=cmd.transit_mb_per_channel,
        ranks=list(cmd.ranks) if ranks is None else ranks,
        returning=None if cmd.returning is None else list(cmd.returning),
        created_at=now,
        attempt=attempt,
        ack_deadline_at=now + timedelta(seconds=settings.command_ack_timeout_s),
        iteration=cmd.iteration,
        # Again for the processes the first issue was for, not a later incarnation.
        incarnation=cmd.incarnation,
    )


def retry_or_fail(session: Session, cmd: m.Command, now: datetime, settings: Settings) -> bool:
    """An unacknowledged command past its deadline: re-issue it under a new id, or fail it.

    Returns True when it failed for good (its ranks cannot be moved).
    """
    if cmd.attempt < settings.command_max_attempts:
        transition(session, cmd, CommandState.SUPERSEDED, now)
        CommandRepo(session).add_all([_again(cmd, now, settings, attempt=cmd.attempt + 1)])
        notify_nodes(session, [cmd.node])
        metrics.COMMAND_RETRIES.inc()
        return False
    transition(session, cmd, CommandState.FAILED, now)
    log.warning(
        "command %d (%s) to %s unacknowledged after %d attempts",
        cmd.command_id,
        cmd.kind,
        cmd.node,
        cmd.attempt,
    )
    return True


def take_for_node(
    session: Session, node: str, now: datetime, include_unacked: bool = False
) -> list[m.Command]:
    """Commands not yet delivered to the node (with `include_unacked`, also delivered ones
    still waiting for an acknowledgement), marking new ones delivered.

    Delivery is at least once: an agent that lost a delivered command asks again
    with `include_unacked` when it starts, and a command nobody acknowledges by
    its deadline is re-issued under a new id (`retry_or_fail`).
    """
    cmds = list(CommandRepo(session).pending_for_node(node, include_unacked))
    for c in cmds:
        transition(session, c, CommandState.DELIVERED, now)
    return cmds
