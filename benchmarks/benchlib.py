"""What the benchmarks share: the machine they ran on, percentiles, a served store."""

from __future__ import annotations

import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg

from railover_testing.local import free_port

PG_ADMIN = os.environ.get("RAILOVER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def machine() -> dict[str, Any]:
    """Cores, CPU model (all /proc/cpuinfo names on a VM) and kernel, for RESULTS.md."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu": model, "kernel": platform.release()}


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, q in 0..100."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def floor_ms(http: httpx.Client, rounds: int = 200) -> tuple[float, float]:
    """(median empty round trip, median one-row SQLite commit), each in ms."""
    trips = []
    for _ in range(rounds):
        started = time.perf_counter()
        http.get("/healthz").raise_for_status()
        trips.append(time.perf_counter() - started)
    commits = []
    with tempfile.TemporaryDirectory(prefix="railover-floor-") as tmp:
        db = sqlite3.connect(Path(tmp) / "floor.db", isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
        for i in range(rounds):
            started = time.perf_counter()
            db.execute("BEGIN")
            db.execute("INSERT INTO t (v) VALUES (?)", (str(i),))
            db.execute("COMMIT")
            commits.append(time.perf_counter() - started)
        db.close()
    return percentile(trips, 50) * 1e3, percentile(commits, 50) * 1e3


@contextmanager
def scratch_store(backend: str) -> Iterator[str]:
    """An empty store URL of `backend` (sqlite or postgres), removed afterwards."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="railover-bench-") as tmp:
            yield f"sqlite:///{tmp}/bench.db"
        return
    if backend != "postgres":
        raise ValueError(f"backend: sqlite or postgres, not {backend!r}")
    name = f"railover_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_ADMIN.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def job_body(job_id: str, members: list[str], checkpoint: datetime) -> dict[str, Any]:
    """A job with 8 ranks on each of `members`, an hour between checkpoints."""
    return {
        "job_id": job_id,
        "ranks": [
            {"rank": i * 8 + g, "node": n, "gpu": g}
            for i, n in enumerate(members)
            for g in range(8)
        ],
        "checkpoint_interval_s": 3600,
        "reload_s": 600,
        "timeout_s": 30,
        "last_checkpoint_at": checkpoint.isoformat(),
    }


@contextmanager
def served(db_url: str) -> Iterator[str]:
    """`railover serve` in its own process, as in production; yields its base URL."""
    with served_process(db_url) as (url, _):
        yield url


@contextmanager
def served_process(
    db_url: str,
    *,
    head: tuple[str, ...] = ("-m", "scheduler_svc"),
    env: dict[str, str] | None = None,
) -> Iterator[tuple[str, int]]:
    """`railover serve` (run by `python <head>`) with `env` added; yields its URL and pid."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, *head, "serve", "--dev", "--port", str(port), "--db", db_url],
        env=os.environ | {"RAILOVER_LOG_LEVEL": "WARNING"} | (env or {}),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the service did not start")
            time.sleep(0.1)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=60)
