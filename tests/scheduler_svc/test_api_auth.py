"""Tokens: roles, node scoping, and no anonymous access once tokens exist."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from railover_testing.cluster_shapes import hgx_node
from railover_testing.local import free_port, local_service
from railover_testing.waiting import wait_until
from scheduler_svc.config import Settings
from scheduler_svc.main import create_app
from scheduler_svc.store.db import make_engine, make_sessionmaker
from scheduler_svc.store.tokens import TokenRepo
from tests.deploy.tools import tool_missing
from tests.scheduler_svc.helpers import event, job_body, register_nodes


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
    # A rebuild failure is a checkpoint node's word: fleet role only.
    failure = {"iteration": 7, "at": "2026-11-01T12:00:00Z"}
    for role in ("agent0", "viewer"):
        with client(secured, tokens[role]) as other:
            r = other.post("/v1/jobs/j1/mirror-failures", json=failure)
            assert r.status_code == 403, (role, r.text)
    with client(secured, tokens["fleet"]) as fleet:
        assert fleet.post("/v1/jobs/j1/mirror-failures", json=failure).status_code == 201


def _now_event(node: str, kind: str, **extra: Any) -> dict[str, Any]:
    at = datetime.now(UTC) - timedelta(seconds=1)
    return event(node, kind, **extra) | {"observed_at": at.isoformat()}


def test_agent_token_writes_only_for_its_node(secured: str, tokens: dict[str, str]) -> None:
    with client(secured, tokens["fleet"]) as fleet:
        register_nodes(fleet, ["n0", "n1"])
        body = job_body("j", ["n0", "n1"], communicators=[{"comm_id": 77, "channels": 16}])
        body["last_checkpoint_at"] = (datetime.now(UTC) - timedelta(minutes=50)).isoformat()
        assert fleet.post("/v1/jobs", json=body).status_code == 201
        progress = [
            _now_event(n, "progress", device=None, comm_id=77, rank=i * 8 + g, ops_done=500)
            for i, n in enumerate(["n0", "n1"])
            for g in range(8)
        ]
        assert fleet.post("/v1/events", json={"events": progress}).status_code == 202
        fault = _now_event("n1", "port_down", device="mlx5_3")
        assert fleet.post("/v1/events", json={"events": [fault]}).status_code == 202
        commands = fleet.get("/v1/jobs/j/commands").json()["commands"]
        before = fleet.get("/v1/jobs/j/commands").json()
    theirs = next(c for c in commands if c["node"] == "n1")
    with client(secured, tokens["agent0"]) as agent:
        # Progress of a rank placed on n1, reported as n0's: it would move n1's switch points.
        moved = _now_event("n0", "progress", device=None, comm_id=77, rank=9, ops_done=10**6)
        r = agent.post("/v1/events", json={"events": [moved]})
        assert r.status_code == 403, r.text
        assert r.json()["fields"][0]["field"] == "events.0.rank"
        # Its own ranks are fine.
        own = _now_event("n0", "progress", device=None, comm_id=77, rank=1, ops_done=600)
        assert agent.post("/v1/events", json={"events": [own]}).status_code == 202
        # A command addressed to n1, acknowledged as n0 or as n1: both refused.
        for node in ("n0", "n1"):
            ack = {"node": node, "status": "applied"}
            r = agent.post(f"/v1/commands/{theirs['command_id']}/acks", json=ack)
            assert r.status_code == 403, r.text
        # Iteration reports are the fleet manager's.
        r = agent.post("/v1/jobs/j/iterations", json={"iteration_time_s": [1.0] * 5})
        assert r.status_code == 403
    with client(secured, tokens["fleet"]) as fleet:
        assert fleet.get("/v1/jobs/j/commands").json() == before


def test_first_token_closes_anonymous_access_at_once(settings: Settings) -> None:
    """With no auth cache: at the next request. (Within RAILOVER_AUTH_CACHE_S otherwise:
    test_token_cache.py.)"""
    uncached = settings.model_copy(update={"auth_cache_s": 0.0})
    with local_service(uncached) as url, client(url, None) as anon:
        assert anon.get("/v1/jobs").status_code == 200
        assert anon.get("/readyz").json()["detail"]["auth"] == "open"
        engine = make_engine(settings.sqlalchemy_url)
        with make_sessionmaker(engine)() as s:
            TokenRepo(s).create(role="viewer", node=None, description="", now=datetime.now(UTC))
            s.commit()
        engine.dispose()
        r = anon.get("/v1/jobs")
        assert r.status_code == 401 and r.json()["error"] == "unauthorized"
        assert anon.get("/readyz").json()["detail"]["auth"] == "tokens"


def test_expired_token_is_refused(settings: Settings) -> None:
    engine = make_engine(settings.sqlalchemy_url)
    now = datetime.now(UTC)
    with make_sessionmaker(engine)() as s:
        repo = TokenRepo(s)
        _, old = repo.create(
            role="fleet", node=None, description="", now=now, expires_at=now - timedelta(seconds=1)
        )
        _, fresh = repo.create(
            role="fleet", node=None, description="", now=now, expires_at=now + timedelta(hours=1)
        )
        s.commit()
    engine.dispose()
    with local_service(settings) as url:
        with client(url, old) as c:
            r = c.get("/v1/jobs")
            assert r.status_code == 401 and "expired" in r.json()["detail"]
        with client(url, fresh) as c:
            assert c.get("/v1/jobs").status_code == 200
        # An expired token alone does not keep the API closed, but does not open it
        # either while a live one exists.
        with client(url, None) as anon:
            assert anon.get("/v1/jobs").status_code == 401


def _routable_address() -> str | None:
    """An address of this machine that is not loopback, to connect from outside lo."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent for a UDP connect
            host: str = s.getsockname()[0]
        except OSError:
            return None
    return None if host.startswith("127.") else host


def test_no_anonymous_access_from_a_routable_peer(settings: Settings) -> None:
    """`uvicorn --factory scheduler_svc.main:create_app --host 0.0.0.0`: settings say
    loopback (the default), the socket does not; a caller from outside gets 401."""
    host = _routable_address()
    if host is None:
        tool_missing("this machine has no routable IPv4 address to connect from")
    port = free_port()
    config = uvicorn.Config(
        create_app(settings), host="0.0.0.0", port=port, log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: server.started, timeout=30)
        with client(f"http://{host}:{port}", None) as outside:
            r = outside.get("/v1/jobs")
            assert r.status_code == 401, r.text
            assert outside.get("/readyz").json()["detail"]["auth"] == "tokens"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def test_settings_for_a_routable_bind_never_open_anonymous_access(settings: Settings) -> None:
    routable = settings.model_copy(update={"host": "0.0.0.0"})
    app = create_app(routable)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: server.started, timeout=30)
        with client(f"http://127.0.0.1:{port}", None) as anon:
            assert anon.get("/v1/jobs").status_code == 401
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def test_token_create_expires_in(settings: Settings) -> None:
    railover = Path(sys.executable).with_name("railover")
    db = ["--db", settings.db_url]
    made = subprocess.run(
        [str(railover), "token", "create", "--role", "fleet", "--expires-in", "2h", *db],
        capture_output=True,
        text=True,
        check=True,
    )
    plain = made.stdout.strip()
    bad = subprocess.run(
        [str(railover), "token", "create", "--role", "fleet", "--expires-in", "soon", *db],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "--expires-in" in bad.stderr
    engine = make_engine(settings.sqlalchemy_url)
    with make_sessionmaker(engine)() as s:
        now = datetime.now(UTC)
        row = TokenRepo(s).by_plain(plain, now)
        assert row is not None and row.expires_at is not None
        assert timedelta(hours=1.9) < row.expires_at - now <= timedelta(hours=2)
        assert TokenRepo(s).by_plain(plain, now + timedelta(hours=3)) is None
    engine.dispose()
