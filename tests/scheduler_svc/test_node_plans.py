"""Node reads serve the plan stored at registration (services/node_plans.py), not one
recomputed per read (issue 30: 1.9 s a GET /v1/nodes for one node of 1,024 GPUs and
1,024 RNICs). A real service on each store."""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy import update

from railover_testing.cluster_shapes import hgx_node
from railover_testing.local import local_service
from scheduler_svc.config import Settings
from scheduler_svc.store import models as m
from scheduler_svc.store.db import make_engine, make_sessionmaker


def stored(settings: Settings, name: str) -> dict[str, Any] | None:
    engine = make_engine(settings.sqlalchemy_url)
    try:
        with make_sessionmaker(engine)() as s:
            node = s.get(m.Node, name)
            return None if node is None else node.plan
    finally:
        engine.dispose()


def mark(settings: Settings, name: str, plan: dict[str, Any] | None) -> None:
    engine = make_engine(settings.sqlalchemy_url)
    try:
        with make_sessionmaker(engine)() as s, s.begin():
            s.execute(update(m.Node).where(m.Node.name == name).values(plan=plan))
    finally:
        engine.dispose()


def test_registration_stores_the_plan_and_reads_serve_it(settings: Settings) -> None:
    with local_service(settings) as url, httpx.Client(base_url=url, timeout=30) as http:
        registered = http.put("/v1/nodes/n0", json=hgx_node()).json()
        plan = stored(settings, "n0")
        assert plan is not None and plan["topology_version"] == 1
        assert plan["backup_cap"] is None
        assert plan["gpus"] == registered["backup_plan"]
        # What a read shows is what is stored: marked in the store, the mark is served.
        mark(settings, "n0", plan | {"warnings": ["served from the store"]})
        assert http.get("/v1/nodes/n0").json()["warnings"] == ["served from the store"]
        assert http.get("/v1/nodes").json()[0]["warnings"] == ["served from the store"]
        # Registered again unchanged: the stored plan stays. Changed: a new one is stored.
        http.put("/v1/nodes/n0", json=hgx_node()).raise_for_status()
        assert http.get("/v1/nodes/n0").json()["warnings"] == ["served from the store"]
        changed = hgx_node()
        changed["rnics"] = changed["rnics"][:4]
        again = http.put("/v1/nodes/n0", json=changed).json()
        assert again["topology_version"] == 2
        assert stored(settings, "n0")["topology_version"] == 2  # type: ignore[index]
        assert http.get("/v1/nodes/n0").json()["backup_plan"] == again["backup_plan"]


def test_a_node_without_a_stored_plan_or_of_another_cap_is_planned_at_read(
    settings: Settings,
) -> None:
    with local_service(settings) as url, httpx.Client(base_url=url, timeout=30) as http:
        fresh = http.put("/v1/nodes/n0", json=hgx_node()).json()
    mark(settings, "n0", None)  # registered before migration 0016
    capped = settings.model_copy(update={"backup_cap_per_switch": 1})
    with local_service(settings) as url, httpx.Client(base_url=url, timeout=30) as http:
        assert http.get("/v1/nodes/n0").json()["backup_plan"] == fresh["backup_plan"]
    assert stored(settings, "n0") is None  # reads do not write
    mark(settings, "n0", stored_plan := fresh_plan(fresh))
    with local_service(capped) as url, httpx.Client(base_url=url, timeout=30) as http:
        got = http.get("/v1/nodes/n0").json()
    assert stored_plan["backup_cap"] is None and got["warnings"] != ["stale"]


def fresh_plan(node: dict[str, Any]) -> dict[str, Any]:
    return {
        "topology_version": node["topology_version"],
        "backup_cap": None,
        "gpus": node["backup_plan"],
        "warnings": ["stale"],
    }
