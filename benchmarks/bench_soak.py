"""Soak: events per second held for minutes with faults, a service kill and a PostgreSQL restart.

Real processes throughout: a throw-away PostgreSQL cluster (initdb + pg_ctl),
`railover serve`, and one `railover-agent` per fixture node. Every tick the
script raises an error counter on every RNIC port of every node (one event
each), flaps a port now and then (a fault, a decision, a recovery), kills the
service with SIGKILL at 30 % of the run and restarts it, and stops PostgreSQL
at 60 % for a few seconds. At the end every agent's spool must be empty and
the store must hold exactly what the agents spooled, with no (job, fault)
decided twice.

    .venv/bin/python -m benchmarks.bench_soak --seconds 600 [--nodes 8] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from railover_testing.processes import Agent, Cluster, Service, stop_all, store_rows, wait_for
from railover_testing.sysfs_faults import bump_counter, set_port_state
from railover_testing.sysfs_node import build_cluster
from scheduler_svc.store.db import upgrade

PORTS = [f"mlx5_{r}" for r in range(8)]


def _stored(db_url: str) -> int:
    return int(store_rows(db_url, "SELECT COUNT(*) FROM events")[0][0])


def run(seconds: float, nodes: int, tick_s: float) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    pg = Cluster()
    pg.start()
    upgrade(pg.url)
    env = {"RAILOVER_CORRELATION_MIN_NODES": "1000", "RAILOVER_FAILBACK_DAMPING_S": "5"}
    service = Service(pg.url, work, env=env).start()
    names = [f"s{i:02d}" for i in range(nodes)]
    cluster = build_cluster(work / "nodes", names)
    agents = [Agent(n, nd, rails, work, service.url) for n, (nd, rails) in cluster.items()]
    samples: list[tuple[float, int]] = []
    outages: dict[str, float] = {}
    try:
        with httpx.Client(base_url=service.url, timeout=30) as http:
            wait_for(lambda: len(http.get("/v1/nodes").json()) == nodes, 300, "registrations")
            half = max(1, nodes // 2)
            # A GPU has one running job: one node is one job.
            for j, members in enumerate(m for m in (names[:half], names[half:]) if m):
                body = {
                    "job_id": f"soak{j}",
                    "ranks": [
                        {"rank": i * 8 + g, "node": n, "gpu": g}
                        for i, n in enumerate(members)
                        for g in range(8)
                    ],
                    "checkpoint_interval_s": 3600,
                    "reload_s": 600,
                    "timeout_s": 30,
                    "last_checkpoint_at": "2026-11-01T12:00:00+00:00",
                }
                http.post("/v1/jobs", json=body).raise_for_status()
        wait_for(lambda: all(a.metrics() for a in agents), 120, "agent metrics")
        chaos: list[threading.Thread] = []

        def kill_and_restart() -> None:
            t0 = time.monotonic()
            service.kill9()
            service.start()
            outages["service_kill_restart_s"] = time.monotonic() - t0

        def restart_postgres() -> None:
            t0 = time.monotonic()
            pg.stop()
            wait_for(
                lambda: httpx.get(f"{service.url}/readyz", timeout=5).status_code == 503,
                60,
                "/readyz 503",
            )
            outages["readyz_saw_outage"] = 1.0
            time.sleep(5)  # an outage of a few seconds, on purpose
            pg.start()
            wait_for(service.ready, 120, "/readyz back")
            outages["postgres_outage_s"] = time.monotonic() - t0

        start = time.monotonic()
        killed = pg_restarted = False
        flap = 0
        down: tuple[Agent, str] | None = None
        next_tick = start
        while (now := time.monotonic()) < start + seconds:
            for a in agents:
                for dev in PORTS:
                    bump_counter(a.node.root, dev, 1, "symbol_error")
            elapsed = now - start
            if int(elapsed) // 30 > flap:  # a port flap every 30 s, on a rotating node
                flap += 1
                if down is not None:
                    set_port_state(down[0].node.root, down[1], 1, "ACTIVE")
                down = (agents[flap % len(agents)], PORTS[flap % len(PORTS)])
                set_port_state(down[0].node.root, down[1], 1, "DOWN")
            # The outages run beside the storm: the agents keep reporting through them.
            if not killed and elapsed > 0.3 * seconds:
                killed = True
                chaos.append(threading.Thread(target=kill_and_restart))
                chaos[-1].start()
            if not pg_restarted and elapsed > 0.6 * seconds:
                pg_restarted = True
                chaos.append(threading.Thread(target=restart_postgres))
                chaos[-1].start()
            if len(samples) == 0 or now - samples[-1][0] >= 10:
                # No sample while the store is down for its restart.
                with contextlib.suppress(Exception):
                    samples.append((now, _stored(pg.url)))
            next_tick += tick_s
            time.sleep(max(0.0, next_tick - time.monotonic()))
        for t in chaos:
            t.join()
        for a in agents:
            for dev in PORTS:
                set_port_state(a.node.root, dev, 1, "ACTIVE")
        wait_for(
            lambda: all(a.metrics().get("railover_agent_spool_events", 1) == 0 for a in agents),
            600,
            "spools drained",
        )
        end = time.monotonic()
        spooled = {a.name: a.spooled() for a in agents}
        stored = {
            n: float(c)
            for n, c in store_rows(pg.url, "SELECT node, COUNT(*) FROM events GROUP BY node")
        }
        dropped = sum(
            v
            for a in agents
            for k, v in a.metrics().items()
            if k.startswith("railover_agent_events_dropped_total")
        )
        twice = store_rows(
            pg.url,
            'SELECT job_id, "trigger" FROM decisions GROUP BY job_id, "trigger" '
            "HAVING COUNT(*) > 1",
        )
        decisions = int(store_rows(pg.url, "SELECT COUNT(*) FROM decisions")[0][0])
        faults = int(store_rows(pg.url, "SELECT COUNT(*) FROM faults")[0][0])
    finally:
        stop_all([*agents, service])
        pg.remove()
    rates = [(c1 - c0) / (t1 - t0) for (t0, c0), (t1, c1) in itertools.pairwise(samples) if t1 > t0]
    total = sum(stored.values())
    return {
        "seconds": seconds,
        "nodes": nodes,
        "rnic_ports": nodes * len(PORTS),
        "events_stored": total,
        "events_spooled": sum(spooled.values()),
        "lost": sum(spooled.values()) - total,
        "dropped": dropped,
        "per_node_match": spooled == stored,
        "events_per_s_mean": total / (end - start),
        "events_per_s_10s_min": min(rates) if rates else None,
        "events_per_s_10s_median": statistics.median(rates) if rates else None,
        "faults": faults,
        "decisions": decisions,
        "decided_twice": len(twice),
        "drain_s": end - (start + seconds),
        **outages,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--tick", type=float, default=0.5, help="seconds between counter rounds")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = run(args.seconds, args.nodes, args.tick)
    if args.json:
        print(json.dumps(r, indent=2))
        return
    print(f"soak {r['seconds']:.0f} s, {r['nodes']} agents, {r['rnic_ports']} RNIC ports")
    print(
        f"  events      {r['events_stored']:.0f} stored of {r['events_spooled']:.0f} spooled "
        f"(lost {r['lost']:.0f}, dropped {r['dropped']:.0f}, per node equal: "
        f"{r['per_node_match']})"
    )
    print(
        f"  rate        mean {r['events_per_s_mean']:.0f}/s; 10 s windows: median "
        f"{r['events_per_s_10s_median'] or 0:.0f}/s, min {r['events_per_s_10s_min'] or 0:.0f}/s"
    )
    print(
        f"  faults      {r['faults']} opened, {r['decisions']} decisions, "
        f"{r['decided_twice']} (job, trigger) decided twice"
    )
    print(
        f"  outages     service kill + restart {r.get('service_kill_restart_s', 0):.1f} s, "
        f"PostgreSQL down {r.get('postgres_outage_s', 0):.1f} s; drained "
        f"{r['drain_s']:.1f} s after the end"
    )


if __name__ == "__main__":
    main()
