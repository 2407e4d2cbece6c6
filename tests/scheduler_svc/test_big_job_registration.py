"""A large job registers with exactly the ranks posted, and a re-post replaces them; the
plans its first reconcile reads were made as its nodes registered.

The ranks skip the ORM on the way in (COPY on PostgreSQL, the driver's executemany on
SQLite) and the placement is read as plain rows: what a GET, the store and the
reconciler's cached placement read back must still be exactly the post, and a new
incarnation's post must leave nothing of the old placement behind (the GPUs it no
longer uses are free for another job).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import event, func, select

from railover_testing.cluster_shapes import hgx_node
from scheduler_svc.api.schemas.nodes import NodeIn
from scheduler_svc.config import Settings
from scheduler_svc.engine.paths import plan_node
from scheduler_svc.services import fabric, reconciler, registry
from scheduler_svc.store import models as m
from scheduler_svc.store.db import make_engine, make_sessionmaker
from scheduler_svc.store.jobs import JobRepo
from scheduler_svc.store.nodes import NodeRepo
from tests.scheduler_svc.helpers import job_body

NODES = [f"n{i:04d}" for i in range(1024)]


def register_fleet(settings: Settings) -> None:
    """The 1,024 nodes in one transaction, through the service's own registration."""
    node = NodeIn.model_validate(hgx_node())
    db = make_engine(settings.db_url)
    try:
        with make_sessionmaker(db)() as s, s.begin():
            for name in NODES:
                registry.register_node(s, name, node, datetime.now(UTC), settings)
    finally:
        db.dispose()


def stored(settings: Settings, job_id: str) -> tuple[list[tuple[int, str, int]], Any]:
    """The job's rows in the store, and the placement its reconcile pass is given."""
    db = make_engine(settings.db_url)
    try:
        with make_sessionmaker(db)() as s:
            job = JobRepo(s).get(job_id)
            assert job is not None
            state, _, _ = reconciler.current(s, job, datetime.now(UTC), settings)
            return JobRepo(s).rank_tuples(job_id), state.ranks
    finally:
        db.dispose()


def placed(body: dict[str, Any]) -> list[tuple[int, str, int]]:
    return sorted((r["rank"], r["node"], r["gpu"]) for r in body["ranks"])


def read_back(r: httpx.Response) -> list[tuple[int, str, int]]:
    ranks = [(x["rank"], x["node"], x["gpu"]) for x in r.json()["ranks"]]
    assert ranks == sorted(ranks)  # in rank order
    return ranks


def test_a_large_job_is_stored_as_posted_and_a_repost_replaces_it(
    http: httpx.Client, settings: Settings
) -> None:
    register_fleet(settings)
    first = job_body("big", NODES)
    random.Random(7).shuffle(first["ranks"])  # stored by rank, whatever the post's order
    r = http.post("/v1/jobs", json=first)
    assert r.status_code == 201, r.text[:500]
    assert read_back(r) == placed(first) and len(placed(first)) == 8192
    assert read_back(http.get("/v1/jobs/big")) == placed(first)
    rows, given = stored(settings, "big")
    assert rows == placed(first) and list(given) == rows

    # The fleet manager restarts it on the first half of the nodes, each GPU's rank moved.
    half = NODES[:512]
    again = job_body("big", half, incarnation=2)
    for x in again["ranks"]:
        x["gpu"] = 7 - x["gpu"]
    r = http.post("/v1/jobs", json=again)
    assert r.status_code == 201, r.text[:500]
    assert r.json()["incarnation"] == 2
    assert read_back(r) == placed(again)
    assert read_back(http.get("/v1/jobs/big")) == placed(again)
    rows, given = stored(settings, "big")
    assert rows == placed(again) and list(given) == rows

    # Nothing of the first placement holds the other half's GPUs any more.
    other = job_body("other", NODES[512:])
    assert http.post("/v1/jobs", json=other).status_code == 201
    taken = http.post("/v1/jobs", json=job_body("late", half[:1]))
    assert taken.status_code == 409 and "held by running job 'big'" in taken.text


def test_registration_plans_each_node_for_the_first_job(
    http: httpx.Client, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plans a node's registration makes are the ones the first placement read finds:
    no topology row is read then, and each is the plan of the node as stored."""
    names = ["p0", "p1", "p2"]
    for name in names:
        assert http.put(f"/v1/nodes/{name}", json=hgx_node()).status_code == 200
    db = make_engine(settings.db_url)
    try:
        with make_sessionmaker(db)() as s:
            stored_nodes = NodeRepo(s).get_many(names)
            expected = {n: fabric.node_topology(stored_nodes[n]) for n in names}

            def unread(*_: object) -> None:
                raise AssertionError("the placement read went to the topology rows")

            monkeypatch.setattr(NodeRepo, "topology_rows", unread)
            cap = settings.backup_cap_per_switch
            topologies, plans = fabric.PLANS.get(s, set(names), cap, {})
    finally:
        db.dispose()
    assert topologies == expected
    assert plans == {n: plan_node(t, cap) for n, t in expected.items()}


def test_deleting_a_job_leaves_its_ranks_to_the_cascade(
    http: httpx.Client, settings: Settings
) -> None:
    """DELETE /v1/jobs is one statement on the job, whatever its size: the ranks go by the
    foreign key's ON DELETE CASCADE, not loaded into the ORM to be deleted one by one
    (3.4 s for a 65,536-rank job on SQLite, holding the one writer)."""
    names = NODES[:16]
    for name in NODES[:18]:
        assert http.put(f"/v1/nodes/{name}", json=hgx_node()).status_code == 200
    assert http.post("/v1/jobs", json=job_body("big", names)).status_code == 201
    assert http.post("/v1/jobs", json=job_body("kept", NODES[16:18])).status_code == 201
    db = make_engine(settings.db_url)
    sent: list[str] = []
    event.listen(db, "before_cursor_execute", lambda *a: sent.append(a[2]))
    try:
        with make_sessionmaker(db)() as s:
            with s.begin():
                registry.delete_job(s, "big")
            deleting = list(sent)
            ranks = s.execute(
                select(m.JobRank.job_id, func.count()).group_by(m.JobRank.job_id)
            ).all()
    finally:
        db.dispose()
    assert deleting and [q for q in deleting if "job_ranks" in q] == []
    assert [tuple(r) for r in ranks] == [("kept", 16)]
    assert http.get("/v1/jobs/big").status_code == 404
