"""Insert-unless-taken: a unique key, not a read before the write, tells that a row is
already there (faults, decisions, switch faults, flags, communicators, stalls)."""

from __future__ import annotations

from typing import TypeVar

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from scheduler_svc.store import models as m

_Row = TypeVar("_Row", bound=m.Base)


def insert_unless_taken(session: Session, row: _Row) -> _Row | None:
    """Insert a row, or return None when a unique key says it is already there.

    A savepoint keeps the rest of the transaction: this is how a replayed event,
    a second replica or a racing request finds a fault, decision, switch fault
    or flag that exists, without deciding or flagging twice.
    """
    try:
        with session.begin_nested():
            session.add(row)
            session.flush()
    except IntegrityError:
        return None
    return row
