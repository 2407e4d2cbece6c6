"""Settings and scripted sequences shared by the fleet tests."""

from __future__ import annotations

from typing import Any

import httpx

from scheduler_svc.config import Settings
from tests.scheduler_svc.helpers import event, job_body, register_nodes

SECRET = "test-secret-0123456789abcdef"


def fast(db_url: str, **overrides: Any) -> Settings:
    """Retries and idle polls in tens of milliseconds, so the tests run in seconds."""
    values: dict[str, Any] = {
        "db_url": db_url,
        "port": 0,
        "webhook_backoff_base_s": 0.05,
        "webhook_backoff_max_s": 0.2,
        "delivery_poll_s": 0.05,
        "webhook_timeout_s": 5.0,
        "allow_anonymous_loopback": True,
        "webhook_allow_loopback": True,  # the tests' receivers listen on loopback
    }
    values.update(overrides)
    return Settings(**values)


def subscribe(http: httpx.Client, url: str, **body: Any) -> dict[str, Any]:
    r = http.post("/v1/subscriptions", json={"url": url, "secret": SECRET, **body})
    assert r.status_code == 201, r.text
    created: dict[str, Any] = r.json()
    return created


def two_jobs(http: httpx.Client) -> None:
    register_nodes(http, ["n0", "n1", "n2", "n3"])
    for j, nodes in (("j1", ["n0", "n1"]), ("j2", ["n2", "n3"])):
        assert http.post("/v1/jobs", json=job_body(j, nodes)).status_code == 201


def fault(http: httpx.Client, node: str, device: str, after_s: float) -> list[str]:
    r = http.post("/v1/events", json={"events": [event(node, device=device, after_s=after_s)]})
    assert r.status_code == 202, r.text
    decisions: list[str] = r.json()["decisions"]
    return decisions


def take_and_apply(http: httpx.Client, node: str) -> int:
    """What an agent does: fetch the node's commands, then report each applied."""
    cmds = http.get(f"/v1/nodes/{node}/commands").json()["commands"]
    for c in cmds:
        r = http.post(
            f"/v1/commands/{c['command_id']}/acks", json={"node": node, "status": "applied"}
        )
        assert r.status_code == 200, r.text
    return len(cmds)
