"""Fixtures every suite shares: the built plugin, and the service on each store backend.

Store tests run on SQLite and on PostgreSQL. PostgreSQL is the server at
RAILOVER_TEST_PG (default 127.0.0.1:5432, trust auth), in a database made for
this run and dropped at the end; when it is unreachable the PostgreSQL cases
fail rather than skip, unless RAILOVER_TEST_SKIP_PG=1: CI must not go green
without them.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from hypothesis import Phase
from hypothesis import settings as hypothesis_settings
from psycopg import sql
from sqlalchemy import Engine

from native_plugin.abi import DEFAULT_LIBRARY, library_path
from railover_testing.local import local_service
from scheduler_svc.config import Settings
from scheduler_svc.store.db import make_engine, upgrade
from scheduler_svc.store.models import Base
from tests.deploy.tools import tool_missing

# Under `make mutation` a property test only has to fail: shrinking the failing example
# (a minute or more for the job-index equivalence test) tells mutmut nothing more, and
# the example database would carry one mutant's failures into the next mutant's run.
hypothesis_settings.register_profile(
    "mutation", phases=(Phase.explicit, Phase.reuse, Phase.generate), database=None
)
if os.environ.get("RAILOVER_HYPOTHESIS_PROFILE"):
    hypothesis_settings.load_profile(os.environ["RAILOVER_HYPOTHESIS_PROFILE"])

# The costliest files are handed out first, costliest first (seconds from a
# `--durations` run on the 2-core VM, 2026-12-06): `make test` gives its two workers one
# file at a time in collection order (`--no-loadscope-reorder`; xdist's own order, most
# tests first, put the two-test schemathesis file last, and its 147 s ran with the other
# worker idle). A new file that takes half a minute belongs in this list.
SLOW_FIRST = (
    "tests/fuzz/test_schemathesis.py",  # 147 s
    "tests/scheduler_svc/test_sequences_model_findings.py",  # 68 s
    "tests/integration/test_cluster_coordination.py",  # 63 s
    "tests/scheduler_svc/test_sequences_model.py",  # 54 s
    "tests/agent/test_agent_e2e_service.py",  # 39 s
    "tests/twin/",  # 28 s, 14 s, ...
    "tests/crash/",  # 28 s, 16 s, 15 s
    "tests/scheduler_svc/test_a_day_on_a_broken_nic.py",  # 28 s
    "tests/scheduler_svc/test_command_stream.py",  # 28 s
    "tests/scheduler_svc/test_sequences_regressions.py",  # 25 s
    "tests/scheduler_svc/test_big_job_registration.py",  # 23 s
    "tests/fleet/test_client.py",  # 22 s
    "tests/integration/",
    "tests/slurm/",
    "tests/web/",
    "tests/deploy/",
    # The demo (40-80 s) plays a timed script (a 1 s maintenance window, 3 s of damping):
    # after the heaviest files, not beside schemathesis on a loaded machine.
    "tests/test_demo.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def order(item: pytest.Item) -> int:
        for i, prefix in enumerate(SLOW_FIRST):
            if item.nodeid.startswith(prefix):
                return i
        return len(SLOW_FIRST)

    items.sort(key=order)  # stable: the other files in collection order


@pytest.fixture(autouse=True)
def _logger_levels() -> Iterator[None]:
    """Every logger's level as it was before the test. Product code run in this process
    quietens loggers for its own run (`railover twin` sets railover and scheduler_svc to
    ERROR), and a logger one test left quiet hides the records a later test on the same
    worker reads (which tests share a worker depends on the order files are handed out)."""
    loggers = logging.Logger.manager.loggerDict
    before = {n: lg.level for n, lg in loggers.items() if isinstance(lg, logging.Logger)}
    root = logging.getLogger().level
    yield
    for name, lg in list(loggers.items()):
        if isinstance(lg, logging.Logger) and lg.level != before.get(name, logging.NOTSET):
            lg.setLevel(before.get(name, logging.NOTSET))
    logging.getLogger().setLevel(root)


PG_ADMIN = os.environ.get("RAILOVER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
PLUGIN_DIR = Path(__file__).resolve().parents[1] / "native_plugin"


@pytest.fixture(scope="session")
def plugin_lib() -> Path:
    """The plugin library; built on first use when it is the default build output."""
    path = library_path()
    if not path.is_file() and path == DEFAULT_LIBRARY:
        if shutil.which("make") is None or shutil.which("cc") is None:
            tool_missing("librailover_plugin.so is not built and there is no C toolchain")
        subprocess.run(["make", "-s", "-C", str(PLUGIN_DIR)], check=True)
    return path


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    if os.environ.get("RAILOVER_TEST_SKIP_PG") == "1":
        pytest.skip("RAILOVER_TEST_SKIP_PG=1")
    name = f"railover_test_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
        # A commit need not wait for its WAL to reach the disk: nothing here crashes this
        # server (tests/crash restarts a cluster of its own), so no commit can be lost,
        # and every test on PostgreSQL runs without an fsync per transaction.
        conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    url = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + "/" + name
    upgrade(url)
    yield url
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def truncate_pg(url: str) -> None:
    """Empty every table and restart every id sequence (the schema stays): each test
    starts from a clean store, its ids from 1.

    Row deletes, children first, not TRUNCATE: on stores this small they take a tenth
    of the time (TRUNCATE swaps each table's files), and this runs before every test on
    PostgreSQL. The store has no row triggers, so the two leave the same tables."""
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        conn.execute("SET synchronous_commit = off")
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(table.name)))
        sequences = conn.execute(
            "SELECT sequence_name FROM information_schema.sequences"
            " WHERE sequence_schema = current_schema()"
        ).fetchall()
        for (name,) in sequences:
            conn.execute(sql.SQL("ALTER SEQUENCE {} RESTART").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def sqlite_migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty SQLite store migrated once; each test gets a copy (a copy takes
    milliseconds, running the migrations a tenth of a second)."""
    path = tmp_path_factory.mktemp("sqlite-migrated") / "railover.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty store of each backend."""
    if request.param == "sqlite":
        path = tmp_path / "railover.db"
        shutil.copyfile(request.getfixturevalue("sqlite_migrated"), path)
        return f"sqlite:///{path}"
    pg: str = request.getfixturevalue("pg_url")
    truncate_pg(pg)
    return pg


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """The store of each backend (`db_url`), opened as the service opens it."""
    e = make_engine(db_url)
    yield e
    e.dispose()


@pytest.fixture
def settings(db_url: str) -> Settings:
    return Settings(
        db_url=db_url, port=0, allow_anonymous_loopback=True, webhook_allow_loopback=True
    )


@pytest.fixture
def service(settings: Settings) -> Iterator[str]:
    """The real service over HTTP on loopback; yields its base URL."""
    with local_service(settings) as url:
        yield url


@pytest.fixture
def http(service: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service, timeout=30) as client:
        yield client
