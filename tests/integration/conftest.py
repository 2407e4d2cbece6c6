"""Fixtures for the whole-system tests: the plugin library and a store of each backend.

PostgreSQL follows the service tests' convention: the server at RAILOVER_TEST_PG
(default 127.0.0.1:5432, trust auth), a database made for this run and dropped at
the end; unreachable means failure unless RAILOVER_TEST_SKIP_PG=1.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text

from native_plugin.binding import DEFAULT_LIBRARY, library_path
from scheduler_svc.store.db import make_engine, upgrade
from scheduler_svc.store.models import Base

PG_ADMIN = os.environ.get("RAILOVER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
PLUGIN_DIR = Path(__file__).resolve().parents[2] / "native_plugin"


@pytest.fixture(scope="session")
def plugin_lib() -> Path:
    """The plugin the simulated ranks load; built on first use when missing."""
    path = library_path()
    if not path.is_file() and path == DEFAULT_LIBRARY:
        if shutil.which("make") is None or shutil.which("cc") is None:
            pytest.skip("librailover_plugin.so is not built and there is no C toolchain")
        subprocess.run(["make", "-s", "-C", str(PLUGIN_DIR)], check=True)
    return path


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    if os.environ.get("RAILOVER_TEST_SKIP_PG") == "1":
        pytest.skip("RAILOVER_TEST_SKIP_PG=1")
    name = f"railover_it_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + "/" + name
    upgrade(url)
    yield url
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty store of each backend."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'railover.db'}"
        upgrade(url)
        return url
    pg: str = request.getfixturevalue("pg_url")
    engine = make_engine(pg)
    tables = ", ".join(t.name for t in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    engine.dispose()
    return pg
