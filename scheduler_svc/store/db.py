"""Engine, sessions and schema migrations for the store."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).parent / "migrations"
log = logging.getLogger(__name__)


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine tuned per backend. Built in the app's lifespan, never at import."""
    # Sized to the request thread pool (40) plus the background loops, so a burst
    # of requests queues on the database, not on the pool.
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_size=10,
            max_overflow=40,
            **kwargs,
        )
        _sqlite_immediate_transactions(engine)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=35, **kwargs)


def _sqlite_immediate_transactions(engine: Engine) -> None:
    """Take SQLite's write lock at BEGIN.

    A deferred transaction that reads and then writes cannot wait for the lock
    in WAL mode (SQLite answers "database is locked" at once to avoid a
    deadlock); BEGIN IMMEDIATE waits for it up to the busy timeout instead, so
    concurrent requests queue rather than fail.
    """

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
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")


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


def upgrade(url: str) -> None:
    """Bring the schema to the newest migration; safe to run on every start."""
    command.upgrade(alembic_config(url), "head")
