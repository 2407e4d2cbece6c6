"""Commands for the nodes' CCL processes and the acknowledgements of their ranks."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import BindParameter, bindparam, func, select
from sqlalchemy.orm import Session
from sqlalchemy.orm.util import identity_key

from scheduler_svc.store import models as m
from scheduler_svc.store import plain
from scheduler_svc.store.faults import open_unreachable_query
from scheduler_svc.store.types import CommandState

# The statements of a poll, an acknowledgement and a pass, built once: building one (its
# clauses, then its cache key) took longer than SQLite took to run it (a poll's look:
# 320 us built each time, 73 us built once).
_NODE: BindParameter[str] = bindparam("node")
_STATES: BindParameter[list[str]] = bindparam("states", expanding=True)
_JOB: BindParameter[str] = bindparam("job_id")
_KIND: BindParameter[str] = bindparam("kind")
_KINDS: BindParameter[list[str]] = bindparam("kinds", expanding=True)
_COMM: BindParameter[int] = bindparam("comm_id")
_WAITING = m.Command.state.in_(_STATES)
_BY_ID = select(m.Command).where(m.Command.command_id == bindparam("command_id"))
_JOB_OF = select(m.Command.job_id).where(m.Command.command_id == bindparam("command_id"))
_PENDING = select(m.Command).where(m.Command.node == _NODE, _WAITING).order_by(m.Command.command_id)
_HAS_PENDING = select(m.Command.command_id).where(m.Command.node == _NODE, _WAITING).limit(1)
_LOOK = select(
    select(m.Command.command_id).where(m.Command.node == _NODE, _WAITING).exists(),
    open_unreachable_query(_NODE).exists(),
)
_ACKS = select(m.CommandAck).where(m.CommandAck.command_id == bindparam("command_id"))
_MAX_EPOCH = select(func.max(m.Command.epoch)).where(
    m.Command.job_id == _JOB, m.Command.comm_id == _COMM, m.Command.kind.in_(_KINDS)
)
_JOB_COMMANDS = select(m.Command).where(
    m.Command.job_id == _JOB, m.Command.kind.in_(_KINDS), _WAITING
)
_COMM_COMMANDS = select(m.Command).where(
    m.Command.job_id == _JOB, m.Command.comm_id == _COMM, m.Command.kind.in_(_KINDS), _WAITING
)
_INCARNATION_COMMANDS = select(m.Command).where(
    m.Command.job_id == _JOB,
    m.Command.kind == _KIND,
    m.Command.incarnation == bindparam("incarnation"),
)
_AT_POINT = select(m.Command).where(
    m.Command.job_id == _JOB,
    m.Command.kind == _KIND,
    m.Command.comm_id == _COMM,
    m.Command.epoch == bindparam("epoch"),
)


def _waiting(include_delivered: bool) -> list[str]:
    """The states of a command not acknowledged yet: issued, and delivered if asked."""
    return ["issued", "delivered"] if include_delivered else ["issued"]


@dataclass(frozen=True, slots=True)
class NodeLook:
    pending: bool  # commands wait for the node
    unreachable: bool  # an UNREACHABLE fault on the node is open


class CommandRepo:
    def __init__(self, session: Session) -> None:
        self.s = session

    def add_all(self, commands: list[m.Command]) -> None:
        self.s.add_all(commands)
        self.s.flush()

    def get(self, command_id: int) -> m.Command | None:
        """The command of this id: as this session holds it (no statement), or read by a
        statement built once (an acknowledgement's first read; `Session.get` builds a new
        SELECT for every miss)."""
        if identity_key(m.Command, command_id) in self.s.identity_map:
            return self.s.get(m.Command, command_id)
        return self.s.scalar(_BY_ID, {"command_id": command_id})

    def job_of(self, command_id: int) -> str | None:
        """The job a command is for (a plain read: nothing is locked or loaded)."""
        return plain.execute(self.s, _JOB_OF, {"command_id": command_id}).scalar()

    def pending_for_node(self, node: str, include_delivered: bool = True) -> Sequence[m.Command]:
        """Commands for the node not acknowledged yet (issued, and delivered if asked)."""
        return self.s.scalars(_PENDING, {"node": node, "states": _waiting(include_delivered)}).all()

    def for_job(
        self, job_id: str, states: Collection[CommandState] | None = None
    ) -> Sequence[m.Command]:
        query = select(m.Command).where(m.Command.job_id == job_id)
        if states:
            query = query.where(m.Command.state.in_([str(s) for s in states]))
        return self.s.scalars(query.order_by(m.Command.command_id)).all()

    def has_pending(self, node: str, include_delivered: bool) -> bool:
        asked = {"node": node, "states": _waiting(include_delivered)}
        return plain.execute(self.s, _HAS_PENDING, asked).first() is not None

    def look(self, node: str, include_delivered: bool) -> NodeLook:
        """What a poll of the node looks for, in one round trip: commands to hand it (as
        `has_pending`), and whether the node is held unreachable (FaultRepo.open_unreachable)."""
        asked = {"node": node, "states": _waiting(include_delivered)}
        row = plain.execute(self.s, _LOOK, asked).one()
        return NodeLook(pending=bool(row[0]), unreachable=bool(row[1]))

    def add_acks(self, acks: Iterable[m.CommandAck]) -> None:
        self.s.add_all(acks)
        self.s.flush()

    def acks(self, command_id: int) -> Sequence[m.CommandAck]:
        return self.s.scalars(_ACKS, {"command_id": command_id}).all()

    def unacknowledged(self) -> tuple[dict[str, int], datetime | None]:
        """Commands still waiting for an ack (issued, delivered) per state, and the oldest one."""
        waiting = m.Command.state.in_(["issued", "delivered"])
        counts = self.s.execute(
            select(m.Command.state, func.count()).where(waiting).group_by(m.Command.state)
        )
        oldest = self.s.scalar(select(func.min(m.Command.created_at)).where(waiting))
        return dict(counts.tuples().all()), oldest

    def overdue_commands(
        self, now: datetime, limit: int = 200, command_id: int | None = None
    ) -> Sequence[m.Command]:
        q = (
            select(m.Command)
            .where(
                m.Command.state.in_(["issued", "delivered"]),
                m.Command.ack_deadline_at.is_not(None),
                m.Command.ack_deadline_at < now,
            )
            .order_by(m.Command.command_id)
            .limit(limit)
        )
        if command_id is not None:
            q = q.where(m.Command.command_id == command_id)
        if self.s.get_bind().dialect.name == "postgresql":
            # Several replicas sweep at once; each takes rows the others are not handling.
            q = q.with_for_update(skip_locked=True)
        return self.s.scalars(q).all()

    def job_commands(
        self, job_id: str, kinds: Sequence[str], states: Sequence[str]
    ) -> list[m.Command]:
        """The job's commands of `kinds` in `states`, in command order."""
        asked = {"job_id": job_id, "kinds": list(kinds), "states": list(states)}
        return _in_order(self.s.scalars(_JOB_COMMANDS, asked))

    def incarnation_commands(self, job_id: str, incarnation: int, kind: str) -> list[m.Command]:
        """The commands of `kind` the job's `incarnation` was sent, in any state, in command
        order: that incarnation's history only, not every earlier one's."""
        asked = {"job_id": job_id, "kind": kind, "incarnation": incarnation}
        return _in_order(self.s.scalars(_INCARNATION_COMMANDS, asked))

    def comm_commands(
        self, job_id: str, comm_id: int, kinds: Sequence[str], states: Sequence[str]
    ) -> list[m.Command]:
        """The communicator's commands of `kinds` in `states`, in command order."""
        asked = {"job_id": job_id, "comm_id": comm_id, "kinds": list(kinds), "states": list(states)}
        return _in_order(self.s.scalars(_COMM_COMMANDS, asked))

    def max_epoch(self, job_id: str, comm_id: int, kinds: Sequence[str]) -> int:
        """The highest epoch the communicator's commands of `kinds` have had (0: none). One
        aggregate on the (job, communicator, epoch) index: a job's history of commands
        (every switch point of its life, a row per node) is never loaded for it."""
        asked = {"job_id": job_id, "comm_id": comm_id, "kinds": list(kinds)}
        return int(plain.execute(self.s, _MAX_EPOCH, asked).scalar() or 0)

    def switch_points(
        self, job_id: str, kind: str, points: Collection[tuple[int, int]]
    ) -> list[m.Command]:
        """Every row, in any state, of the job's `kind` commands at these (communicator,
        epoch) points, in command order."""
        # A query per point (there are seldom two): SQLite searches the (job, communicator,
        # epoch) index for one, but walks the job's rows for an OR of several.
        return _in_order(
            c
            for comm_id, epoch in sorted(points)
            for c in self.s.scalars(
                _AT_POINT, {"job_id": job_id, "kind": kind, "comm_id": comm_id, "epoch": epoch}
            )
        )

    def delivery_latency_s(self, limit: int = 100) -> float | None:
        """Median time from issuing a command to its delivery, over recent deliveries."""
        rows = self.s.execute(
            select(m.Command.created_at, m.Command.delivered_at)
            .where(m.Command.delivered_at.is_not(None))
            .order_by(m.Command.command_id.desc())
            .limit(limit)
        ).tuples()
        lat = sorted((d - c).total_seconds() for c, d in rows if d is not None)
        return lat[len(lat) // 2] if lat else None


def _in_order(rows: Iterable[m.Command]) -> list[m.Command]:
    """Rows in command order, sorted here: asked of SQL, the order makes SQLite walk the job's
    whole history by its job_id index rather than sort the few rows the (job_id, state,
    comm_id) index finds (migration 0019)."""
    return sorted(rows, key=lambda c: c.command_id)
