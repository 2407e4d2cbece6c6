"""Registration at scale: an 8,192-node fleet's PUT /v1/nodes, then a 65,536-rank POST /v1/jobs.

The service runs as its own process (`railover serve`). Nodes register from 8 client
threads, as agents starting together would; then one client posts the whole job (its
JSON encoded beforehand, so the figure is the service's), deletes it, and posts it
again, `--posts` times. Each POST returns after the job is validated and committed. The
first POST is shown apart, and each POST's CPU seconds in the service process beside its
wall time (the CPU figure holds on a machine shared with other work).

    .venv/bin/python -m benchmarks.bench_registration [--nodes 8192] [--posts 5]
        [--backend sqlite,postgres]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from benchmarks import benchlib
from railover_testing.cluster_shapes import hgx_node

THREADS = 8


def register(
    url: str, names: list[str], body: Callable[[int], dict[str, Any]] | None = None
) -> list[float]:
    """PUT every node from THREADS clients (`body(i)`: the i-th node's, by default an HGX
    node's); each request's seconds."""
    local = threading.local()
    hgx = hgx_node()

    def put(i: int) -> float:
        if not hasattr(local, "http"):
            local.http = httpx.Client(base_url=url, timeout=60)
        started = time.perf_counter()
        payload = hgx if body is None else body(i)
        local.http.put(f"/v1/nodes/{names[i]}", json=payload).raise_for_status()
        return time.perf_counter() - started

    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(put, range(len(names))))


def cpu_s(pid: int) -> float:
    """The process's user + system CPU seconds so far (/proc; 0 where there is none): what
    a POST cost the service, whatever else shares the machine."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(db_url: str, nodes: int, posts: int) -> dict[str, float]:
    with (
        benchlib.served_process(db_url) as (url, pid),
        httpx.Client(base_url=url, timeout=120) as http,
    ):
        names = [f"n{i:05d}" for i in range(nodes)]
        started = time.perf_counter()
        puts = register(url, names)
        fleet_s = time.perf_counter() - started
        checkpoint = datetime.now(UTC) - timedelta(hours=1)
        body = json.dumps(benchlib.job_body("big", names, checkpoint)).encode()
        headers = {"Content-Type": "application/json"}
        seconds, cpu = [], []
        for _ in range(posts):
            started, used = time.perf_counter(), cpu_s(pid)
            r = http.post("/v1/jobs", content=body, headers=headers)
            seconds.append(time.perf_counter() - started)
            cpu.append(cpu_s(pid) - used)
            if r.status_code != 201:
                raise RuntimeError(f"POST /v1/jobs: {r.status_code} {r.text[:500]}")
            http.delete("/v1/jobs/big").raise_for_status()
        return {
            "nodes": nodes,
            "ranks": nodes * 8,
            "fleet_s": fleet_s,
            "put_p50_ms": benchlib.percentile(puts, 50) * 1e3,
            "put_p99_ms": benchlib.percentile(puts, 99) * 1e3,
            "job_body_mb": len(body) / 1e6,
            "post_first_s": seconds[0],
            "post_first_cpu_s": cpu[0],
            "post_later_cpu_s": statistics.median(cpu[1:] or cpu),
            "post_min_s": min(seconds),
            "post_median_s": statistics.median(seconds),
            "post_max_s": max(seconds),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=8192, help="8 GPUs each")
    ap.add_argument("--posts", type=int, default=5, help="POSTs of the whole job")
    ap.add_argument("--backend", default="sqlite,postgres")
    args = ap.parse_args()
    print(f"machine: {benchlib.machine()}")
    print(
        "| store | nodes | ranks | fleet registered s | PUT p50 ms | PUT p99 ms | job MB "
        "| POST first s | POST min s | POST median s | POST max s "
        "| first POST CPU s | later POSTs' CPU s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for backend in args.backend.split(","):
        with benchlib.scratch_store(backend) as db_url:
            r = run(db_url, args.nodes, args.posts)
        print(
            f"| {backend} | {r['nodes']:,} | {r['ranks']:,} | {r['fleet_s']:.1f} "
            f"| {r['put_p50_ms']:.1f} | {r['put_p99_ms']:.1f} | {r['job_body_mb']:.1f} "
            f"| {r['post_first_s']:.2f} | {r['post_min_s']:.2f} | {r['post_median_s']:.2f} "
            f"| {r['post_max_s']:.2f} | {r['post_first_cpu_s']:.2f} "
            f"| {r['post_later_cpu_s']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
