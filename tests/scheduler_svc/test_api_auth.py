"""Tokens: roles, node scoping, and no anonymous access once tokens exist."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest

from railover_testing.cluster_shapes import hgx_node
from railover_testing.local import local_service
from scheduler_svc.config import Settings
from scheduler_svc.store.db import make_engine, make_sessionmaker
from scheduler_svc.store.repositories import TokenRepo
from tests.scheduler_svc.helpers import event, job_body


@pytest.fixture
def tokens(settings: Settings) -> dict[str, str]:
    engine = make_engine(settings.sqlalchemy_url)
    out = {}
    with make_sessionmaker(engine)() as s:
        repo = TokenRepo(s)
        now = datetime.now(UTC)
        out["fleet"] = repo.create(role="fleet", node=None, description="ops", now=now)[1]
        out["viewer"] = repo.create(role="viewer", node=None, description="", now=now)[1]
        out["agent0"] = repo.create(role="agent", node="n0", description="", now=now)[1]
        row, out["revoked"] = repo.create(role="fleet", node=None, description="", now=now)
        repo.revoke(row.token_id, now)
        s.commit()
    engine.dispose()
    return out


@pytest.fixture
def secured(settings: Settings, tokens: dict[str, str]) -> Iterator[str]:
    with local_service(settings) as url:
        yield url


def client(url: str, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30)


def test_roles(secured: str, tokens: dict[str, str]) -> None:
    with client(secured, None) as anon:
        r = anon.get("/v1/jobs")
        assert r.status_code == 401 and r.json()["error"] == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"
        assert anon.get("/healthz").status_code == 200
    with client(secured, tokens["revoked"]) as c:
        assert c.get("/v1/jobs").status_code == 401
    with client(secured, "rvr_nope_nope") as c:
        assert "unknown, revoked or expired" in c.get("/v1/jobs").json()["detail"]
    with client(secured, tokens["agent0"]) as agent:
        assert agent.put("/v1/nodes/n0", json=hgx_node()).status_code == 200
        r = agent.put("/v1/nodes/n1", json=hgx_node())
        assert r.status_code == 403 and "n0" in r.json()["detail"]
        assert agent.post("/v1/jobs", json=job_body("j1", ["n0"])).status_code == 403
        r = agent.post("/v1/events", json={"events": [event("n0"), event("n1")]})
        assert r.status_code == 403
        assert agent.post("/v1/events", json={"events": [event("n0")]}).status_code == 202
        assert agent.get("/v1/nodes/n1/commands").status_code == 403
    with client(secured, tokens["fleet"]) as fleet:
        assert fleet.put("/v1/nodes/n1", json=hgx_node()).status_code == 200
        assert fleet.post("/v1/jobs", json=job_body("j1", ["n0", "n1"])).status_code == 201
    with client(secured, tokens["viewer"]) as viewer:
        assert viewer.get("/v1/jobs/j1/decisions").status_code == 200
        assert viewer.get("/v1/jobs/j1/paths").status_code == 200
        assert viewer.delete("/v1/jobs/j1").status_code == 403
        assert viewer.post("/v1/events", json={"events": [event("n0")]}).status_code == 403
        assert viewer.get("/readyz").json()["detail"]["auth"] == "tokens"
