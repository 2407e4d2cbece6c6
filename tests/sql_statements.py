"""The SQL statements sent meanwhile, as SQLAlchemy's cursor hook sees them: for tests that
count what a request or a repository asks of the store."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine
from sqlalchemy import event as sa_event


@contextmanager
def statements(target: Engine | type[Engine] = Engine) -> Iterator[list[str]]:
    """Each statement sent on `target` meanwhile (every engine in this process by default),
    its whitespace folded to single spaces."""
    seen: list[str] = []

    def hook(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(" ".join(statement.split()))

    sa_event.listen(target, "before_cursor_execute", hook)
    try:
        yield seen
    finally:
        sa_event.remove(target, "before_cursor_execute", hook)
