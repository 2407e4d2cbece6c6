"""Two service replicas on one PostgreSQL never decide twice for one fault."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from railover_testing.local import local_service
from scheduler_svc.config import Settings
from tests.scheduler_svc.helpers import event, job_body, register_nodes


@pytest.mark.postgres
def test_two_replicas_same_faults_one_decision_each(pg_url: str) -> None:
    from tests.conftest import truncate_pg

    truncate_pg(pg_url)
    settings = Settings(db_url=pg_url, port=0, allow_anonymous_loopback=True)
    with local_service(settings) as a, local_service(settings) as b:
        with httpx.Client(base_url=a, timeout=30) as http:
            register_nodes(http, ["n0", "n1", "n2", "n3"])
            for j, nodes in (("j1", ["n0", "n1"]), ("j2", ["n2", "n3"])):
                assert http.post("/v1/jobs", json=job_body(j, nodes)).status_code == 201
        # 32 distinct faults (a port each), 10 s apart so none correlate into a switch
        # failure, each sent by two agents' retries to both replicas.
        faults = [
            event(
                n, device=f"mlx5_{d}", after_s=2000 + 10 * (i * 8 + d), event_id=str(uuid.uuid4())
            )
            for i, n in enumerate(("n0", "n1", "n2", "n3"))
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
                # One decision per change of outcome, never two for one: the faults move
                # ranks until some GPU loses both RNICs; then the job restarts, and a
                # restarting job is decided no more.
                assert len(triggers) == len(set(triggers)) >= 2
                actions = [d["action"] for d in decisions]
                assert actions[0] == "restart" and actions.count("restart") == 1
                assert set(actions[1:]) == {"failover"}
                assert {d["inputs"]["gpus"] for d in decisions} == {16}


@pytest.mark.postgres
def test_two_replicas_200_faults_exactly_one_decision_and_event_each(pg_url: str) -> None:
    """The same 200 faults, sent by four agents' retries to two replicas at once.

    Why it holds: ingest takes each touched job's row lock (SELECT ... FOR
    UPDATE, in job-id order so two batches never deadlock) before deciding, so
    the second replica to reach a (job, fault) waits, then sees the first
    one's decision and stops; UNIQUE (job_id, trigger) backs that up. A row lock
    rather than an advisory lock because it ends with the transaction on every
    path (no lock left on a pooled connection), and the job row is updated by
    the decision anyway. The decision's outbox event is written in the same
    transaction, so events follow decisions one to one.
    """
    from sqlalchemy import func, select

    from railover_testing.cluster_shapes import hgx_node
    from scheduler_svc.fleet import EventType
    from scheduler_svc.store.db import make_engine
    from scheduler_svc.store.models import OutboxEvent
    from tests.conftest import truncate_pg

    truncate_pg(pg_url)
    nodes = [f"h{i:02d}" for i in range(25)]
    jobs = {f"job{j}": nodes[j * 5 : j * 5 + 5] for j in range(5)}
    settings = Settings(db_url=pg_url, port=0, allow_anonymous_loopback=True)
    with local_service(settings) as a, local_service(settings) as b:
        with httpx.Client(base_url=a, timeout=60) as http:
            for n in nodes:
                # One switch per node and rail: no two faults look like one switch failing.
                body = hgx_node(switch_name=f"{n}-rail{{rail}}")
                assert http.put(f"/v1/nodes/{n}", json=body).status_code == 200
            for j, members in jobs.items():
                assert http.post("/v1/jobs", json=job_body(j, members)).status_code == 201
        faults = [
            event(n, device=f"mlx5_{d}", after_s=2000, event_id=str(uuid.uuid4()))
            for n in nodes
            for d in range(8)
        ]
        assert len(faults) == 200
        start = threading.Barrier(4)

        # An agent's retry resends the same batch, so every sender uses the same
        # batches of 10, in opposite orders.
        batches = [faults[i : i + 10] for i in range(0, len(faults), 10)]

        def send(url: str, order: int) -> list[int]:
            start.wait()
            ordered = batches if order % 2 == 0 else list(reversed(batches))
            with httpx.Client(base_url=url, timeout=120) as c:
                return [c.post("/v1/events", json={"events": b}).status_code for b in ordered]

        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(send, [a, b, a, b], range(4)))
        assert all(code == 202 for codes in results for code in codes)
        decided: list[str] = []
        with httpx.Client(base_url=b, timeout=30) as http:
            for job in jobs:
                decisions = http.get(f"/v1/jobs/{job}/decisions", params={"limit": 1000}).json()[
                    "decisions"
                ]
                triggers = [d["trigger"] for d in decisions]
                # Every RNIC of the job's nodes fails: the first batch to leave a GPU with
                # no path restarts the job, and nothing after that decides again.
                assert len(triggers) == len(set(triggers)) >= 1
                actions = [d["action"] for d in decisions]
                assert actions[0] == "restart" and actions.count("restart") == 1
                decided += [d["decision_id"] for d in decisions]
    engine = make_engine(pg_url)
    with engine.connect() as conn:
        rows = conn.execute(
            select(OutboxEvent.subject, func.count())
            .where(OutboxEvent.type == EventType.DECISION_CREATED)
            .group_by(OutboxEvent.subject)
        ).all()
    engine.dispose()
    assert sorted(s for s, _ in rows) == sorted(f"decision/{d}" for d in decided)
    assert {n for _, n in rows} == {1}
