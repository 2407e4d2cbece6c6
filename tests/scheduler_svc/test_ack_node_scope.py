"""An agent acknowledges only its own node's commands: another node's is refused, 403."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest

from railover_testing.cluster_shapes import hgx_node
from railover_testing.local import local_service
from scheduler_svc.config import Settings
from scheduler_svc.store.db import make_engine, make_sessionmaker
from scheduler_svc.store.tokens import TokenRepo
from tests.scheduler_svc.helpers import event, job_body


@pytest.fixture
def tokens(settings: Settings) -> dict[str, str]:
    engine = make_engine(settings.sqlalchemy_url)
    now = datetime.now(UTC)
    with make_sessionmaker(engine)() as s:
        repo = TokenRepo(s)
        out = {
            "fleet": repo.create(role="fleet", node=None, description="", now=now)[1],
            "n0": repo.create(role="agent", node="n0", description="", now=now)[1],
            "n1": repo.create(role="agent", node="n1", description="", now=now)[1],
        }
        s.commit()
    engine.dispose()
    return out


@pytest.fixture
def clients(settings: Settings, tokens: dict[str, str]) -> Iterator[dict[str, httpx.Client]]:
    with local_service(settings) as url:
        made = {
            who: httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30
            )
            for who, token in tokens.items()
        }
        yield made
        for c in made.values():
            c.close()


def test_ack_for_another_nodes_command_is_refused(clients: dict[str, httpx.Client]) -> None:
    fleet, n0, n1 = clients["fleet"], clients["n0"], clients["n1"]
    for node in ("n0", "n1"):
        assert fleet.put(f"/v1/nodes/{node}", json=hgx_node()).status_code == 200
    assert fleet.post("/v1/jobs", json=job_body("j1", ["n0", "n1"])).status_code == 201
    fault = event("n1", device="mlx5_6", after_s=3000)
    assert n1.post("/v1/events", json={"events": [fault]}).status_code == 202
    (cmd,) = n1.get("/v1/nodes/n1/commands").json()["commands"]
    assert (cmd["node"], cmd["kind"], cmd["state"]) == ("n1", "failover", "delivered")

    # n0's agent speaking for n1: the token does not allow it.
    r = n0.post(
        f"/v1/commands/{cmd['command_id']}/acks",
        json={"node": "n1", "rank": 14, "status": "applied"},
    )
    assert r.status_code == 403
    assert r.json()["detail"] == "agent token of node 'n0' cannot act for node 'n1'"
    # n0's agent naming itself, on n1's command: the command is not n0's.
    r = n0.post(f"/v1/commands/{cmd['command_id']}/acks", json={"node": "n0", "status": "applied"})
    assert r.status_code == 403
    assert r.json()["detail"] == (
        f"command {cmd['command_id']} is addressed to another node, not 'n0'"
    )
    # Neither attempt changed the command.
    (stored,) = fleet.get("/v1/jobs/j1/commands").json()["commands"]
    assert (stored["command_id"], stored["state"]) == (cmd["command_id"], "delivered")

    r = n1.post(
        f"/v1/commands/{cmd['command_id']}/acks",
        json={"node": "n1", "rank": 14, "status": "applied"},
    )
    assert r.status_code == 200
    assert r.json()["state"] == "applied"
    # A fleet token may acknowledge for any node (operators clearing a stuck command).
    r = fleet.post(
        f"/v1/commands/{cmd['command_id']}/acks",
        json={"node": "n1", "rank": 14, "status": "applied"},
    )
    assert r.status_code == 200
