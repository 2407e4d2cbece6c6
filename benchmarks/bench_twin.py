"""The fleet twin at size: simulated days per wall second, events and decisions per wall
second, where the time goes (the service's answers or the twin's own bookkeeping), and
memory over the simulated time.

    .venv/bin/python -m benchmarks.bench_twin \
        [--nodes 256] [--days 7] [--fault-scale 100] [--policy railover] [--seed 1]

One run per policy asked for (all four by default), each on the same trace; the
numbers go in benchmarks/RESULTS.md ("The fleet twin"). Not part of `make test`
(tests/twin runs a short day there).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from benchmarks import benchlib
from scheduler_svc.engine.decision import Policy
from scheduler_svc.fleet.client import RailoverClient
from scheduler_svc.twin.cluster import ClusterSpec
from scheduler_svc.twin.harness import service, twin_settings
from scheduler_svc.twin.loop import Twin

PAGE = os.sysconf("SC_PAGE_SIZE")
_NAMED = re.compile(r"/(jobs|nodes|commands)/[^/?]+")


def _template(path: str) -> str:
    return _NAMED.sub(r"/\1/{}", path.split("?", maxsplit=1)[0])


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


class Timed:
    """Wall time spent waiting on the service's answers (the service runs in this process
    on a thread of its own: that wait is its work, the rest is the twin's)."""

    def __init__(self) -> None:
        self.waited = 0.0
        self.requests = 0
        # (method, path with names as {}) -> each request's wall seconds
        self.by_kind: dict[tuple[str, str], list[float]] = defaultdict(list)
        original = RailoverClient._request

        def request(client: RailoverClient, method: str, path: str, *a: Any, **kw: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(client, method, path, *a, **kw)
            finally:
                took = time.perf_counter() - started
                self.waited += took
                self.requests += 1
                self.by_kind[(method, _template(path))].append(took)

        RailoverClient._request = request  # type: ignore[method-assign,assignment]


def measure_floor() -> float:
    """The machine's floor in ms, measured now: an empty round trip to a twin's service, plus
    a one-row SQLite commit (benchlib.floor_ms)."""
    with tempfile.TemporaryDirectory(prefix="railover-floor-") as tmp:
        settings = twin_settings(Policy.RAILOVER, None, Path(tmp))
        with (
            service(settings, datetime.now(UTC)) as (_app, url, _clock),
            httpx.Client(base_url=url) as http,
        ):
            trip_ms, commit_ms = benchlib.floor_ms(http)
    return trip_ms + commit_ms


def print_kinds(by_kind: dict[tuple[str, str], list[float]], floor_ms: float) -> None:
    """Per kind of request, most wall time first: count, total, p50 and p99, the p50 also
    as a multiple of the floor."""
    head = f"{'count':>8} {'total s':>8} {'p50 ms':>7} {'p99 ms':>7} {'p50 x':>6}"
    print(f"    {'request':48} {head}")
    for (method, path), took in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        p50 = benchlib.percentile(took, 50) * 1e3
        p99 = benchlib.percentile(took, 99) * 1e3
        print(
            f"    {method + ' ' + path:48} {len(took):8,} {sum(took):8.1f} {p50:7.2f} "
            f"{p99:7.2f} {p50 / floor_ms:6.1f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--nodes-per-leaf", type=int, default=32)
    ap.add_argument("--spares", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--fault-scale", type=float, default=100.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policy", type=Policy, action="append")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    m = benchlib.machine()
    print(f"machine: {m['nproc']} cores, {m['cpu']}")
    floor = measure_floor()
    print(f"floor: {floor:.2f} ms (an empty round trip plus a one-row SQLite commit)")
    spec = ClusterSpec(args.nodes, args.spares, args.nodes_per_leaf, args.jobs)
    timed = Timed()
    for policy in args.policy or list(Policy):
        timed.waited, timed.requests = 0.0, 0
        timed.by_kind.clear()
        rss: dict[str, float] = {}

        started = time.perf_counter()
        days_done = [0]

        def progress(
            done: float,
            rss: dict[str, float] = rss,
            started: float = started,
            days_done: list[int] = days_done,
        ) -> None:
            if done * args.days >= 1 and "day 1" not in rss:
                rss["day 1"] = rss_mb()
            day = int(done * args.days)
            if day > days_done[0]:  # a line per simulated day: a month runs for a while
                days_done[0] = day
                print(
                    f"  day {day}: wall {time.perf_counter() - started:.0f} s, "
                    f"{timed.requests} requests, RSS {rss_mb():.0f} MB",
                    flush=True,
                )

        twin = Twin(
            spec,
            days=args.days,
            seed=args.seed,
            fault_scale=args.fault_scale,
            policy=policy,
            progress=progress,
        )
        r = twin.run()
        rss["end"] = rss_mb()
        decided = sum(r.decisions.values())
        print(
            f"{policy.value}: {args.nodes} nodes, {args.days:g} days at {args.fault_scale:g}x: "
            f"wall {r.wall_s:.1f} s, {args.days * 86400 / r.wall_s:,.0f}x real time; "
            f"{sum(r.faults.values())} faults {r.faults}; {r.events} events "
            f"({r.events / r.wall_s:.1f}/s), {decided} decisions ({decided / r.wall_s:.2f}/s), "
            f"{timed.requests} requests ({timed.requests / r.wall_s:.0f}/s); "
            f"waiting on the service {100 * timed.waited / r.wall_s:.0f} % of the wall time; "
            f"RSS MB {', '.join(f'{k} {v:.0f}' for k, v in rss.items())}; "
            f"lost {r.gpu_hours_total:,.1f} of {r.gpu_hours:,.0f} GPU-h; "
            f"violations {sum(r.violations.values())}"
        )
        print_kinds(timed.by_kind, floor)


if __name__ == "__main__":
    main()
