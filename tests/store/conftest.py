"""A session per test inside a transaction that is rolled back afterwards.

The schema is migrated once per backend and run; every test then works in an
outer transaction that the fixture rolls back, so tests see an empty store
without re-creating it, on SQLite and on PostgreSQL alike. Code under test
may commit savepoints (begin_nested) freely: they live inside that transaction.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from scheduler_svc.store.db import make_engine, upgrade
from tests.conftest import truncate_pg


@pytest.fixture(scope="session")
def sqlite_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('store') / 'railover.db'}"
    upgrade(url)
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    url = request.getfixturevalue("sqlite_store" if request.param == "sqlite" else "pg_url")
    if request.param == "postgres":
        # The run's PostgreSQL database is shared with suites that commit (and empty it
        # only when they start): start these from an empty store too.
        truncate_pg(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()


@pytest.fixture
def session(store_engine: Engine) -> Iterator[Session]:
    conn = store_engine.connect()
    outer = conn.begin()
    s = Session(bind=conn, join_transaction_mode="create_savepoint", expire_on_commit=False)
    try:
        yield s
    finally:
        s.close()
        outer.rollback()
        conn.close()
