"""The reconciler's cached placement and job index answer what reading it all anew answers.

Through the real service: a job is registered, a fault is posted, one of its nodes
registers again cabled to other switches, and the job is deleted and posted again
on other nodes. After each step the service's reconcile (cached ranks, plans and
index) must equal the engine's whole-job reconcile on a fresh read of the store,
and the index must be the one built for the plans in force.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import httpx

from railover_testing.cluster_shapes import hgx_node
from scheduler_svc.config import Settings
from scheduler_svc.engine import reconcile as engine
from scheduler_svc.engine.state import Reconciled
from scheduler_svc.services import fabric, reconciler
from scheduler_svc.store.db import make_engine, make_sessionmaker
from scheduler_svc.store.jobs import JobRepo
from tests.scheduler_svc.helpers import event, job_body, register_nodes


def check(settings: Settings) -> Reconciled:
    """The service's answer for job j, after asserting it is the whole-job answer."""
    now = datetime.now(UTC)
    db = make_engine(settings.db_url)
    try:
        with make_sessionmaker(db)() as s:
            job = JobRepo(s).get("j")
            assert job is not None
            state, view, cached = reconciler.current(s, job, now, settings)
            ranks = tuple(JobRepo(s).rank_tuples("j"))
            assert state.ranks == ranks
            fresh, _ = fabric.view_for(s, {n for _, n, _ in ranks}, now, settings)
            whole = engine.reconcile(
                now, replace(state, ranks=ranks), fresh, reconciler.options(settings)
            )
    finally:
        db.dispose()
    assert cached.conn.index is not None  # the incremental path answered
    assert cached.conn.index.topologies is view.topologies
    assert dict(view.topologies) == dict(fresh.topologies)
    assert cached == whole
    return cached


def test_cached_index_follows_faults_registrations_and_placements(
    http: httpx.Client, settings: Settings
) -> None:
    register_nodes(http, ["a", "b", "c"])
    assert http.post("/v1/jobs", json=job_body("j", ["a", "b"])).status_code == 201
    first = check(settings)

    r = http.post("/v1/events", json={"events": [event("a", device="mlx5_0", after_s=2400)]})
    assert r.status_code == 202 and len(r.json()["decisions"]) == 1
    failed = check(settings)
    assert failed.conn.index is first.conn.index  # one fault: nothing rebuilt
    assert dict(failed.desired.moved) == {0: "mlx5_1/1"}

    # Node a comes back cabled to other switches: its plan changes, so does the index.
    body = hgx_node(switch_name="spare{rail}-leaf")
    assert http.put("/v1/nodes/a", json=body).status_code == 200
    moved = check(settings)
    assert moved.conn.index is not first.conn.index
    assert moved.conn.index is not None
    assert moved.conn.index.topologies["a"].rnics[0].switch == "spare0-leaf"

    # Deleted and posted again elsewhere: the ranks are read anew.
    assert http.delete("/v1/jobs/j").status_code == 204
    assert http.post("/v1/jobs", json=job_body("j", ["c", "b"])).status_code == 201
    again = check(settings)
    assert again.conn.index is not None
    assert {n for _, n, _ in again.conn.index.ranks} == {"b", "c"}


def test_a_job_posted_out_of_rank_order_is_cached_and_answered_in_rank_order(
    http: httpx.Client, settings: Settings
) -> None:
    # A new placement's ranks are cached and answered from the post itself, not read back:
    # both must be what a read of the store gives, whatever order the post listed them in.
    register_nodes(http, ["a", "b"])
    body = job_body("j", ["a", "b"])
    body["ranks"] = body["ranks"][::-1]
    posted = http.post("/v1/jobs", json=body)
    assert posted.status_code == 201, posted.text
    ranks = posted.json()["ranks"]
    assert [r["rank"] for r in ranks] == list(range(16))
    assert ranks == http.get("/v1/jobs/j").json()["ranks"]
    check(settings)  # the cached ranks are the stored ones, in rank order
