"""Statements on the session's connection (`store/plain.py`) see what the session has
changed and belong to its transaction, on both stores."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from scheduler_svc.store import models as m
from scheduler_svc.store import plain

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
_COUNT = select(func.count()).select_from(m.MaintenanceFlag)


def flag(node: str) -> m.MaintenanceFlag:
    return m.MaintenanceFlag(node=node, device="mlx5_0", port=1, flagged_at=NOW, reason="r")


def test_a_read_sees_the_changes_the_session_has_not_flushed(session: Session) -> None:
    session.add(flag("n0"))  # pending: not sent yet
    assert plain.execute(session, _COUNT).scalar() == 1
    row = session.scalars(select(m.MaintenanceFlag)).one()
    row.reason = "changed"  # dirty
    reasons = select(m.MaintenanceFlag.reason)
    assert plain.execute(session, reasons).scalars().all() == ["changed"]


def test_a_write_is_the_sessions_transactions_and_goes_with_it(session: Session) -> None:
    session.add(flag("n0"))
    session.flush()
    savepoint = session.begin_nested()
    cleared = plain.execute(
        session,
        update(m.MaintenanceFlag).values(cleared_at=NOW).where(m.MaintenanceFlag.node == "n0"),
    )
    assert cleared.rowcount == 1
    assert session.scalar(_COUNT.where(m.MaintenanceFlag.cleared_at.is_not(None))) == 1
    savepoint.rollback()
    assert session.scalar(_COUNT.where(m.MaintenanceFlag.cleared_at.is_not(None))) == 0
    assert plain.execute(session, _COUNT).scalar() == 1


def test_unflushed_a_statement_on_tables_leaves_the_changes_pending(session: Session) -> None:
    """As the session's execute runs one built on tables: an outbox event's commands are
    then written at the commit, all together."""
    session.add(flag("n0"))
    table = m.MaintenanceFlag.__table__
    assert (
        plain.execute(session, select(func.count()).select_from(table), flush=False).scalar() == 0
    )
    assert session.new  # still pending
    assert plain.execute(session, _COUNT).scalar() == 1
    assert not session.new
