"""Group commit: small writes of concurrent requests share one transaction.

When a leaf switch fails, 64 nodes report within a second, and each report is
a small write (the event, its fault, a correlation read) followed by the
fabric-wide bookkeeping of its request (the audit row). One transaction each
means 128 turns of SQLite's one writer (PostgreSQL: of the switch's advisory
lock), and every turn hands the lock to another thread that first has to get
the interpreter back from the 130 others. The storm then queues for seconds
behind work that takes milliseconds.

So such writes go through `GroupCommit.run`. The first caller to find no batch
running runs its own work at once, in a transaction of its own; whoever
arrives while it runs waits, and the first of them to find it ended runs
every work queued by then in one transaction, each work in a savepoint of its
own. A work that raises is rolled back to its savepoint, alone, and its caller
gets the exception; the others' writes commit. When the commit itself fails,
every caller whose work had succeeded gets that error, and nothing of the
batch is stored. A quiet service therefore pays nothing (a batch of one runs
at once, in a transaction without a savepoint), and a storm pays one commit per batch.

A work must be short and must not commit: it runs in the leader's thread,
and everything queued behind it waits for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from scheduler_svc import metrics
from scheduler_svc.store.uow import Notify, checkpoint_hooks, restore_hooks, unit_of_work

T = TypeVar("T")

# At most this many works share one transaction; the rest wait for the next.
MAX_BATCH = 256


@dataclass
class _Work(Generic[T]):
    work: Callable[[Session], T]
    done: bool = False
    result: T | None = None
    error: BaseException | None = None


class GroupCommit:
    """Runs short writes of concurrent callers in shared transactions (see the module)."""

    def __init__(
        self,
        factory: sessionmaker[Session],
        notify: Notify | None = None,
        *,
        max_batch: int = MAX_BATCH,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch: {max_batch}, at least 1")
        self._factory = factory
        self._notify = notify
        self._max_batch = max_batch
        self._cond = threading.Condition()
        self._queue: list[_Work[Any]] = []
        self._running = False
        self.batches = 0  # transactions run, for tests and probes

    @property
    def queued(self) -> int:
        """Works waiting for a batch to take them now."""
        with self._cond:
            return len(self._queue)

    def run(self, work: Callable[[Session], T]) -> T:
        """Run `work(session)` in a transaction shared with concurrent callers; its
        result once that transaction has committed, or the exception it raised."""
        item: _Work[T] = _Work(work)
        with self._cond:
            self._queue.append(item)
            while not item.done:
                if self._running:
                    self._cond.wait()
                    continue
                batch, self._queue = (
                    self._queue[: self._max_batch],
                    self._queue[self._max_batch :],
                )
                self._running = True
                self._cond.release()
                try:
                    self._execute(batch)
                finally:
                    self._cond.acquire()
                    self._running = False
                    for done in batch:
                        done.done = True
                    self._cond.notify_all()
        if item.error is not None:
            raise item.error
        return item.result  # type: ignore[return-value]  # set by a work that returned

    def _execute(self, batch: list[_Work[Any]]) -> None:
        self.batches += 1
        metrics.GROUP_COMMIT_WORKS.observe(len(batch))
        try:
            with unit_of_work(self._factory, self._notify) as session:
                if len(batch) == 1:
                    # Alone in its transaction, a work that raises rolls back all of it
                    # and its caller gets the exception (below): no savepoint is needed,
                    # and a quiet service's report sends no SAVEPOINT and RELEASE.
                    batch[0].result = batch[0].work(session)
                    return
                for item in batch:
                    hooks = checkpoint_hooks(session)
                    try:
                        with session.begin_nested():
                            item.result = item.work(session)
                    except Exception as exc:
                        # Its savepoint is rolled back; so is what it queued for after commit.
                        restore_hooks(session, hooks)
                        item.result, item.error = None, exc
        except BaseException as exc:
            # Nothing of the batch is stored: each work that had succeeded fails with it,
            # and each caller raises it in its own thread, the leader too.
            for item in batch:
                if item.error is None:
                    item.result, item.error = None, exc
