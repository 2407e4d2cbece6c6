"""Subscriptions, deliveries and the audit log through the API, with real tokens."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx

from railover_testing.cluster_shapes import hgx_node
from railover_testing.local import local_service
from scheduler_svc.store.db import make_engine, make_sessionmaker, upgrade
from scheduler_svc.store.tokens import TokenRepo
from tests.fleet.helpers import fast


def _tokens(db: str) -> dict[str, tuple[str, str]]:
    """role -> (token id, plain token)."""
    upgrade(db)
    engine = make_engine(db)
    out = {}
    with make_sessionmaker(engine)() as s:
        repo = TokenRepo(s)
        now = datetime.now(UTC)
        for role, node in (("fleet", None), ("viewer", None), ("agent", "n0")):
            row, plain = repo.create(role=role, node=node, description="", now=now)
            out[role] = (row.token_id, plain)
        s.commit()
    engine.dispose()
    return out


def _client(url: str, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30)


def test_fleet_api_roles_secrets_and_audit(db_url: str) -> None:
    db = db_url
    tokens = _tokens(db)
    # A receiver nobody listens on: deliveries stay pending (long backoff).
    settings = fast(db, webhook_backoff_base_s=60)
    with (
        local_service(settings) as url,
        _client(url, tokens["fleet"][1]) as fleet,
        _client(url, tokens["viewer"][1]) as viewer,
        _client(url, tokens["agent"][1]) as agent,
        _client(url, None) as anon,
    ):
        body = {"url": "http://127.0.0.1:9/hook", "event_types": ["io.railover.decision.created"]}
        for c, code in ((anon, 401), (viewer, 403), (agent, 403)):
            assert c.post("/v1/subscriptions", json=body).status_code == code
            assert c.get("/v1/subscriptions").status_code == code
            assert c.get("/v1/deliveries").status_code == code
            assert c.get("/v1/audit").status_code == code
        bad = fleet.post("/v1/subscriptions", json={**body, "event_types": ["io.other"]})
        assert bad.status_code == 422
        created = fleet.post("/v1/subscriptions", json=body)
        assert created.status_code == 201 and len(created.json()["secret"]) >= 32
        sub_id = created.json()["subscription_id"]
        listed = fleet.get("/v1/subscriptions").json()["subscriptions"]
        assert [s["subscription_id"] for s in listed] == [sub_id]
        assert "secret" not in listed[0]
        assert "secret" not in fleet.get(f"/v1/subscriptions/{sub_id}").json()
        assert created.json()["created_by"] == tokens["fleet"][0]

        assert agent.put("/v1/nodes/n0", json=hgx_node()).status_code == 200
        assert agent.put("/v1/nodes/n1", json=hgx_node()).status_code == 403
        assert fleet.delete(f"/v1/subscriptions/{sub_id}").status_code == 204
        assert fleet.get(f"/v1/subscriptions/{sub_id}").status_code == 404
        assert fleet.post("/v1/deliveries/999/replay").status_code == 404

        entries = fleet.get("/v1/audit", params={"limit": 50}).json()["entries"]
    seen = [(e["method"], e["path"], e["status"], e["role"], e["token_id"]) for e in entries]
    fleet_id, agent_id, viewer_id = tokens["fleet"][0], tokens["agent"][0], tokens["viewer"][0]
    # Newest first; reads are not audited, refused writes are.
    assert seen[:4] == [
        ("POST", "/v1/deliveries/999/replay", 404, "fleet", fleet_id),
        ("DELETE", f"/v1/subscriptions/{sub_id}", 204, "fleet", fleet_id),
        ("PUT", "/v1/nodes/n1", 403, "agent", agent_id),
        ("PUT", "/v1/nodes/n0", 200, "agent", agent_id),
    ]
    assert ("POST", "/v1/subscriptions", 201, "fleet", fleet_id) in seen
    assert ("POST", "/v1/subscriptions", 403, "viewer", viewer_id) in seen
    # Refused before authentication: counted per peer, status and minute, written as one
    # entry when the minute is over or the service stops (issue 30), so read after a stop.
    assert all(e["status"] != 401 for e in entries)
    with local_service(settings) as url, _client(url, tokens["fleet"][1]) as fleet:
        later = fleet.get("/v1/audit", params={"limit": 50}).json()["entries"]
    refused = [e for e in later if e["status"] == 401]
    assert [(e["method"], e["path"], e["role"], e["token_id"], e["count"]) for e in refused] == [
        ("*", "*", None, None, 1)
    ]
    assert all(e["method"] != "GET" for e in entries)
    assert entries[0]["operation"] == "replay_delivery"
