"""Planned maintenance windows on switches, RNICs, ports and nodes, and the ports flagged
for maintenance (flapping, or an operator's flag) until cleared."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row, bindparam, select
from sqlalchemy.orm import Session

from scheduler_svc.store import models as m
from scheduler_svc.store import plain
from scheduler_svc.store.idempotency import insert_unless_taken

_OPEN_FLAGS = (
    select(m.MaintenanceFlag)
    .where(m.MaintenanceFlag.cleared_at.is_(None))
    .order_by(m.MaintenanceFlag.id)
)
# The evidence's reads, built once (see store/commands.py), as values in the order of
# engine.fabric.Maintenance's and Quarantine's fields: the evidence reads them twice a
# report, and builds no row objects.
_W = m.MaintenanceWindow
_WINDOW_VALUES = select(
    _W.id,
    _W.start_at,
    _W.end_at,
    _W.node,
    _W.device,
    _W.port,
    _W.switch,
    _W.moves_at,
    _W.cancelled_at,
    _W.reason,
).where(_W.phase != "done")
_IN_FORCE_VALUES = _WINDOW_VALUES.order_by(_W.id)
_IN_FORCE_ON_VALUES = _WINDOW_VALUES.where(
    _W.switch.is_not(None) | _W.node.in_(bindparam("nodes", expanding=True))
).order_by(_W.id)
_F = m.MaintenanceFlag
_OPEN_FLAG_VALUES = (
    select(_F.id, _F.node, _F.device, _F.port, _F.flagged_at, _F.reason)
    .where(_F.cleared_at.is_(None))
    .order_by(_F.id)
)


class MaintenanceRepo:
    """Planned maintenance windows, and the ports flagged for maintenance (flapping, or
    an operator's flag) until cleared."""

    def __init__(self, session: Session) -> None:
        self.s = session

    def add(self, row: m.MaintenanceWindow) -> m.MaintenanceWindow:
        self.s.add(row)
        self.s.flush()
        return row

    def get(self, window_id: int, *, lock: bool = False) -> m.MaintenanceWindow | None:
        q = select(m.MaintenanceWindow).where(m.MaintenanceWindow.id == window_id)
        if lock:
            q = q.with_for_update().execution_options(populate_existing=True)
        return self.s.scalar(q)

    def listing(self, *, include_done: bool, limit: int) -> Sequence[m.MaintenanceWindow]:
        q = select(m.MaintenanceWindow)
        if not include_done:
            q = q.where(m.MaintenanceWindow.phase != "done")
        return self.s.scalars(
            q.order_by(m.MaintenanceWindow.start_at, m.MaintenanceWindow.id).limit(limit)
        ).all()

    def in_force(self, nodes: Iterable[str] | None) -> list[Row[Any]]:
        """Windows not yet done on `nodes` (all when None), and every switch-wide one, as
        values: (id, start_at, end_at, node, device, port, switch, moves_at, cancelled_at,
        reason) of each."""
        if nodes is None:
            return list(plain.execute(self.s, _IN_FORCE_VALUES))
        return list(plain.execute(self.s, _IN_FORCE_ON_VALUES, {"nodes": list(nodes)}))

    def due(self, now: datetime, limit: int = 100) -> list[int]:
        return list(
            self.s.scalars(
                select(m.MaintenanceWindow.id)
                .where(
                    m.MaintenanceWindow.phase != "done",
                    m.MaintenanceWindow.due_at.is_not(None),
                    m.MaintenanceWindow.due_at <= now,
                )
                .order_by(m.MaintenanceWindow.due_at)
                .limit(limit)
            ).all()
        )

    def claim(self, window_id: int, now: datetime) -> m.MaintenanceWindow | None:
        """The window under its row lock if it is still due (another replica may have acted)."""
        q = select(m.MaintenanceWindow).where(
            m.MaintenanceWindow.id == window_id,
            m.MaintenanceWindow.phase != "done",
            m.MaintenanceWindow.due_at <= now,
        )
        if self.s.get_bind().dialect.name == "postgresql":
            q = q.with_for_update(skip_locked=True)
        return self.s.scalar(q.execution_options(populate_existing=True))

    def flag(self, row: m.MaintenanceFlag) -> m.MaintenanceFlag | None:
        return insert_unless_taken(self.s, row)

    def open_flags(self) -> Sequence[m.MaintenanceFlag]:
        return self.s.scalars(_OPEN_FLAGS).all()

    def open_flag_values(self) -> list[Row[Any]]:
        """`open_flags` as values: (id, node, device, port, flagged_at, reason) of each."""
        return list(plain.execute(self.s, _OPEN_FLAG_VALUES))

    def clear_flag(self, flag_id: int, now: datetime) -> m.MaintenanceFlag | None:
        row = self.s.get(m.MaintenanceFlag, flag_id)
        if row is not None and row.cleared_at is None:
            row.cleared_at = now
            return row
        return None
