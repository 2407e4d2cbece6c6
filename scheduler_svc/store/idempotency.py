"""Insert-unless-taken: a unique key, not a read before the write, tells that a row is
already there (faults, decisions, switch faults, flags, communicators, stalls).

Two ways: `insert_new`, one INSERT ... ON CONFLICT DO NOTHING on the key (the busy
paths: a report's fault, a pass's decision); `insert_unless_taken`, a flush in a
savepoint that catches the collision (the rest).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar, cast

from sqlalchemy import ColumnElement, Insert, Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, make_transient_to_detached

from scheduler_svc.store import models as m
from scheduler_svc.store import plain

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


def on_conflict_insert(
    model: type[m.Base], key: Sequence[str], where: ColumnElement[bool] | None = None
) -> dict[str, Insert]:
    """Per store, an INSERT of a `model` row that does nothing when a row with the same
    `key` columns is there (`where`: the partial unique index's condition), returning the
    new row's primary key. Built once, at import, by the repository that uses it."""
    table = cast(Table, model.__table__)
    (primary,) = table.primary_key.columns
    return {
        name: dialect.insert(table)
        .on_conflict_do_nothing(index_elements=list(key), index_where=where)
        .returning(primary)
        for name, dialect in (("postgresql", postgresql), ("sqlite", sqlite))
    }


def insert_new(session: Session, statements: Mapping[str, Insert], row: _Row) -> _Row | None:
    """Insert `row` (a new object, not yet in the session) by `statements` (made by
    `on_conflict_insert` for its table); None when its key is taken.

    One statement whether or not it collides, and no savepoint. The object then joins
    the session as the stored row, its key set; a column it left to its default is read
    when first asked."""
    table = cast(Table, type(row).__table__)
    given = {c.key: row.__dict__[c.key] for c in table.columns if c.key in row.__dict__}
    dialect = session.get_bind().dialect.name
    key = plain.execute(session, statements[dialect], given).scalar()
    if key is None:
        return None
    (primary,) = table.primary_key.columns
    setattr(row, primary.key, key)
    make_transient_to_detached(row)  # as if loaded: no change of its own to flush
    session.add(row)
    return row
