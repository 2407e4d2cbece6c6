"""Two service replicas on one PostgreSQL never decide twice for one fault."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from scheduler_svc.config import Settings
from scheduler_svc.local import local_service
from tests.scheduler_svc.helpers import event, job_body, register_nodes


@pytest.mark.postgres
def test_two_replicas_same_faults_one_decision_each(pg_url: str) -> None:
    from tests.scheduler_svc.conftest import _truncate_pg

    _truncate_pg(pg_url)
    settings = Settings(db_url=pg_url, port=0)
    with local_service(settings) as a, local_service(settings) as b:
        with httpx.Client(base_url=a, timeout=30) as http:
            register_nodes(http, ["n0", "n1", "n2", "n3"])
            for j, nodes in (("j1", ["n0", "n1"]), ("j2", ["n2", "n3"])):
                assert http.post("/v1/jobs", json=job_body(j, nodes)).status_code == 201
        # 40 distinct faults (a port each), each sent by two agents' retries to both replicas.
        faults = [
            event(n, device=f"mlx5_{d}", after_s=2000, event_id=str(uuid.uuid4()))
            for n in ("n0", "n1", "n2", "n3")
            for d in range(8)
        ]
        start = threading.Barrier(4)

        def send(url: str, order: int) -> list[int]:
            start.wait()
            codes = []
            with httpx.Client(base_url=url, timeout=60) as c:
                batch = faults if order % 2 == 0 else list(reversed(faults))
                for e in batch:
                    codes.append(c.post("/v1/events", json={"events": [e]}).status_code)
            return codes

        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(send, [a, b, a, b], range(4)))
        assert all(code == 202 for codes in results for code in codes)
        with httpx.Client(base_url=b, timeout=30) as http:
            for job in ("j1", "j2"):
                decisions = http.get(f"/v1/jobs/{job}/decisions", params={"limit": 1000}).json()[
                    "decisions"
                ]
                triggers = [d["trigger"] for d in decisions]
                assert len(triggers) == len(set(triggers)) == 16  # one per fault on its nodes
                assert sorted(d["inputs"]["gpus"] for d in decisions) == [16] * 16
