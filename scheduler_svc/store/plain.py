"""Statements run on a session's connection, past the ORM's execute layer.

`Session.execute` routes every statement, a column select or a Core UPDATE alike,
through the ORM's compile state, result setup and (for an UPDATE of a mapped class) its
bulk-update path that looks for the rows' objects in the identity map. For a statement
that loads no object and changes no row the session holds, that is most of its cost on
SQLite: 66 us against 30 us for a one-row column select (2-core "AMD EPYC" VM).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import CursorResult
from sqlalchemy.orm import Session
from sqlalchemy.sql.base import Executable

Params = Mapping[str, Any] | Sequence[Mapping[str, Any]] | None


def execute(
    session: Session, statement: Executable, params: Params = None, *, flush: bool = True
) -> CursorResult[Any]:
    """Run `statement` in the session's transaction, on its connection: for column selects
    and for writes to rows no object of the session mirrors (Core inserts; updates of
    rows it has not loaded, or whose loaded copies nothing reads again in the
    transaction).

    Flushed first, as the session's own execute autoflushes a statement built on mapped
    classes, so the statement sees every change made so far. `flush=False` for one built
    on tables or text, which the session's execute ran without flushing: the changes
    pending stay pending (an outbox event's commands are written at the commit, together).
    """
    if flush:
        session.flush()
    return session.connection().execute(statement, params)
