"""Insert-unless-taken: a unique key, not a read before the write, tells that a row is
already there (faults, decisions, switch faults, flags, communicators, stalls).

Two ways: `insert_new`, one INSERT ... ON CONFLICT DO NOTHING on the key (the busy
paths: a report's event and fault, a switch failure, a pass's decision);
`insert_unless_taken`, a flush in a savepoint that catches the collision (the rest).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from sqlalchemy import Column, Table, TextualSelect, bindparam, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, make_transient_to_detached
from sqlalchemy.sql.schema import CallableColumnDefault, ScalarElementColumnDefault

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


@dataclass(frozen=True, slots=True)
class ConflictInsert:
    """A one-row INSERT of a model's row that does nothing where its unique key is taken,
    returning the new row's primary key (`on_conflict_insert`)."""

    statement: TextualSelect
    columns: tuple[Column[Any], ...]  # every column given, in the statement's order
    primary: Column[Any]


def on_conflict_insert(model: type[m.Base], key: Sequence[str], where: str = "") -> ConflictInsert:
    """The INSERT of a `model` row that does nothing when a row with the same `key`
    columns is there (`where`: the partial unique index's condition, as SQL).

    Written as text, the same for both stores: SQLAlchemy's own ON CONFLICT insert of
    either dialect has no cache key, so it was compiled again for every row (278 us a
    fault on SQLite, against 50 us for this text, whose compiled form is cached). Its
    parameters are typed by the columns (times and JSON bound as the ORM binds them).
    Built once, at import, by the repository that uses it."""
    table = cast(Table, model.__table__)
    (primary,) = table.primary_key.columns
    columns = tuple(c for c in table.columns if c is not table.autoincrement_column)
    names = ", ".join(_quoted(c.name) for c in columns)
    values = ", ".join(f":{c.key}" for c in columns)
    target = ", ".join(_quoted(k) for k in key) + (f") WHERE {where}" if where else ")")
    # Names from the model's own table and the repository's constant key and condition,
    # never from a request: every value is a bound parameter.
    sql = (
        f"INSERT INTO {_quoted(table.name)} ({names}) VALUES ({values}) "  # noqa: S608
        f"ON CONFLICT ({target} DO NOTHING RETURNING {_quoted(primary.name)}"
    )
    statement = text(sql).bindparams(*(bindparam(c.key, type_=c.type) for c in columns))
    return ConflictInsert(statement.columns(primary), columns, primary)


_PREPARERS = (sqlite.dialect().identifier_preparer, postgresql.dialect().identifier_preparer)  # type: ignore[no-untyped-call]


def _quoted(name: str) -> str:
    """A name as SQL, quoted where either store needs it ("trigger"), as SQLAlchemy
    writes it."""
    return max((p.quote(name) for p in _PREPARERS), key=len)


def insert_new(session: Session, insert: ConflictInsert, row: _Row) -> _Row | None:
    """Insert `row` (a new object, not yet in the session) by `insert` (made by
    `on_conflict_insert` for its model); None when its key is taken.

    One statement whether or not it collides, and no savepoint. A column the object
    leaves unset takes its scalar default (else NULL), on the object too; the object then
    joins the session as the stored row, its key set."""
    given = _every_column(insert, row.__dict__)
    for c in insert.columns:
        if c.key not in row.__dict__:
            setattr(row, c.key, given[c.key])
    key = plain.execute(session, insert.statement, given).scalar()
    if key is None:
        return None
    setattr(row, insert.primary.key, key)
    make_transient_to_detached(row)  # as if loaded: no change of its own to flush
    session.add(row)
    return row


def insert_values(session: Session, insert: ConflictInsert, values: Mapping[str, Any]) -> Any:
    """Insert one row of `values` by `insert` (a column not given: its scalar default,
    else NULL); its primary key, or None when its unique key is taken."""
    return plain.execute(session, insert.statement, _every_column(insert, values)).scalar()


def _every_column(insert: ConflictInsert, values: Mapping[str, Any]) -> dict[str, Any]:
    """A value for each column `insert` gives: from `values`, else the column's default."""
    return {c.key: values[c.key] if c.key in values else _default(c) for c in insert.columns}


def _default(column: Column[Any]) -> Any:
    """A column's Python-side default (a value, or a function of no argument), else None."""
    default = column.default
    if isinstance(default, ScalarElementColumnDefault):
        return default.arg
    if isinstance(default, CallableColumnDefault):
        # SQLAlchemy wraps a function of no argument into one of a context it ignores.
        return default.arg(None)  # type: ignore[arg-type]
    return None
