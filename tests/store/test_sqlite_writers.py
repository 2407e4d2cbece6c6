"""SQLite writers of one process queue in order (store.db.FifoLock), released on every end.

SQLite's busy handler lets whichever waiter retries first win, so under a storm
one writer could lose for the whole busy timeout. These tests pin the order in
which waiting writers get the lock, the timeout, and that a transaction gives
the lock back however it ends: commit, rollback, a failed statement, a session
closed without either.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from railover_testing.waiting import wait_for
from scheduler_svc.store.db import FifoLock, make_engine, make_sessionmaker, sqlite_writers


def test_waiters_get_the_lock_in_the_order_they_asked() -> None:
    lock = FifoLock()
    assert lock.acquire(1)
    order: list[int] = []
    queued = threading.Semaphore(0)

    def wait(i: int) -> None:
        queued.release()
        assert lock.acquire(30)
        order.append(i)
        lock.release()

    threads = []
    for i in range(5):
        t = threading.Thread(target=wait, args=(i,))
        t.start()
        queued.acquire()
        # The thread is queued once the lock's queue holds it: wait for that, in turn.
        wait_for("queued", lambda: lock.waiting == i + 1, 10)  # noqa: B023  # waited on at once
        threads.append(t)
    lock.release()
    for t in threads:
        t.join(10)
    assert order == [0, 1, 2, 3, 4]


def test_a_waiter_gives_up_after_its_timeout_and_leaves_the_queue() -> None:
    lock = FifoLock()
    assert lock.acquire(1)
    assert lock.acquire(0.01) is False
    assert lock.waiting == 0
    lock.release()
    assert lock.acquire(0.01) is True  # free again, and nobody ahead


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    e = make_engine(f"sqlite:///{tmp_path / 'w.db'}")
    with e.begin() as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER PRIMARY KEY)"))
    yield e
    e.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return make_sessionmaker(engine)


def _write(s: Session, x: int) -> None:
    s.execute(text("INSERT INTO t (x) VALUES (:x)"), {"x": x})


def _next_writer_gets_in(sessions: sessionmaker[Session]) -> None:
    """A second writer starts and commits at once: the lock was given back."""
    done = threading.Event()

    def other() -> None:
        with sessions() as s:
            _write(s, 1000)
            s.execute(text("DELETE FROM t WHERE x = 1000"))
            s.commit()
        done.set()

    t = threading.Thread(target=other)
    t.start()
    t.join(5)
    assert done.is_set(), "the next writer is still waiting for the lock"


def test_commit_and_rollback_give_the_lock_back(sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        _write(s, 1)
        s.commit()
    _next_writer_gets_in(sessions)
    with sessions() as s:
        _write(s, 2)
        s.rollback()
    _next_writer_gets_in(sessions)


def test_a_failed_statement_and_a_session_closed_mid_transaction_give_it_back(
    sessions: sessionmaker[Session],
) -> None:
    with sessions() as s:
        _write(s, 3)
        s.commit()
        with pytest.raises(Exception, match="UNIQUE"):
            _write(s, 3)
    _next_writer_gets_in(sessions)
    s = sessions()
    _write(s, 4)
    s.close()  # neither committed nor rolled back: the pool resets the connection
    _next_writer_gets_in(sessions)


def test_a_writer_waits_for_the_one_holding_the_lock(
    engine: Engine, sessions: sessionmaker[Session]
) -> None:
    writers = sqlite_writers(engine)
    assert writers is not None
    holder = sessions()
    _write(holder, 5)
    finished = threading.Event()

    def other() -> None:
        with sessions() as s:
            _write(s, 6)
            s.commit()
        finished.set()

    t = threading.Thread(target=other)
    t.start()
    # Queued behind the holder (not failing, not writing beside it) until it commits.
    wait_for("the second writer queued", lambda: writers.waiting == 1, 10)
    assert not finished.is_set()
    holder.commit()
    holder.close()
    t.join(10)
    assert finished.is_set()
