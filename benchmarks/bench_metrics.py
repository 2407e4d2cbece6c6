"""/metrics at fleet size: series, bytes and scrape time with N nodes x 8 RNICs registered.

The service runs as its own process (`railover serve`). `--nodes` HGX nodes register
(8 GPU-fabric RNIC ports each), `--down` of their ports go down (one event each, so
a few faults are open), then Prometheus' view is taken `--scrapes` times: each
scrape's seconds, its size and the number of series it holds, counted the way
Prometheus counts them (one per sample line), in total and per metric family for the
largest families.

    .venv/bin/python -m benchmarks.bench_metrics [--nodes 8192] [--down 16] [--scrapes 20]
        [--backend sqlite,postgres]
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections import Counter
from datetime import UTC, datetime

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks import bench_registration, benchlib


def series_by_family(text: str) -> Counter[str]:
    """Samples per metric family, as the exposition text holds them."""
    return Counter(
        {family.name: len(family.samples) for family in text_string_to_metric_families(text)}
    )


def run(db_url: str, nodes: int, down: int, scrapes: int) -> dict[str, object]:
    with benchlib.served(db_url) as url, httpx.Client(base_url=url, timeout=120) as http:
        names = [f"n{i:05d}" for i in range(nodes)]
        bench_registration.register(url, names)
        for i in range(down):
            event = {
                "event_id": str(uuid.uuid4()),
                "node": names[i * nodes // max(down, 1)],
                "kind": "port_down",
                "device": f"mlx5_{i % 8}",
                "port": 1,
                "observed_at": datetime.now(UTC).isoformat(),
            }
            http.post("/v1/events", json={"events": [event]}).raise_for_status()
        seconds: list[float] = []
        text = ""
        for _ in range(scrapes):
            started = time.perf_counter()
            r = http.get("/metrics")
            seconds.append(time.perf_counter() - started)
            r.raise_for_status()
            text = r.text
        families = series_by_family(text)
        return {
            "nodes": nodes,
            "ports": nodes * 8,
            "down": down,
            "series": sum(families.values()),
            "bytes": len(text.encode()),
            "scrape_p50_ms": benchlib.percentile(seconds, 50) * 1e3,
            "scrape_p99_ms": benchlib.percentile(seconds, 99) * 1e3,
            "largest": ", ".join(f"{name} {n}" for name, n in families.most_common(4)),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8192)
    parser.add_argument("--down", type=int, default=16)
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--backend", default="sqlite")
    args = parser.parse_args()
    print(benchlib.machine())
    for backend in args.backend.split(","):
        with benchlib.scratch_store(backend) as db_url:
            result = run(db_url, args.nodes, args.down, args.scrapes)
        print(backend, result)


if __name__ == "__main__":
    main()
