"""The unit of work: one transaction, committed in one place, then its after-commit hooks.

Repositories (store/nodes.py, jobs.py, faults.py, commands.py, ...) flush at most and
never commit. Requests (deps.get_session and api/routing.py), the coordinator's sweeps and
the CLI all end a transaction through `commit`. What must only happen once the
change is durable (waking the long-polls of nodes that got commands) is queued
on the session with `after_commit` or `notify_nodes` and runs right after it.
On PostgreSQL the nodes are also NOTIFYed inside the transaction, so the other
replicas' long-polls wake when it commits (scheduler_svc/services/delivery.py).
The clock is passed in the same way: services take `now` from their caller,
and callers take it from a `Clock`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from sqlalchemy.orm import Session, sessionmaker

from scheduler_svc.store.db import publish_command_nodes

Clock = Callable[[], datetime]
Notify = Callable[[set[str]], None]

_HOOKS = "railover_after_commit"
_NODES = "notify_nodes"
_NOTIFY = "railover_notify"
_HELD = "railover_held"
_AFTER_ANSWER = "railover_after_answer"


def system_clock() -> datetime:
    return datetime.now(UTC)


def after_commit(session: Session, hook: Callable[[], None]) -> None:
    """Run `hook` once this session's transaction has committed (never on rollback)."""
    session.info.setdefault(_HOOKS, []).append(hook)


def answering(session: Session) -> list[Callable[[], object]]:
    """Mark `session` as serving a request: `after_answer` work queued on it lands in the
    list returned, which the request runs once its answer is sent (api/deps.py)."""
    later: list[Callable[[], object]] = []
    session.info[_AFTER_ANSWER] = later
    return later


def after_answer(session: Session, work: Callable[[], object]) -> None:
    """Run `work` once the answer of the request this session serves is sent; where it
    serves none (a sweep, the CLI), not at all. So `work` is only ever what is done anyway
    when first needed (a job index's lookups) or what nothing waits for (letting go of an
    evicted index, which frees millions of objects)."""
    later: list[Callable[[], object]] | None = session.info.get(_AFTER_ANSWER)
    if later is not None:
        later.append(work)


def notify_nodes(session: Session, nodes: Iterable[str]) -> None:
    """After commit, wake the command long-polls of these nodes."""
    session.info.setdefault(_NODES, set()).update(nodes)


def hold(session: Session, rows: Iterable[object]) -> None:
    """Keep these loaded rows in the session's identity map until the session closes.

    The identity map holds a row only while something else does: rows a read turns into
    engine values are dropped at once, and a later `session.get` of one in the same
    transaction (a decision's fault for its CloudEvent, a communicator for its next
    epoch) is another SELECT. Held, it is answered from memory with the values this
    transaction read. Until `release` (the end of each job's pass) or the session's end."""
    session.info.setdefault(_HELD, []).extend(rows)


def release(session: Session) -> None:
    """Let go of the rows `hold` kept: a sweep reconciles many jobs in one session, and
    each job's rows (a large job's communicators hold every rank) are its pass's alone."""
    session.info.pop(_HELD, None)


def bind_notify(session: Session, notify: Notify) -> None:
    """Where this session's `notify_nodes` go (the app's notifier)."""
    session.info[_NOTIFY] = notify


def pending_nodes(session: Session) -> set[str]:
    nodes: set[str] = session.info.get(_NODES, set())
    return nodes


def checkpoint_hooks(session: Session) -> tuple[int, frozenset[str]]:
    """What this session has queued for after commit so far (see `restore_hooks`)."""
    return len(session.info.get(_HOOKS, [])), frozenset(session.info.get(_NODES, set()))


def restore_hooks(session: Session, checkpoint: tuple[int, frozenset[str]]) -> None:
    """Forget what was queued for after commit since `checkpoint`: the work that queued
    it was rolled back to a savepoint (store/groupcommit.py)."""
    count, nodes = checkpoint
    del session.info.setdefault(_HOOKS, [])[count:]
    session.info[_NODES] = set(nodes)


def commit(session: Session) -> None:
    """Commit, then run the after-commit hooks and wake the nodes that got commands."""
    nodes: set[str] = session.info.pop(_NODES, set())
    if nodes:
        publish_command_nodes(session, nodes)
    session.commit()
    hooks: list[Callable[[], None]] = session.info.pop(_HOOKS, [])
    notify: Notify | None = session.info.get(_NOTIFY)
    if nodes and notify is not None:
        notify(nodes)
    for hook in hooks:
        hook()


@contextmanager
def unit_of_work(factory: sessionmaker[Session], notify: Notify | None = None) -> Iterator[Session]:
    """A session whose work is committed (with its hooks) on success, rolled back on error."""
    session = factory()
    if notify is not None:
        bind_notify(session, notify)
    try:
        yield session
        commit(session)
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
