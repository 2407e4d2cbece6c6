"""Many ranks acknowledging one switch point at once, as a whole job does when it passes it."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from railover_testing.local import local_service
from scheduler_svc.config import Settings
from tests.scheduler_svc.helpers import job_body, register_nodes

NODES = ["n0", "n1", "n2", "n3"]


def _event(node: str, kind: str, at: datetime, **extra: Any) -> dict[str, Any]:
    return {
        "event_id": str(uuid.uuid4()),
        "node": node,
        "kind": kind,
        "port": 1,
        "observed_at": at.isoformat(),
        **extra,
    }


def test_concurrent_too_late_acks_retrigger_once_without_errors(db_url: str) -> None:
    settings = Settings(
        db_url=db_url, port=0, allow_anonymous_loopback=True, coordinator_interval_s=0.1
    )
    with local_service(settings) as url, httpx.Client(base_url=url, timeout=30) as http:
        register_nodes(http, NODES)
        checkpoint = datetime.now(UTC) - timedelta(seconds=3000)
        body = job_body(
            "j",
            NODES,
            last_checkpoint_at=checkpoint.isoformat(),
            communicators=[{"comm_id": 77, "channels": 16}],
        )
        assert http.post("/v1/jobs", json=body).status_code == 201
        t = datetime.now(UTC) - timedelta(seconds=1)
        progress = [
            _event(n, "progress", t, device=None, comm_id=77, rank=i * 8 + g, ops_done=500)
            for i, n in enumerate(NODES)
            for g in range(8)
        ]
        fault = _event("n1", "port_down", datetime.now(UTC), device="mlx5_3")
        for batch in (progress, [fault]):
            assert http.post("/v1/events", json={"events": batch}).status_code == 202
        first = [
            c for c in http.get("/v1/jobs/j/commands").json()["commands"] if c["kind"] == "balance"
        ]
        assert sorted(c["node"] for c in first) == NODES

        # Every rank of every node reports the trigger passed, all at once.
        def ack(cmd: dict[str, Any], rank: int) -> int:
            late = {"node": cmd["node"], "rank": rank, "status": "too_late", "ops_done": 5000}
            with httpx.Client(base_url=url, timeout=30) as c:
                return c.post(f"/v1/commands/{cmd['command_id']}/acks", json=late).status_code

        with ThreadPoolExecutor(max_workers=16) as pool:
            codes = list(pool.map(lambda a: ack(*a), [(c, r) for c in first for r in c["ranks"]]))
        # Before the job was locked ahead of the command, PostgreSQL found a deadlock
        # between an ack and the re-trigger another ack had started (HTTP 500).
        assert codes == [200] * 32

        after = [
            c for c in http.get("/v1/jobs/j/commands").json()["commands"] if c["kind"] == "balance"
        ]
        e1 = first[0]["epoch"]  # epochs count over every kind: the failover took one
        assert {c["state"] for c in after if c["epoch"] == e1} <= {"failed", "superseded"}
        second = [c for c in after if c["epoch"] == e1 + 1]
        assert sorted(c["node"] for c in second) == NODES  # one re-trigger, not one per ack
        assert {c["state"] for c in second} == {"issued"}
        assert not [c for c in after if c["epoch"] > e1 + 1]
        (trigger1,) = {c["ops_done"] for c in first}
        (trigger2,) = {c["ops_done"] for c in second}
        assert trigger2 > trigger1
