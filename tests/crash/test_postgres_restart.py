"""PostgreSQL goes away under load and comes back: the service recovers by itself.

A throw-away cluster (initdb + pg_ctl on a free port) is stopped while four
real agents keep reporting. Meanwhile /readyz answers 503 naming the store and
event posts answer 503 (the agents spool and retry); once the cluster is back
the same service process takes traffic again and every spooled event arrives.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from railover_testing.processes import (
    Agent,
    Cluster,
    Service,
    pg_bindir,
    stop_all,
    store_rows,
    wait_for,
)
from railover_testing.sysfs_faults import bump_counter
from railover_testing.sysfs_node import build_cluster
from scheduler_svc.store.db import upgrade
from tests.deploy.tools import tool_missing

NODES = [f"p{i}" for i in range(4)]
PORTS = [f"mlx5_{r}" for r in range(8)]


@pytest.fixture(autouse=True)
def _postgres_binaries() -> None:
    if pg_bindir() is None:
        tool_missing("needs PostgreSQL server binaries (initdb, pg_ctl)")


@pytest.mark.timeout(240)
def test_service_rides_out_a_postgres_restart(tmp_path: Path) -> None:
    pg = Cluster()
    pg.start()
    service: Service | None = None
    agents: list[Agent] = []
    try:
        upgrade(pg.url)
        service = Service(pg.url, tmp_path).start()
        cluster = build_cluster(tmp_path / "nodes", NODES)
        agents = [Agent(n, nd, rails, tmp_path, service.url) for n, (nd, rails) in cluster.items()]
        with httpx.Client(base_url=service.url, timeout=30) as http:
            wait_for(lambda: len(http.get("/v1/nodes").json()) == len(NODES), 120, "registrations")
            wait_for(lambda: all(a.metrics() for a in agents), 60, "agent metrics")

            def bump_all() -> None:
                before = [a.spooled() for a in agents]
                for a in agents:
                    for dev in PORTS:
                        bump_counter(a.node.root, dev, 1, "symbol_error")
                wait_for(
                    lambda: all(
                        a.spooled() >= b + len(PORTS) for a, b in zip(agents, before, strict=True)
                    ),
                    60,
                    "a round spooled",
                )

            bump_all()
            pg.stop()
            # The outage shows on /readyz while it lasts, naming the store.
            wait_for(lambda: http.get("/readyz").status_code == 503, 30, "/readyz to say 503")
            down = http.get("/readyz").json()
            assert down["status"] == "unavailable" and "store" in down["detail"]
            r = http.get("/v1/jobs")
            assert r.status_code == 503 and r.json()["error"] == "unavailable"
            assert r.headers["retry-after"] == "1"
            bump_all()  # spooled by the agents meanwhile
            bump_all()
            pg.start()
            wait_for(lambda: http.get("/readyz").status_code == 200, 60, "/readyz back to 200")
            assert service.proc is not None and service.proc.poll() is None  # never restarted
            bump_all()

            def drained() -> bool:
                return all(a.metrics().get("railover_agent_spool_events", 1) == 0 for a in agents)

            wait_for(drained, 120, "every spool drained")
        spooled = {a.name: a.spooled() for a in agents}
        stored = dict(store_rows(pg.url, "SELECT node, COUNT(*) FROM events GROUP BY node"))
        assert {n: float(c) for n, c in stored.items()} == spooled
        assert sum(spooled.values()) == len(NODES) * len(PORTS) * 4
    finally:
        stop_all([*agents, *([service] if service else [])])
        pg.remove()
