"""Readiness follows the ability to commit (issue 30: /readyz answered 200 while every
write answered 503).

Another process holding the SQLite store's write lock is what a read cannot see: reads go
on, every write waits out its busy timeout and answers 503. /readyz now commits a probe
write, so it answers 503 while the lock is held and 200 as soon as it is let go.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import pytest
from sqlalchemy.exc import DBAPIError

from railover_testing.local import local_service
from scheduler_svc.config import Settings
from scheduler_svc.store.db import make_engine, probe_commit


def test_readyz_is_503_while_another_process_holds_the_write_lock(tmp_path: Path) -> None:
    db = tmp_path / "railover.db"
    settings = Settings(
        db_url=f"sqlite:///{db}", port=0, allow_anonymous_loopback=True, ready_probe_timeout_s=0.2
    )
    with local_service(settings) as url, httpx.Client(base_url=url, timeout=30) as http:
        assert http.get("/readyz").status_code == 200
        holder = sqlite3.connect(db, isolation_level=None)
        try:
            holder.execute("BEGIN EXCLUSIVE")
            r = http.get("/readyz")
            assert r.status_code == 503, r.text
            assert r.json()["status"] == "unavailable" and "locked" in r.json()["detail"]["store"]
            # Reads still work: the store answers SELECT 1, which is all /readyz asked before.
            assert http.get("/healthz").status_code == 200
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert http.get("/readyz").status_code == 200


@pytest.mark.postgres
def test_the_probe_fails_on_a_read_only_postgresql_and_passes_on_a_writable_one(
    pg_url: str,
) -> None:
    writable = make_engine(pg_url)
    read_only = make_engine(pg_url, connect_args={"options": "-c default_transaction_read_only=on"})
    try:
        probe_commit(writable, 2.0)
        with pytest.raises(DBAPIError, match="read-only"):
            probe_commit(read_only, 2.0)
    finally:
        writable.dispose()
        read_only.dispose()
