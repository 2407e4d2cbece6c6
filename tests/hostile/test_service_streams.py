"""Command streams and agent tokens under attack, against a real service on loopback.

Before issue 30: one agent token held 2,000 streams of its node (each woke and read the
store at every command: the node's decisions took 3 s instead of 0.15 s); a revoked or
expired token's stream kept taking the node's commands for up to 30 minutes; an agent
token read every job, decision and command of the fleet. Here 200 streams (the benchmark
opens 2,000).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from railover_testing.local import local_service
from scheduler_svc.config import Settings
from scheduler_svc.store.db import make_engine, make_sessionmaker, upgrade
from scheduler_svc.store.tokens import TokenRepo
from tests.scheduler_svc.helpers import job_body, register_nodes

STREAMS = 200
PER_NODE = 4


@dataclass
class Service:
    url: str
    db_url: str
    fleet: str
    agent: str


def make_token(db_url: str, role: str, node: str | None, **kw: datetime) -> tuple[str, str]:
    engine = make_engine(db_url)
    try:
        with make_sessionmaker(engine)() as s:
            row, plain = TokenRepo(s).create(
                role=role, node=node, description="", now=datetime.now(UTC), **kw
            )
            s.commit()
            return row.token_id, plain
    finally:
        engine.dispose()


def revoke(db_url: str, token_id: str) -> None:
    engine = make_engine(db_url)
    try:
        with make_sessionmaker(engine)() as s:
            TokenRepo(s).revoke(token_id, datetime.now(UTC))
            s.commit()
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    db = tmp_path_factory.mktemp("hostile-streams") / "railover.db"
    db_url = f"sqlite:///{db}"
    upgrade(db_url)
    _, fleet = make_token(db_url, "fleet", None)
    _, agent = make_token(db_url, "agent", "n0")
    settings = Settings(db_url=db_url, port=0, auth_cache_s=0, commands_streams_per_node=PER_NODE)
    with local_service(settings) as url:
        with httpx.Client(base_url=url, headers=auth(fleet), timeout=30) as http:
            register_nodes(http, ["n0", "n1"])
            assert http.post("/v1/jobs", json=job_body("j", ["n0", "n1"])).status_code == 201
        yield Service(url, db_url, fleet, agent)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def open_stream(url: str, token: str, node: str = "n0") -> socket.socket:
    """A raw stream request (one socket each: 200 of them would exhaust a client pool)."""
    port = int(url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(30)
    sock.sendall(
        f"GET /v1/nodes/{node}/commands/stream?heartbeat_s=1 HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {token}\r\n\r\n".encode()
    )
    return sock


def read_until(sock: socket.socket, needle: bytes) -> bytes:
    got = b""
    while needle not in got:
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def test_streams_of_one_node_are_capped_the_newest_replacing_the_oldest(
    service: Service,
) -> None:
    with ExitStack() as stack:
        socks = []
        for _ in range(STREAMS):
            sock = stack.enter_context(open_stream(service.url, service.agent))
            assert b"event: ready" in read_until(sock, b"event: ready")
            socks.append(sock)
        ended = [read_until(sock, b"event: end") for sock in socks[:-PER_NODE]]
        assert all(b'"reason":"replaced"' in got for got in ended), ended[0][-200:]
        # The newest are still open, and normal requests are served beside them.
        with httpx.Client(base_url=service.url, headers=auth(service.fleet), timeout=30) as h:
            assert [h.get("/v1/jobs").status_code for _ in range(10)] == [200] * 10
            metrics = h.get("/metrics").text
        assert f"railover_command_streams {float(PER_NODE)}" in metrics


@pytest.mark.parametrize("how", ["revoked", "expired"])
def test_a_token_revoked_or_expired_ends_its_stream_unauthorized(
    service: Service, how: str
) -> None:
    if how == "revoked":
        token_id, token = make_token(service.db_url, "agent", "n0")
    else:
        soon = datetime.now(UTC) + timedelta(seconds=2)
        token_id, token = make_token(service.db_url, "agent", "n0", expires_at=soon)
    with open_stream(service.url, token) as sock:
        assert b"event: ready" in read_until(sock, b"event: ready")
        if how == "revoked":
            revoke(service.db_url, token_id)
        got = read_until(sock, b"event: end")
    assert b'"reason":"unauthorized"' in got, got[-300:]
    # And it cannot open another.
    r = httpx.get(f"{service.url}/v1/nodes/n0/commands", headers=auth(token), timeout=30)
    assert r.status_code == 401


def test_an_agent_token_reads_only_what_concerns_its_node(service: Service) -> None:
    with httpx.Client(base_url=service.url, headers=auth(service.agent), timeout=30) as agent:
        for path in (
            "/v1/jobs",
            "/v1/jobs/j",
            "/v1/jobs/j/decisions",
            "/v1/jobs/j/commands",
            "/v1/jobs/j/paths",
            "/v1/nodes",
            "/v1/nodes/n1",
            "/v1/status",
            "/v1/fabric",
            "/v1/maintenance",
        ):
            r = agent.get(path)
            assert r.status_code == 403, (path, r.status_code, r.text)
        assert agent.get("/v1/nodes/n0").status_code == 200
        assert agent.get("/v1/nodes/n0/commands", params={"wait_s": 0}).status_code == 200


def test_a_token_in_the_query_string_is_not_a_token(service: Service) -> None:
    r = httpx.get(
        f"{service.url}/v1/nodes/n0/commands/stream", params={"token": service.agent}, timeout=30
    )
    assert r.status_code == 401
