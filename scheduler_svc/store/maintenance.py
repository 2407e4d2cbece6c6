"""Planned maintenance windows on switches, RNICs, ports and nodes, and the ports flagged
for maintenance (flapping, or an operator's flag) until cleared."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from scheduler_svc.store import models as m
from scheduler_svc.store.idempotency import insert_unless_taken

# The evidence's reads, built once (see store/commands.py).
_IN_FORCE = (
    select(m.MaintenanceWindow)
    .where(m.MaintenanceWindow.phase != "done")
    .order_by(m.MaintenanceWindow.id)
)
_IN_FORCE_ON = _IN_FORCE.where(
    m.MaintenanceWindow.switch.is_not(None)
    | m.MaintenanceWindow.node.in_(bindparam("nodes", expanding=True))
)
_OPEN_FLAGS = (
    select(m.MaintenanceFlag)
    .where(m.MaintenanceFlag.cleared_at.is_(None))
    .order_by(m.MaintenanceFlag.id)
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

    def in_force(self, nodes: Iterable[str] | None) -> Sequence[m.MaintenanceWindow]:
        """Windows not yet done on `nodes` (all when None), and every switch-wide one."""
        if nodes is None:
            return self.s.scalars(_IN_FORCE).all()
        return self.s.scalars(_IN_FORCE_ON, {"nodes": list(nodes)}).all()

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

    def clear_flag(self, flag_id: int, now: datetime) -> m.MaintenanceFlag | None:
        row = self.s.get(m.MaintenanceFlag, flag_id)
        if row is not None and row.cleared_at is None:
            row.cleared_at = now
            return row
        return None
