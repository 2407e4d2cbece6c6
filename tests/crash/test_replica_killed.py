"""Two replicas on one PostgreSQL; one is killed with SIGKILL in the middle of deciding.

A reporter posts one fault per batch to replica A, as agents behind a load
balancer would, and moves to replica B when A stops answering, resending the
batch it had in flight. A is killed once decisions are being made. B finishes
the work: every fault is stored once and decided, and no (job, fault) has two
decisions, whether A's last transaction committed or not.
"""

from __future__ import annotations

import json
import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from railover_testing.cluster_shapes import hgx_node
from railover_testing.processes import Service, stop_all, store_rows, wait_for
from tests.conftest import truncate_pg
from tests.scheduler_svc.helpers import job_body

NODES = ["r0", "r1", "r2", "r3"]
JOBS = 12
# A GPU has one running job: each node has 12 GPUs behind each of its 8 RNICs, and job j
# takes the j-th behind each, so every fault still touches every job.
NODE = hgx_node(rails=8, gpus=8 * JOBS, switches=8)


def _job(j: int) -> dict[str, Any]:
    body = job_body(f"job{j}", NODES)
    body["ranks"] = [
        {"rank": i * 8 + s, "node": n, "gpu": s * JOBS + j}
        for i, n in enumerate(NODES)
        for s in range(8)
    ]
    return body


def _fault(node: str, device: str) -> dict[str, Any]:
    return {
        "event_id": uuid.uuid4().hex,
        "node": node,
        "kind": "port_down",
        "device": device,
        "port": 1,
        "observed_at": (datetime.now(UTC) - timedelta(seconds=1)).isoformat(),
    }


@pytest.mark.postgres
@pytest.mark.timeout(240)
def test_the_other_replica_completes_and_nothing_is_decided_twice(
    pg_url: str, tmp_path: Path
) -> None:
    truncate_pg(pg_url)
    # No switch inference here: each fault decides for the jobs on its own node.
    env = {"RAILOVER_CORRELATION_MIN_NODES": "1000", "RAILOVER_COMMAND_ACK_TIMEOUT_S": "2"}
    a = Service(pg_url, tmp_path, env=env).start()
    b = Service(pg_url, tmp_path, env=env).start()
    try:
        with httpx.Client(base_url=a.url, timeout=30) as http:
            for n in NODES:
                assert http.put(f"/v1/nodes/{n}", json=NODE).status_code == 200
            for j in range(JOBS):
                assert http.post("/v1/jobs", json=_job(j)).status_code == 201
        batches = [[_fault(n, f"mlx5_{d}")] for d in range(8) for n in NODES]
        answers: list[tuple[str, int]] = []
        failures: list[BaseException] = []

        def report() -> None:
            targets = [a.url, b.url]
            try:
                for batch in batches:
                    while True:
                        try:
                            r = httpx.post(
                                f"{targets[0]}/v1/events", json={"events": batch}, timeout=30
                            )
                        except httpx.TransportError:
                            targets.reverse()  # the load balancer drops the dead replica
                            continue
                        if r.status_code >= 500:
                            targets.reverse()
                            continue
                        assert r.status_code == 202, r.text
                        answers.append((targets[0], r.json()["accepted"]))
                        break
            except BaseException as exc:
                failures.append(exc)

        reporter = threading.Thread(target=report)
        reporter.start()
        wait_for(
            lambda: store_rows(pg_url, "SELECT COUNT(*) FROM decisions")[0][0] >= JOBS * 3,
            120,
            "decisions under way",
            step=0.01,
        )
        a.kill9()
        reporter.join(180)
        assert not reporter.is_alive() and not failures, failures
        assert {url for url, _ in answers} == {a.url, b.url}
        stored = store_rows(pg_url, "SELECT COUNT(*), COUNT(DISTINCT event_id) FROM events")
        assert stored == [(len(batches), len(batches))]
        faults = store_rows(pg_url, "SELECT id FROM faults")
        assert len(faults) == len(batches)
        twice = store_rows(
            pg_url,
            'SELECT job_id, "trigger", COUNT(*) FROM decisions '
            'GROUP BY job_id, "trigger" HAVING COUNT(*) > 1',
        )
        assert twice == []
        # Nothing was lost between the kill and B: every job's last reconcile accounted for
        # every fault (a job that had already decided to restart records later faults as
        # evidence without deciding again).
        keys = {f"fault:{f}" for (f,) in faults}
        desired = store_rows(pg_url, "SELECT job_id, desired FROM jobs ORDER BY job_id")
        assert len(desired) == JOBS
        missing = {
            job: sorted(keys - set((json.loads(d) if isinstance(d, str) else d)["evidence"]))
            for job, d in desired
        }
        assert missing == {f"job{j}": [] for j in range(JOBS)}
        decided = {j for (j,) in store_rows(pg_url, "SELECT DISTINCT job_id FROM decisions")}
        assert decided == {f"job{j}" for j in range(JOBS)}
        # B carries on deciding and delivering by itself.
        assert b.ready()
    finally:
        stop_all([a, b])
