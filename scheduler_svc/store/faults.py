"""Agent reports (events), the faults they open, clear and resolve, and the switch
failures inferred from faults correlated across nodes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import (
    BindParameter,
    Row,
    Select,
    and_,
    bindparam,
    case,
    delete,
    func,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from scheduler_svc.store import models as m
from scheduler_svc.store import plain
from scheduler_svc.store.idempotency import (
    insert_new,
    insert_values,
    on_conflict_insert,
)
from scheduler_svc.store.types import UNREACHABLE_DEVICE, WHOLE_DEVICE_PORT, FaultKind

_EVENTS = m.Event.__table__
# One statement per store, built once, its rows sent as one executemany: SQLAlchemy
# writes them as multi-row VALUES with RETURNING (its "insertmanyvalues").
_INSERT_EVENTS = {
    name: dialect.insert(_EVENTS)
    .on_conflict_do_nothing(index_elements=["event_id"])
    .returning(_EVENTS.c.event_id)
    for name, dialect in (("postgresql", postgresql), ("sqlite", sqlite))
}


# A fault opened unless one is open on its component (the partial unique index
# uq_faults_open_component), in one statement: no savepoint to catch the collision.
_OPEN_IF_NEW = on_conflict_insert(m.Fault, ("node", "device", "port"), "cleared_at IS NULL")


# One event: the same insert as one statement SQLAlchemy compiles once (its dialects' ON
# CONFLICT inserts above have no cache key, so each batch compiles them anew).
_INSERT_EVENT = on_conflict_insert(m.Event, ("event_id",))
_OPEN_SWITCH_FAULT = on_conflict_insert(m.SwitchFault, ("switch",), "cleared_at IS NULL")


class EventRepo:
    def __init__(self, session: Session) -> None:
        self.s = session

    def insert_new(self, rows: list[dict[str, Any]]) -> set[str]:
        """Insert events whose id is unseen; returns the ids actually inserted.

        ON CONFLICT DO NOTHING makes a replayed batch, or the same batch sent to
        two replicas at once, a no-op for the events already stored.
        """
        if not rows:
            return set()
        if len(rows) == 1:  # a report's usual one: a statement whose compiled form is kept
            event_id = insert_values(self.s, _INSERT_EVENT, rows[0])
            return set() if event_id is None else {event_id}
        dialect = self.s.get_bind().dialect.name
        return set(plain.execute(self.s, _INSERT_EVENTS[dialect], rows).scalars().all())

    def set_fault(self, event_ids: Iterable[str], fault_id: int) -> None:
        plain.execute(self.s, _SET_FAULT, {"event_ids": list(event_ids), "to_fault": fault_id})

    def count(self, node: str | None = None) -> int:
        q = select(func.count()).select_from(m.Event)
        if node is not None:
            q = q.where(m.Event.node == node)
        return self.s.scalar(q) or 0

    def prune(self, before: datetime, limit: int) -> int:
        """Delete up to `limit` events received before `before`; returns how many."""
        ids = select(m.Event.event_id).where(m.Event.received_at < before).limit(limit)
        result = self.s.execute(
            delete(m.Event)
            .where(m.Event.event_id.in_(ids.scalar_subquery()))
            .execution_options(synchronize_session=False)
        )
        return int(getattr(result, "rowcount", 0) or 0)

    def port_transitions(
        self, node: str, device: str, port: int, since: datetime
    ) -> list[tuple[datetime, bool]]:
        """(time, up) of a port's down and up reports since `since`, oldest first."""
        asked = {"node": node, "device": device, "since": since, "port": port}
        rows = plain.execute(self.s, _PORT_TRANSITIONS, asked)
        return [(at, kind == "port_up") for at, kind in rows.tuples()]


def open_unreachable_query(node: str | BindParameter[str]) -> Select[tuple[m.Fault]]:
    return select(m.Fault).where(
        m.Fault.node == node,
        m.Fault.device == UNREACHABLE_DEVICE,
        m.Fault.port == WHOLE_DEVICE_PORT,
        m.Fault.cleared_at.is_(None),
        m.Fault.kind == FaultKind.UNREACHABLE.value,
    )


class OpenFault(NamedTuple):
    """An unresolved fault as evidence reads it: its row's values, not the row, beside the
    level of the port it names (`state` None: no such port is registered, a GPU's fault).

    Plain values, so a read of a hundred open faults builds no ORM objects, and a copy
    held past its transaction is what that transaction read, not a row that may change."""

    id: int
    node: str
    device: str
    port: int
    kind: str
    opened_at: datetime
    cleared_at: datetime | None
    last_error_at: datetime | None
    switch: str | None
    detail: dict[str, Any]
    state: str | None
    observed_at: datetime | None


# session.info: (the innermost transaction, {fault id: OpenFault}) of the last evidence read.
_READ = "railover_open_faults_read"


def _unresolved(q: Select[Any]) -> tuple[Select[Any], Select[Any]]:
    """`q` kept to the faults still evidence, in the order opened: everywhere, and on the
    nodes of the expanding parameter "nodes". Built once (see store/commands.py)."""
    q = q.where(m.Fault.resolved_at.is_(None)).order_by(m.Fault.id)
    return q, q.where(m.Fault.node.in_(bindparam("nodes", expanding=True)))


def _pick(
    queries: tuple[Select[Any], Select[Any]], nodes: Iterable[str] | None
) -> tuple[Select[Any], dict[str, Any]]:
    """The statement of `_unresolved` for `nodes` (None: every node), with its parameters."""
    if nodes is None:
        return queries[0], {}
    return queries[1], {"nodes": list(nodes)}


_UNRESOLVED = _unresolved(select(m.Fault))
_AT_THEIR_PORTS = _unresolved(
    select(
        m.Fault.id,
        m.Fault.node,
        m.Fault.device,
        m.Fault.port,
        m.Fault.kind,
        m.Fault.opened_at,
        m.Fault.cleared_at,
        m.Fault.last_error_at,
        m.Fault.switch,
        m.Fault.detail,
        m.Rnic.state,
        m.Rnic.observed_at,
    )
    .select_from(m.Fault)
    .outerjoin(
        m.Rnic,
        and_(
            m.Rnic.node == m.Fault.node,
            m.Rnic.name == m.Fault.device,
            # A whole device's fault reads port 1 of it.
            m.Rnic.port == case((m.Fault.port == WHOLE_DEVICE_PORT, 1), else_=m.Fault.port),
        ),
    )
)
_OPEN_UNREACHABLE = open_unreachable_query(bindparam("node"))
_OPEN_ON_COMPONENT = select(m.Fault).where(
    m.Fault.node == bindparam("node"),
    m.Fault.device == bindparam("device"),
    m.Fault.port == bindparam("port"),
    m.Fault.cleared_at.is_(None),
)
_CLEARING = select(m.Fault).where(
    m.Fault.node == bindparam("node"),
    m.Fault.device == bindparam("device"),
    m.Fault.port.in_(bindparam("ports", expanding=True)),
    m.Fault.kind.in_(bindparam("kinds", expanding=True)),
    m.Fault.cleared_at.is_(None),
)
_DESCRIBED = select(m.Fault.node, m.Fault.device, m.Fault.port, m.Fault.kind).where(
    m.Fault.id == bindparam("id")
)
_RECENT_ON_SWITCH = select(
    m.Fault.node, m.Fault.device, m.Fault.port, m.Fault.switch, m.Fault.opened_at
).where(
    m.Fault.switch == bindparam("switch"),
    m.Fault.opened_at >= bindparam("since"),
    m.Fault.cleared_at.is_(None),
)
_OPEN_SWITCH_FAULTS = (
    select(m.SwitchFault).where(m.SwitchFault.cleared_at.is_(None)).order_by(m.SwitchFault.id)
)
_OPEN_SWITCH_FAULT_VALUES = (
    select(m.SwitchFault.id, m.SwitchFault.switch, m.SwitchFault.opened_at, m.SwitchFault.reason)
    .where(m.SwitchFault.cleared_at.is_(None))
    .order_by(m.SwitchFault.id)
)
_PORT_TRANSITIONS = (
    select(m.Event.observed_at, m.Event.kind)
    .where(
        m.Event.node == bindparam("node"),
        m.Event.device == bindparam("device"),
        m.Event.kind.in_(["port_down", "port_up"]),
        m.Event.observed_at >= bindparam("since"),
        (m.Event.port == bindparam("port")) | m.Event.port.is_(None),
    )
    .order_by(m.Event.observed_at)
)
_SET_FAULT = (
    update(m.Event)
    .where(m.Event.event_id.in_(bindparam("event_ids", expanding=True)))
    .values(fault_id=bindparam("to_fault"))  # an UPDATE keeps a column's name for its value
)


class FaultRepo:
    def __init__(self, session: Session) -> None:
        self.s = session

    def get(self, fault_id: int) -> m.Fault | None:
        return self.s.get(m.Fault, fault_id)

    def open_if_new(self, fault: m.Fault) -> m.Fault | None:
        """Open `fault` (a new object, not yet in the session) unless a fault is already
        open on that component (then None): one INSERT on the open-component index."""
        return insert_new(self.s, _OPEN_IF_NEW, fault)

    def open_on_component(self, node: str, device: str, port: int) -> m.Fault | None:
        return self.s.scalar(_OPEN_ON_COMPONENT, {"node": node, "device": device, "port": port})

    def clear(
        self, node: str, device: str, port: int, now: datetime, kinds: Sequence[str]
    ) -> list[m.Fault]:
        """The port is up again: faults of `kinds` on it (or its whole RNIC) start clearing."""
        asked = {"node": node, "device": device, "ports": [port, 0], "kinds": list(kinds)}
        rows = self.s.scalars(_CLEARING, asked).all()
        for f in rows:
            f.cleared_at = now
        self.s.flush()
        return list(rows)

    def open_unreachable(self, node: str) -> Sequence[m.Fault]:
        """The node's UNREACHABLE fault, if open (the open-component index finds it)."""
        return self.s.scalars(_OPEN_UNREACHABLE, {"node": node}).all()

    def unresolved(self, nodes: Iterable[str] | None = None) -> Sequence[m.Fault]:
        """Faults that are still evidence: not closed by their clearing rule or an operator."""
        return self.s.scalars(*_pick(_UNRESOLVED, nodes)).all()

    def unresolved_at_their_ports(self, nodes: Iterable[str] | None = None) -> list[OpenFault]:
        """`unresolved` as plain values, each fault beside the level of the port it names
        (a whole device's fault: port 1 of it), read in the same statement.

        One read of exactly the ports the evidence needs: the levels were a second
        statement over every port of the faults' nodes, a thousand rows twice a report
        with a hundred faults open on as many nodes. What it read stays known to this
        transaction (`described`)."""
        read = [OpenFault._make(r) for r in plain.execute(self.s, *_pick(_AT_THEIR_PORTS, nodes))]
        self.remember(read)
        return read

    def remember(self, read: Iterable[OpenFault]) -> None:
        """Keep `read`, the open faults as this transaction now sees them, for `described`
        (also those the evidence's view in memory hands out)."""
        within = self.s.get_nested_transaction() or self.s.get_transaction()
        self.s.info[_READ] = (within, {r.id: r for r in read})

    def described(self, fault_id: int) -> tuple[str, str, int, str] | None:
        """(node, device, port, kind) of a fault, which never change once it is opened: from
        the open faults this transaction last read (`unresolved_at_their_ports`), or else
        one read by its key. Only from a read in the transaction still innermost: one a
        savepoint rolled back may have read a row whose id SQLite then hands to another."""
        within = self.s.get_nested_transaction() or self.s.get_transaction()
        read: tuple[object, dict[int, OpenFault]] | None = self.s.info.get(_READ)
        if read is not None and read[0] is within and within is not None and within.is_active:
            known = read[1].get(fault_id)
            if known is not None:
                return known.node, known.device, known.port, known.kind
        row = plain.execute(self.s, _DESCRIBED, {"id": fault_id}).first()
        return None if row is None else (row[0], row[1], row[2], row[3])

    def by_ids(self, ids: Iterable[int]) -> Sequence[m.Fault]:
        """The fault rows of these ids, in id order, in one statement (rows this session
        already holds come back as held, with their changes)."""
        wanted = sorted(set(ids))
        if not wanted:
            return []
        return self.s.scalars(
            select(m.Fault).where(m.Fault.id.in_(wanted)).order_by(m.Fault.id)
        ).all()

    def listing(
        self, *, open_only: bool, node: str | None, nodes: Iterable[str] | None, limit: int
    ) -> Sequence[m.Fault]:
        q = select(m.Fault).order_by(m.Fault.id.desc()).limit(limit)
        if open_only:
            q = q.where(m.Fault.resolved_at.is_(None))
        if node is not None:
            q = q.where(m.Fault.node == node)
        if nodes is not None:
            q = q.where(m.Fault.node.in_(list(nodes)))
        return self.s.scalars(q).all()

    def all(self, open_only: bool = True, limit: int = 500) -> Sequence[m.Fault]:
        return self.listing(open_only=open_only, node=None, nodes=None, limit=limit)

    def close(self, fault: m.Fault, now: datetime, reason: str, by: str | None) -> None:
        fault.resolved_at = now
        fault.resolved_reason = reason
        fault.resolved_by = by
        if fault.cleared_at is None:
            fault.cleared_at = now

    def open_switch_faults(self) -> Sequence[m.SwitchFault]:
        return self.s.scalars(_OPEN_SWITCH_FAULTS).all()

    def open_switch_fault_values(self) -> list[Row[Any]]:
        """`open_switch_faults` as values: (id, switch, opened_at, reason) of each."""
        return list(plain.execute(self.s, _OPEN_SWITCH_FAULT_VALUES))

    def open_switch_fault(self, row: m.SwitchFault) -> m.SwitchFault | None:
        """Open a switch failure (a new object) unless one is open on that switch (then
        None): one INSERT, as every later fault under a failed switch asks again."""
        return insert_new(self.s, _OPEN_SWITCH_FAULT, row)

    def switch_has_open_faults(self, switch: str, since: datetime) -> bool:
        """Whether some fault on a port cabled to `switch`, observed at `since` or later,
        is still evidence."""
        found = self.s.scalar(
            select(m.Fault.id)
            .where(
                m.Fault.switch == switch,
                m.Fault.resolved_at.is_(None),
                m.Fault.opened_at >= since,
            )
            .limit(1)
        )
        return found is not None

    def switch_fault_on(self, switch: str) -> m.SwitchFault | None:
        """The switch's failure still open, if any."""
        return self.s.scalar(
            select(m.SwitchFault).where(
                m.SwitchFault.switch == switch, m.SwitchFault.cleared_at.is_(None)
            )
        )

    def clear_switch_fault(self, switch: str, now: datetime) -> m.SwitchFault | None:
        row = self.switch_fault_on(switch)
        if row is not None:
            row.cleared_at = now
        return row

    def lock_switch(self, switch: str) -> None:
        """Serialise the correlation of one switch's faults until this transaction ends.

        Reports from the nodes under a failing switch arrive together. Each inserts
        its fault and then counts the switch's open faults; on PostgreSQL (READ
        COMMITTED) two of them could each miss the other's uncommitted fault, and
        the switch failure would never be inferred. With a transaction advisory
        lock per switch, taken after the insert and before the count, the last
        to take it sees every fault committed before it. SQLite has one writer
        already.
        """
        if self.s.get_bind().dialect.name == "postgresql":
            plain.execute(
                self.s,
                text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
                {"key": f"railover switch {switch}"},
                flush=False,
            )

    def recent_switch_faults(self, switch: str, since: datetime) -> list[Row[Any]]:
        """(node, device, port, switch, opened_at) of each fault open on the switch's ports
        opened since `since`: what correlating them into a switch failure needs."""
        asked = {"switch": switch, "since": since}
        return list(plain.execute(self.s, _RECENT_ON_SWITCH, asked))
