"""Decision latency: a fault posted over HTTP on loopback until its decision is stored.

The service runs as its own process (`railover serve`), as in production; the
client posts one port_down at a time for a 1,024-GPU job (128 nodes x 8 GPUs)
and times the request, which returns only after the decision has committed.
Each fault is cleared again so every decision sees one open fault.

    .venv/bin/python benchmarks/bench_decision_latency.py [--faults 300] [--backend sqlite,postgres]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg

from scheduler_svc.cluster_shapes import hgx_node
from scheduler_svc.local import free_port

PG_ADMIN = os.environ.get("RAILOVER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def run(db_url: str, nodes: int, faults: int) -> dict[str, float]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler_svc", "serve", "--port", str(port), "--db", db_url],
        env=os.environ | {"RAILOVER_LOG_LEVEL": "WARNING"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            for _ in range(300):
                try:
                    if http.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            names = [f"n{i:03d}" for i in range(nodes)]
            for n in names:
                http.put(f"/v1/nodes/{n}", json=hgx_node()).raise_for_status()
            checkpoint = datetime.now(UTC) - timedelta(hours=1)
            ranks = [
                {"rank": i * 8 + g, "node": n, "gpu": g}
                for i, n in enumerate(names)
                for g in range(8)
            ]
            job = {
                "job_id": "bench",
                "ranks": ranks,
                "checkpoint_interval_s": 3600,
                "reload_s": 600,
                "detect_s": 0,
                "timeout_s": 30,
                "last_checkpoint_at": checkpoint.isoformat(),
            }
            http.post("/v1/jobs", json=job).raise_for_status()
            latencies = []
            for i in range(faults):
                node, dev = names[i % nodes], f"mlx5_{i % 8}"
                at = (checkpoint + timedelta(seconds=2000 + i)).isoformat()
                down = {
                    "event_id": str(uuid.uuid4()),
                    "node": node,
                    "kind": "port_down",
                    "device": dev,
                    "port": 1,
                    "observed_at": at,
                }
                started = time.perf_counter()
                r = http.post("/v1/events", json={"events": [down]})
                latencies.append(time.perf_counter() - started)
                if r.status_code != 202 or len(r.json()["decisions"]) != 1:
                    raise RuntimeError(f"expected one decision, got {r.status_code}: {r.text}")
                up = down | {"event_id": str(uuid.uuid4()), "kind": "port_up"}
                http.post("/v1/events", json={"events": [up]}).raise_for_status()
            decisions = http.get("/v1/jobs/bench/decisions", params={"limit": 1000}).json()[
                "decisions"
            ]
            assert len(decisions) == faults
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    ms = [x * 1000 for x in latencies[10:]]  # the first few warm caches and pools
    return {
        "p50": percentile(ms, 50),
        "p90": percentile(ms, 90),
        "p99": percentile(ms, 99),
        "mean": statistics.fmean(ms),
        "n": len(ms),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--faults", type=int, default=300)
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--backend", default="sqlite,postgres")
    args = ap.parse_args()
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    print(
        f"machine: {os.cpu_count()} cores, {cpu}; job: {args.nodes * 8} GPUs; faults: {args.faults}"
    )
    print(f"{'backend':10} {'n':>5} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for backend in args.backend.split(","):
        if backend == "sqlite":
            tmp = tempfile.mkdtemp(prefix="railover-bench-")
            url = f"sqlite:///{tmp}/bench.db"
            res = run(url, args.nodes, args.faults)
        else:
            name = f"railover_bench_{uuid.uuid4().hex[:8]}"
            with psycopg.connect(PG_ADMIN, autocommit=True) as c:
                c.execute(f'CREATE DATABASE "{name}"')
            try:
                res = run(PG_ADMIN.rsplit("/", 1)[0] + "/" + name, args.nodes, args.faults)
            finally:
                with psycopg.connect(PG_ADMIN, autocommit=True) as c:
                    c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cells = " ".join(f"{res[k]:>8.1f}" for k in ("p50", "p90", "p99", "mean"))
        print(f"{backend:10} {res['n']:>5} {cells}")


if __name__ == "__main__":
    main()
