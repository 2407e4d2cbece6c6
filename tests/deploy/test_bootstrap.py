"""The install's first steps run concurrently and repeatedly: migrations and first tokens.

Several service replicas start together on an empty store (postgres-multi runs 3), and
the bootstrap Job may be retried. `railover db upgrade` serialises on a PostgreSQL
advisory lock (a file lock on SQLite); `railover token bootstrap` creates the fleet and
viewer tokens only on a store with none, under a lock of its own. Real processes,
real PostgreSQL.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from railover_testing.waiting import wait_for
from scheduler_svc.store.db import MIGRATION_LOCK
from tests.conftest import PG_ADMIN

RAILOVER = str(Path(sys.executable).parent / "railover")


@pytest.fixture
def empty_pg() -> Iterator[str]:
    """A database with no schema at all, as a fresh install meets it."""
    name = f"railover_boot_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield PG_ADMIN.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [RAILOVER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str, str]]:
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=180)
        out.append((p.returncode, stdout, stderr))
    return out


@pytest.mark.postgres
def test_three_upgrades_at_once_on_an_empty_postgres(empty_pg: str) -> None:
    results = finish([start("db", "upgrade", "--db", empty_pg) for _ in range(3)])
    assert [rc for rc, _, _ in results] == [0, 0, 0], results
    with psycopg.connect(empty_pg) as conn:
        (versions,) = conn.execute("SELECT count(*) FROM alembic_version").fetchone() or (0,)
    assert versions == 1


@pytest.mark.postgres
def test_upgrade_waits_for_the_migration_lock(empty_pg: str) -> None:
    with psycopg.connect(empty_pg, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
        proc = start("db", "upgrade", "--db", empty_pg)
        try:

            def waiting() -> int:
                row = holder.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                ).fetchone()
                return int(row[0]) if row else 0

            assert wait_for("the upgrade to ask for the migration lock", waiting, 120) == 1
            assert proc.poll() is None  # it waits while the lock is held
            with psycopg.connect(empty_pg) as probe:
                (tables,) = probe.execute(
                    "SELECT count(*) FROM pg_tables WHERE tablename = 'alembic_version'"
                ).fetchone() or (0,)
            assert tables == 0  # and has migrated nothing yet
        finally:
            holder.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
        ((rc, _, stderr),) = finish([proc])
    assert rc == 0, stderr


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_bootstrap_creates_a_fleet_and_a_viewer_token_once(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = f"sqlite:///{tmp_path / 'railover.db'}"
    if backend == "postgres":
        url = request.getfixturevalue("empty_pg")
    results = finish([start("token", "bootstrap", "--db", url) for _ in range(3)])
    assert [rc for rc, _, _ in results] == [0, 0, 0], results
    printed = [stdout.splitlines() for _, stdout, _ in results if stdout]
    assert len(printed) == 1, results  # exactly one run created them
    (lines,) = printed
    assert [line.split(" ")[0] for line in lines] == ["fleet", "viewer"]
    assert all(line.split(" ")[1].startswith("rvr_") for line in lines)
    listed = subprocess.run(
        [RAILOVER, "token", "list", "--db", url], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert sorted(row.split("\t")[1] for row in listed) == ["fleet", "viewer"]
    # Once there are tokens, a rerun (a retried Job) creates and prints nothing.
    ((rc, stdout, stderr),) = finish([start("token", "bootstrap", "--db", url)])
    assert rc == 0 and stdout == "" and "none created" in stderr
