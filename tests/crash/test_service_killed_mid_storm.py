"""The service is killed with SIGKILL in the middle of a fault storm from 16 real agents.

16 `railover-agent` processes on fixture nodes (8 GPUs, 8 RNICs each) report
counter rises and port faults, over 1,000 events in all; two jobs span the
nodes. The service is killed mid-storm and started again on the same store and
port. Afterwards every event each agent spooled is stored exactly once, no
(job, fault) has two decisions, and no command is left undelivered.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from railover_testing.processes import Agent, Service, stop_all, store_rows, wait_for
from railover_testing.sysfs_faults import bump_counter, set_port_state
from railover_testing.sysfs_node import build_cluster
from scheduler_svc.store.db import upgrade
from tests.scheduler_svc.helpers import job_body

NODES = [f"c{i:02d}" for i in range(16)]
PORTS = [f"mlx5_{r}" for r in range(8)]
COUNTERS = ("symbol_error", "link_downed")
ROUNDS = 4  # 16 nodes x 8 ports x 2 counters x 4 rounds = 1,024 counter events, plus the faults


@pytest.mark.timeout(240)
def test_kill_9_mid_storm_loses_and_doubles_nothing(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'railover.db'}"
    upgrade(db_url)
    service = Service(db_url, tmp_path, env={"RAILOVER_COMMAND_ACK_TIMEOUT_S": "2"}).start()
    cluster = build_cluster(tmp_path / "nodes", NODES)
    agents = [Agent(n, node, rails, tmp_path, service.url) for n, (node, rails) in cluster.items()]
    try:
        with httpx.Client(base_url=service.url, timeout=30) as http:
            wait_for(
                lambda: len(http.get("/v1/nodes").json()) == len(NODES), 120, "16 registrations"
            )
            for j, half in enumerate((NODES[:8], NODES[8:])):
                r = http.post("/v1/jobs", json=job_body(f"job{j}", half))
                assert r.status_code == 201, r.text
        wait_for(lambda: all(a.metrics() for a in agents), 60, "every agent's metrics")

        def storm_round(r: int) -> None:
            before = [a.spooled() for a in agents]
            for a in agents:
                for dev in PORTS:
                    for counter in COUNTERS:
                        bump_counter(a.node.root, dev, 1, counter)
            if r == 1:  # a fault under each job while the storm goes on
                for a in (agents[1], agents[9]):
                    set_port_state(a.node.root, "mlx5_2", 1, "DOWN")
            # Each agent saw this round's rises before the next round starts.
            wait_for(
                lambda: all(
                    a.spooled() >= b + len(PORTS) * len(COUNTERS)
                    for a, b in zip(agents, before, strict=True)
                ),
                60,
                f"round {r} spooled",
            )

        for rnd in range(ROUNDS):
            if rnd == ROUNDS // 2:
                wait_for(lambda: _stored(db_url) >= 300, 60, "300 events stored before the kill")
                service.kill9()
            storm_round(rnd)
            if rnd == ROUNDS // 2:
                service.start()
        for a in (agents[1], agents[9]):
            set_port_state(a.node.root, "mlx5_2", 1, "ACTIVE")

        def drained() -> bool:
            return all(a.metrics().get("railover_agent_spool_events", 1) == 0 for a in agents)

        wait_for(drained, 120, "every spool drained")
        spooled = {a.name: a.spooled() for a in agents}
        stored = dict(store_rows(db_url, "SELECT node, COUNT(*) FROM events GROUP BY node"))
        assert sum(spooled.values()) >= 1000
        assert {n: float(c) for n, c in stored.items()} == spooled
        for a in agents:
            dropped = [
                k
                for k, v in a.metrics().items()
                if k.startswith("railover_agent_events_dropped_total") and v
            ]
            assert dropped == [], (a.name, dropped)
        twice = store_rows(
            db_url,
            'SELECT job_id, "trigger", COUNT(*) FROM decisions '
            'GROUP BY job_id, "trigger" HAVING COUNT(*) > 1',
        )
        assert twice == []
        decided = store_rows(db_url, "SELECT DISTINCT job_id FROM decisions")
        assert sorted(j for (j,) in decided) == ["job0", "job1"]
        wait_for(
            lambda: (
                store_rows(db_url, "SELECT COUNT(*) FROM commands WHERE state = 'issued'") == [(0,)]
            ),
            60,
            "every command delivered, superseded or failed",
        )
    finally:
        stop_all([*agents, service])


def _stored(db_url: str) -> int:
    return int(store_rows(db_url, "SELECT COUNT(*) FROM events")[0][0])
