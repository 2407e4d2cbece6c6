"""Hostile input to a real service on loopback: times no UTC calendar holds, a checkpoint
dated in the future, and a service started with no token and no explicit opening.

Before issue 30: `0001-01-01T00:00:00+14:00` gave 500 on events, checkpoints and
maintenance (an agent retries a 500); a checkpoint dated 9999 was stored, so every real
checkpoint after it looked older; a service started by `uvicorn --factory` with no token
answered every loopback peer as the fleet role.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from railover_testing.cluster_shapes import hgx_node
from railover_testing.local import local_service
from scheduler_svc.config import Settings
from tests.scheduler_svc.helpers import job_body, register_nodes

OVERFLOWING = ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00")
UNKEPT = ("9999-01-01T00:00:00Z", "1900-01-01T00:00:00Z")


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    db = tmp_path_factory.mktemp("hostile-input") / "railover.db"
    settings = Settings(db_url=f"sqlite:///{db}", port=0, allow_anonymous_loopback=True)
    with local_service(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        register_nodes(client, ["n0"])
        now = datetime.now(UTC)
        body = job_body("j", ["n0"], last_checkpoint_at=now.isoformat())
        assert client.post("/v1/jobs", json=body).status_code == 201
        yield client


def event_at(at: str) -> dict[str, object]:
    return {
        "events": [
            {
                "event_id": str(uuid.uuid4()),
                "node": "n0",
                "kind": "port_down",
                "device": "mlx5_0",
                "port": 1,
                "observed_at": at,
            }
        ]
    }


def maintenance_at(at: str) -> dict[str, object]:
    return {"target": {"switch": "rail0-a"}, "start_at": at, "duration_s": 60, "reason": "x"}


@pytest.mark.parametrize("at", OVERFLOWING + UNKEPT)
def test_times_no_utc_calendar_holds_are_422_naming_the_field(http: httpx.Client, at: str) -> None:
    for path, body, field in (
        ("/v1/events", event_at(at), "observed_at"),
        ("/v1/jobs/j/checkpoints", {"at": at}, "at"),
        ("/v1/maintenance", maintenance_at(at), "start_at"),
        ("/v1/jobs/j/mirror-failures", {"iteration": 1, "at": at}, "at"),
    ):
        r = http.post(path, json=body)
        assert r.status_code == 422, (path, r.status_code, r.text)
        assert field in r.text and ("representable" in r.text or "outside" in r.text), r.text


def test_a_checkpoint_ahead_of_the_skew_bound_is_refused_and_changes_nothing(
    http: httpx.Client,
) -> None:
    before = http.get("/v1/jobs/j").json()["last_checkpoint_at"]
    ahead = datetime.now(UTC) + timedelta(hours=1)
    r = http.post("/v1/jobs/j/checkpoints", json={"at": ahead.isoformat(), "iteration": 9})
    assert r.status_code == 422, r.text
    assert "ahead of the service's clock" in r.text and "at" in r.json()["detail"]
    assert http.get("/v1/jobs/j").json()["last_checkpoint_at"] == before
    # A real checkpoint after it still counts.
    now = datetime.now(UTC)
    r = http.post("/v1/jobs/j/checkpoints", json={"at": now.isoformat(), "iteration": 10})
    assert r.status_code == 201 and r.json()["current"] is True, r.text


def test_a_job_registered_with_a_future_checkpoint_is_refused(http: httpx.Client) -> None:
    ahead = datetime.now(UTC) + timedelta(days=1)
    r = http.post("/v1/jobs", json=job_body("k", ["n0"], last_checkpoint_at=ahead.isoformat()))
    assert r.status_code == 422 and "last_checkpoint_at" in r.text, r.text


def test_no_token_and_no_explicit_opening_answers_loopback_with_401(tmp_path: Path) -> None:
    """The settings' default, as `uvicorn --factory` would start it: closed."""
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'r.db'}", port=0)
    assert settings.allow_anonymous_loopback is False
    with local_service(settings) as url:
        r = httpx.get(f"{url}/v1/jobs", timeout=30)
        assert r.status_code == 401, r.text
        ready = httpx.get(f"{url}/readyz", timeout=30).json()
        assert ready["detail"]["auth"] == "tokens"


def test_two_devices_with_one_pci_address_are_refused_naming_the_second(
    http: httpx.Client,
) -> None:
    def node(**change: Any) -> dict[str, Any]:
        body = hgx_node()
        for path, value in change.items():
            kind, index, field = path.split("__")
            body[kind][int(index)][field] = value
        return body

    gpu0, rnic0 = hgx_node()["gpus"][0]["pci"], hgx_node()["rnics"][0]["pci"]
    for body, field in (
        (node(gpus__1__pci=gpu0), "gpus.1.pci"),
        (node(rnics__0__pci=gpu0), "rnics.0.pci"),
        (node(rnics__1__pci=rnic0), "rnics.1.pci"),
    ):
        r = http.put("/v1/nodes/dup", json=body)
        assert r.status_code == 422 and field in r.text and "PCI address" in r.text, r.text
    assert http.get("/v1/nodes/dup").status_code == 404
    # One RNIC's two ports share its function; an SF shares its parent's.
    two_ports = hgx_node()
    two_ports["rnics"].append(two_ports["rnics"][0] | {"port": 2})
    two_ports["rnics"].append(two_ports["rnics"][0] | {"name": "mlx5_sf0", "kind": "sf"})
    assert http.put("/v1/nodes/dup", json=two_ports).status_code == 200


def test_merged_nics_naming_an_rnic_no_node_has_are_refused(http: httpx.Client) -> None:
    register_nodes(http, ["n2"])
    ccl = {"kind": "nccl", "version": "2.30.1", "merged_nics": [["mlx5_0", "mlx5_99"]]}
    body = job_body("m", ["n2"], ccl=ccl, last_checkpoint_at=datetime.now(UTC).isoformat())
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    assert "ccl.merged_nics.0" in r.text and "mlx5_99" in r.text and "n2" in r.text
    ccl["merged_nics"] = [["mlx5_0", "mlx5_1"]]
    assert http.post("/v1/jobs", json=body | {"ccl": ccl}).status_code == 201
