"""SQL statements and commits per fault report, beside its latency and the machine's floor.

The service runs in this process (the real app, over real HTTP on loopback), so
SQLAlchemy's engine events can count what each report costs the store: every
statement sent (`before_cursor_execute`) and every commit, from the request's
arrival to its answer, which comes after the decision and its commands committed.
The coordinator is off, so nothing else runs meanwhile.

For each job size (`--nodes` HGX nodes of 8 GPUs: 128 is 1,024 GPUs, 8,192 is 65,536)
one job spans every node; faults hit even-numbered RNICs as in bench_decision_latency
(every one a failover decision), each answered port_up at once (not counted).

The floor is measured in the same run on the same machine: an empty HTTP round trip to
the same service (GET /healthz) plus one SQLite commit of one row in a scratch file.
Latencies are printed in milliseconds and as multiples of it (issue 33's aims hold as
multiples: 1k p50 <= 3x, 64k p99 <= 10x).

    .venv/bin/python -m benchmarks.bench_statements [--nodes 128,1024,8192] [--faults 60]
        [--backend sqlite,postgres] [--evidence memory|store|store,memory]

`--evidence store,memory` runs each size twice, the second time with the fabric's evidence
held in memory (the default, `RAILOVER_EVIDENCE_IN_MEMORY`), the first read from the store
at every report as before it.
"""

from __future__ import annotations

import argparse
import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import event
from sqlalchemy.engine import Engine

from benchmarks import bench_registration, benchlib
from scheduler_svc.config import Settings
from scheduler_svc.main import create_app
from scheduler_svc.twin.inprocess import served_app


@dataclass
class Tally:
    """Statements and commits counted by the engine hooks while `on` is set."""

    on: bool = False
    statements: int = 0
    commits: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def statement(self, *_: Any) -> None:
        if self.on:
            with self.lock:
                self.statements += 1

    def commit(self, *_: Any) -> None:
        if self.on:
            with self.lock:
                self.commits += 1

    @contextmanager
    def counting(self) -> Iterator[None]:
        self.statements = self.commits = 0
        self.on = True
        try:
            yield
        finally:
            self.on = False


@contextmanager
def hooked(tally: Tally) -> Iterator[None]:
    """Count on every engine in this process (the service's writers and readers)."""
    event.listen(Engine, "before_cursor_execute", tally.statement)
    event.listen(Engine, "commit", tally.commit)
    try:
        yield
    finally:
        event.remove(Engine, "before_cursor_execute", tally.statement)
        event.remove(Engine, "commit", tally.commit)


def fault(names: list[str], i: int, kind: str, at: datetime) -> dict[str, Any]:
    nodes = len(names)
    return {
        "event_id": str(uuid.uuid4()),
        "node": names[i % nodes],
        "kind": kind,
        "device": f"mlx5_{2 * (i // nodes % 4)}",
        "port": 1,
        "observed_at": at.isoformat(),
    }


def run(db_url: str, nodes: int, faults: int, evidence: str = "memory") -> dict[str, float]:
    settings = Settings(
        db_url=db_url,
        allow_anonymous_loopback=True,
        coordinator=False,
        command_ack_timeout_s=86400,
        evidence_in_memory=evidence == "memory",
    )
    tally = Tally()
    with served_app(create_app(settings)) as url, httpx.Client(base_url=url, timeout=300) as http:
        names = [f"n{i:05d}" for i in range(nodes)]
        bench_registration.register(url, names)
        checkpoint = datetime.now(UTC) - timedelta(hours=1)
        http.post("/v1/jobs", json=benchlib.job_body("bench", names, checkpoint)).raise_for_status()
        trip_ms, commit_ms = benchlib.floor_ms(http)
        latencies: list[float] = []
        statements: list[float] = []
        commits: list[float] = []
        with hooked(tally):
            for i in range(faults):
                down = fault(names, i, "port_down", checkpoint + timedelta(seconds=2000 + i))
                with tally.counting():
                    started = time.perf_counter()
                    r = http.post("/v1/events", json={"events": [down]})
                    took = time.perf_counter() - started
                if r.status_code != 202 or len(r.json()["decisions"]) != 1:
                    raise RuntimeError(f"fault {i}: {r.status_code} {r.text[:300]}")
                latencies.append(took * 1e3)
                statements.append(tally.statements)
                commits.append(tally.commits)
                up = down | {"event_id": str(uuid.uuid4()), "kind": "port_up"}
                up["observed_at"] = datetime.now(UTC).isoformat()
                http.post("/v1/events", json={"events": [up]}).raise_for_status()
    warm = slice(5, None)  # the first few warm caches and pools
    floor = trip_ms + commit_ms
    p50 = benchlib.percentile(latencies[warm], 50)
    p99 = benchlib.percentile(latencies[warm], 99)
    return {
        "gpus": nodes * 8,
        "floor_ms": floor,
        "p50_ms": p50,
        "p99_ms": p99,
        "p50_x": p50 / floor,
        "p99_x": p99 / floor,
        "statements_p50": benchlib.percentile(statements[warm], 50),
        "statements_max": max(statements[warm]),
        "commits_p50": benchlib.percentile(commits[warm], 50),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", default="128,1024,8192")
    ap.add_argument("--faults", type=int, default=60)
    ap.add_argument("--backend", default="sqlite,postgres")
    ap.add_argument(
        "--evidence",
        default="memory",
        help="memory (the default: the service's view), store (read every time), or both "
        "in the order given, e.g. store,memory",
    )
    args = ap.parse_args()
    m = benchlib.machine()
    print(f"machine: {m['nproc']} cores, {m['cpu']}; {args.faults} faults per size")
    print(
        f"{'backend':9} {'evidence':8} {'GPUs':>6} {'floor ms':>8} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'p50 x':>6} {'p99 x':>6} {'stmts p50':>9} {'stmts max':>9} {'commits':>7}"
    )
    for backend in args.backend.split(","):
        for nodes, evidence in itertools.product(
            (int(n) for n in args.nodes.split(",")), args.evidence.split(",")
        ):
            with benchlib.scratch_store(backend) as url:
                r = run(url, nodes, args.faults, evidence)
            print(
                f"{backend:9} {evidence:8} {r['gpus']:>6.0f} {r['floor_ms']:>8.2f} "
                f"{r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f} {r['p50_x']:>6.1f} {r['p99_x']:>6.1f} "
                f"{r['statements_p50']:>9.0f} {r['statements_max']:>9.0f} "
                f"{r['commits_p50']:>7.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
