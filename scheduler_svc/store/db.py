"""Engine, sessions and schema migrations for the store."""

from __future__ import annotations

import fcntl
import functools
import logging
import sqlite3
import threading
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, make_url, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

# evidence_view is imported for its hooks: every engine of a process that writes the store
# counts its evidence writes in the evidence stamp, whether or not it keeps a view itself.
from scheduler_svc.store import evidence_view, plain  # noqa: F401

MIGRATIONS = Path(__file__).parent / "migrations"
log = logging.getLogger(__name__)


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine tuned per backend. Built in the app's lifespan, never at import."""
    # Sized to the request thread pool (40) plus the background loops, so a burst
    # of requests queues on the database, not on the pool.
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S},
            pool_size=10,
            max_overflow=40,
            **kwargs,
        )
        _sqlite_immediate_transactions(engine)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=35, **kwargs)


SQLITE_BUSY_TIMEOUT_S = 30.0


class FifoLock:
    """A lock handed to its waiters in the order they asked, each waiting at most a timeout.

    SQLite's own busy handler is not fair: a waiting connection sleeps and retries
    (every 100 ms once it has waited a while), and whoever retries at the right
    moment wins. Under a storm of writers one of them could lose for the whole
    busy timeout and fail with "database is locked" while the lock was free
    most of the time. The writers of one process queue here first, in order;
    only writers of other processes (the CLI) still meet the busy handler.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held = False
        self._queue: deque[threading.Event] = deque()

    def acquire(self, timeout: float) -> bool:
        with self._mutex:
            if not self._held and not self._queue:
                self._held = True
                return True
            turn = threading.Event()
            self._queue.append(turn)
        turn.wait(timeout)
        with self._mutex:
            if turn.is_set():  # handed over, possibly just as the wait timed out
                return True
            self._queue.remove(turn)
            return False

    @property
    def waiting(self) -> int:
        """Writers queued behind the holder now."""
        with self._mutex:
            return len(self._queue)

    def release(self) -> None:
        with self._mutex:
            if self._queue:
                self._queue.popleft().set()  # held throughout: straight to the next
            else:
                self._held = False


_WRITE_LOCK = "railover_write_lock"
_WRITERS: weakref.WeakKeyDictionary[Engine, FifoLock] = weakref.WeakKeyDictionary()


def sqlite_writers(engine: Engine) -> FifoLock | None:
    """The queue of a SQLite engine's writers (None for PostgreSQL): for tests and probes."""
    return _WRITERS.get(engine)


def _sqlite_immediate_transactions(engine: Engine) -> None:
    """Take SQLite's write lock at BEGIN, after this process's earlier writers.

    A deferred transaction that reads and then writes cannot wait for the lock
    in WAL mode (SQLite answers "database is locked" at once to avoid a
    deadlock); BEGIN IMMEDIATE waits for it up to the busy timeout instead, so
    concurrent requests queue rather than fail. They queue in a FifoLock of the
    engine first, released when the transaction ends however it ends (commit,
    rollback, the pool's reset or an invalidated connection).
    """
    writers = _WRITERS[engine] = FifoLock()

    def release(info: dict[str, Any]) -> None:
        if info.pop(_WRITE_LOCK, False):
            writers.release()

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # let SQLAlchemy's begin event drive BEGIN
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        # Read-only sessions (see make_read_sessionmaker) need no write lock:
        # in WAL mode their plain BEGIN never waits for, or blocks, a writer.
        if conn.get_execution_options().get(READ_ONLY_OPTION):
            conn.exec_driver_sql("BEGIN")
            return
        if not writers.acquire(SQLITE_BUSY_TIMEOUT_S):
            raise sqlite3.OperationalError(
                f"database is locked: this process's other writers held it for "
                f"{SQLITE_BUSY_TIMEOUT_S:.0f} s"
            )
        conn.info[_WRITE_LOCK] = True
        try:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        except BaseException:
            release(conn.info)
            raise

    @event.listens_for(engine, "commit")
    def _commit(conn: Any) -> None:
        # Before the COMMIT runs: the next writer then waits in SQLite's busy
        # handler only for the commit itself. Released after it, the lock would
        # stay held if the COMMIT raised; the rollback that follows finds it gone.
        release(conn.info)

    @event.listens_for(engine, "rollback")
    def _rollback(conn: Any) -> None:
        release(conn.info)

    @event.listens_for(engine.pool, "reset")
    def _reset(_dbapi_conn: Any, record: Any, _reset_state: Any) -> None:
        release(record.info)

    @event.listens_for(engine.pool, "invalidate")
    def _invalidate(_dbapi_conn: Any, record: Any, *_: Any) -> None:
        release(record.info)


READ_ONLY_OPTION = "railover_read_only"


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False, autoflush=True)


def make_read_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """Sessions for reads only (auth, GETs, polls that find nothing): no SQLite write lock."""
    return sessionmaker(
        engine.execution_options(**{READ_ONLY_OPTION: True}), expire_on_commit=False
    )


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


# PostgreSQL advisory lock keys ("railover" in ASCII, and the next one): shared by every
# Railover process on a database, so two of them never migrate or bootstrap at once.
MIGRATION_LOCK = 0x7261696C6F766572
BOOTSTRAP_LOCK = MIGRATION_LOCK + 1


def upgrade(url: str) -> None:
    """Bring the schema to the newest migration; safe to run on every start, concurrently.

    Several replicas' init containers start together on an empty store. Without a
    lock each would find no schema and create it, and all but one would fail on a
    half-made one. The lock serialises them: the first migrates, the others then
    find the newest schema and have nothing to do. PostgreSQL: a session advisory
    lock, released when its connection closes even if this process dies. SQLite: an
    exclusive flock on a file next to the database.
    """
    if at_head(url):
        return  # every start of every replica, every test: nothing to lock or load
    with migration_lock(url):
        command.upgrade(alembic_config(url), "head")


@functools.cache
def newest_revision() -> str:
    """This code's newest migration, read from the migration files once per process (alembic
    loads and compiles every one of them to find it: tens of milliseconds)."""
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None, "the package ships its migrations"
    return head


def at_head(url: str) -> bool:
    """Whether the store's schema is already this code's newest one: a read of one row."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            current = MigrationContext.configure(conn).get_current_heads()
    finally:
        engine.dispose()
    return current == (newest_revision(),)


@contextmanager
def migration_lock(url: str) -> Iterator[None]:
    if url.startswith("postgresql"):
        engine = create_engine(url, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK})
                conn.commit()
                try:
                    yield
                finally:
                    conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK})
                    conn.commit()
        finally:
            engine.dispose()
        return
    path = make_url(url).database if url.startswith("sqlite") else None
    if not path or path == ":memory:":
        yield
        return
    with open(f"{path}.migrate-lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def take_bootstrap_lock(session: Session) -> None:
    """Serialise bootstrap transactions: until this one commits, no other bootstraps.

    PostgreSQL: a transaction advisory lock. SQLite: the write lock BEGIN IMMEDIATE
    already holds (see _sqlite_immediate_transactions).
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": BOOTSTRAP_LOCK})


# PostgreSQL NOTIFY channel of the commits that issue commands; the payload is their nodes'
# names, space-separated (a Name never holds a space), notify.CommandListener reads it.
COMMANDS_CHANNEL = "railover_commands"
# PostgreSQL refuses a payload of 8000 bytes or more: longer lists go in several NOTIFYs.
_PAYLOAD_MAX_BYTES = 7900


def publish_command_nodes(session: Session, nodes: Iterable[str]) -> None:
    """NOTIFY every replica's listener that these nodes got commands (PostgreSQL only).

    Called inside the transaction that issued them: PostgreSQL delivers the
    notification when, and only if, it commits.
    """
    if session.get_bind().dialect.name != "postgresql":
        return
    for payload in _payloads(sorted(set(nodes))):
        plain.execute(
            session,
            text("SELECT pg_notify(:channel, :payload)"),
            {"channel": COMMANDS_CHANNEL, "payload": payload},
            flush=False,
        )


def _payloads(nodes: list[str]) -> Iterator[str]:
    chunk: list[str] = []
    size = 0
    for n in nodes:
        need = len(n.encode()) + 1
        if chunk and size + need > _PAYLOAD_MAX_BYTES:
            yield " ".join(chunk)
            chunk, size = [], 0
        chunk.append(n)
        size += need
    if chunk:
        yield " ".join(chunk)


def command_nodes_from_payload(payload: str) -> list[str]:
    return payload.split()


def probe_commit(engine: Engine, timeout_s: float) -> None:
    """Commit one write transaction, or raise: what readiness needs to know.

    A read (SELECT 1) succeeds while every write fails: a SQLite file another process
    holds locked, a full disk, a PostgreSQL server in recovery or read-only. SQLite: on
    a connection of its own (so the wait is `timeout_s`, not the writers' busy timeout),
    the write lock and a rewrite of the header's user_version, which Railover does not
    use. PostgreSQL: a transaction id and its commit, in a transaction not read-only.
    """
    if engine.dialect.name == "sqlite":
        path = engine.url.database
        if not path or path == ":memory:":
            return
        raw = sqlite3.connect(path, timeout=timeout_s, isolation_level=None)
        try:
            raw.execute("BEGIN IMMEDIATE")
            (version,) = raw.execute("PRAGMA user_version").fetchone()
            raw.execute(f"PRAGMA user_version = {int(version)}")
            raw.execute("COMMIT")
        finally:
            raw.close()
        return
    with engine.connect() as conn:
        conn.execute(
            text("SELECT set_config('statement_timeout', :ms, true)"),
            {"ms": str(int(timeout_s * 1000))},
        )
        # An id is refused in recovery (a standby); a read-only transaction still gets one.
        conn.execute(text("SELECT txid_current()"))
        if conn.execute(text("SELECT current_setting('transaction_read_only')")).scalar() == "on":
            raise OperationalError(
                "SELECT txid_current()", None, Exception("the store is read-only")
            )
        conn.commit()
