"""Every bad input of issue 13: a 4xx naming the field, in the one error body, nothing stored.

Each case snapshots what the API shows of the store (nodes, jobs, decisions,
commands, fabric state, audit log) before the bad request and compares after.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from railover_testing.cluster_shapes import hgx_node
from tests.scheduler_svc.helpers import event, job_body, register_nodes

HUGE = 2**70


def snapshot(http: httpx.Client) -> dict[str, Any]:
    jobs = http.get("/v1/jobs").json()
    return {
        "nodes": http.get("/v1/nodes").json(),
        "jobs": jobs,
        "decisions": {
            j["job_id"]: http.get(f"/v1/jobs/{j['job_id']}/decisions").json() for j in jobs
        },
        "commands": {
            j["job_id"]: http.get(f"/v1/jobs/{j['job_id']}/commands").json() for j in jobs
        },
        "fabric": http.get("/v1/fabric").json(),
    }


def refused(r: httpx.Response, status: int, field: str) -> dict[str, Any]:
    """The documented error body, with `field` among the fields at fault."""
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()
    assert set(body) == {"error", "detail", "fields"}, body
    assert isinstance(body["detail"], str) and body["detail"]
    fields = [f["field"] for f in body["fields"]]
    assert field in fields, (field, body)
    return body


@pytest.fixture
def cluster(http: httpx.Client) -> dict[str, Any]:
    register_nodes(http, ["n0", "n1"])
    assert http.post("/v1/jobs", json=job_body("j1", ["n0", "n1"])).status_code == 201
    return snapshot(http)


def test_integers_past_64_bits_in_query_and_path(
    http: httpx.Client, cluster: dict[str, Any]
) -> None:
    refused(http.get("/v1/audit", params={"before_id": HUGE}), 422, "query.before_id")
    refused(http.post(f"/v1/deliveries/{HUGE}/replay"), 422, "path.delivery_id")
    refused(
        http.post(f"/v1/commands/{HUGE}/acks", json={"node": "n0", "status": "applied"}),
        422,
        "path.command_id",
    )
    body = {"at": datetime.now(UTC).isoformat(), "iteration": HUGE}
    refused(http.post("/v1/jobs/j1/checkpoints", json=body), 422, "iteration")
    assert snapshot(http) == cluster


@pytest.mark.parametrize(
    ("where", "value", "field"),
    [
        (("gpus", 0, "numa"), 7e32, "gpus.0.numa"),
        (("rnics", 0, "rate_gbps"), 6.7e307, "rnics.0.rate_gbps"),
        (("rnics", 0, "pci"), "not a pci address", "rnics.0.pci"),
        (("gpus", 0, "pci"), "0000:3b:00.8", "gpus.0.pci"),
        (("rnics", 0, "name"), "../etc", "rnics.0.name"),
        (("rnics", 0, "name"), "mlx5_0/1", "rnics.0.name"),
        (("rnics", 0, "switch"), "rail\ud800", "rnics.0.switch"),
        (("rnics", 0, "netdev"), "ib\x000", "rnics.0.netdev"),
        (("rnics", 0, "rail"), True, "rnics.0.rail"),
    ],
)
def test_absurd_node_registration(
    http: httpx.Client, cluster: dict[str, Any], where: tuple[Any, ...], value: Any, field: str
) -> None:
    node = hgx_node()
    node[where[0]][where[1]][where[2]] = value
    # Sent as raw JSON so a lone surrogate arrives as the \ud800 escape a client would send.
    raw = json.dumps(node)
    r = http.put("/v1/nodes/n0", content=raw, headers={"Content-Type": "application/json"})
    refused(r, 422, field)
    assert snapshot(http) == cluster


def test_pci_addresses_with_16_and_32_bit_domains_are_accepted(http: httpx.Client) -> None:
    node = hgx_node()
    node["gpus"][0]["pci"] = "0000:3b:00.0"
    node["gpus"][1]["pci"] = "10000000:3b:00.1"  # VMD's 32-bit domain
    r = http.put("/v1/nodes/n9", json=node)
    assert r.status_code == 200, r.text
    assert {g["pci"] for g in r.json()["gpus"]} >= {"0000:3b:00.0", "10000000:3b:00.1"}


@pytest.mark.parametrize(
    "case",
    [
        ("mlx5_99", 1, "events.0.device", "mlx5_99"),
        ("mlx5_0", 7, "events.0.port", "port 7"),
        ("../etc", 1, "events.0.device", "pattern"),
        ("mlx5_0/1", 1, "events.0.device", "pattern"),
    ],
)
def test_unknown_targets_are_refused_and_counted(
    http: httpx.Client, cluster: dict[str, Any], case: tuple[str, int, str, str]
) -> None:
    device, port, field, words = case
    good = event("n0", device="mlx5_1", after_s=2000)
    bad = event("n0", device=device, after_s=2000)
    bad["port"] = port
    body = refused(http.post("/v1/events", json={"events": [bad, good]}), 422, field)
    problem = next(f["problem"] for f in body["fields"] if f["field"] == field)
    assert words in problem or words in body["detail"], body
    assert snapshot(http) == cluster
    # The good event of the refused batch was not stored: it is new now.
    assert http.post("/v1/events", json={"events": [good]}).json()["accepted"] == 1
    if "pattern" not in words:
        metrics = http.get("/metrics").text
        reason = "unknown_device" if field.endswith("device") else "unknown_port"
        assert f'railover_events_refused_total{{reason="{reason}"}}' in metrics


def test_far_future_observation_is_refused(http: httpx.Client, cluster: dict[str, Any]) -> None:
    future = event("n0")
    future["observed_at"] = "2099-01-01T00:00:00+00:00"
    refused(http.post("/v1/events", json={"events": [future]}), 422, "events.0.observed_at")
    assert snapshot(http) == cluster
    # Within the allowed skew (default 300 s) it is fine.
    soon = event("n0")
    soon["observed_at"] = (datetime.now(UTC) + timedelta(seconds=30)).isoformat()
    assert http.post("/v1/events", json={"events": [soon]}).status_code == 202


@pytest.mark.parametrize("literal", ["Infinity", "-Infinity", "NaN", "1e999"])
def test_non_finite_numbers_are_refused(
    http: httpx.Client, cluster: dict[str, Any], literal: str
) -> None:
    body = json.dumps(job_body("j2", ["n0"])).replace(
        '"checkpoint_interval_s": 3600', f'"checkpoint_interval_s": {literal}'
    )
    assert literal in body
    r = http.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    refused(r, 422, "checkpoint_interval_s")
    assert snapshot(http) == cluster


def test_an_interval_of_years_is_a_typo(http: httpx.Client, cluster: dict[str, Any]) -> None:
    r = http.post("/v1/jobs", json=job_body("j2", ["n0"], checkpoint_interval_s=3600 * 24 * 400))
    refused(r, 422, "checkpoint_interval_s")
    assert snapshot(http) == cluster


def test_conditional_requirements_are_in_the_document(http: httpx.Client) -> None:
    doc = http.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    events = schemas["EventBatch"]["properties"]["events"]["items"]
    assert events["discriminator"]["propertyName"] == "kind"
    assert "device" in schemas["CounterEvent"]["required"]
    assert {"device", "wc_status"} <= set(schemas["CqeErrorEvent"]["required"])
    assert "allOf" in schemas["JobIn"]


def test_counter_event_without_device_names_the_field(
    http: httpx.Client, cluster: dict[str, Any]
) -> None:
    counter = event("n0", "counter", device=None, counter="symbol_error", delta=1)
    del counter["device"]
    refused(http.post("/v1/events", json={"events": [counter]}), 422, "events.0.device")
    assert snapshot(http) == cluster


def test_one_error_body_for_routes_methods_and_syntax(
    http: httpx.Client, cluster: dict[str, Any]
) -> None:
    r = http.get("/v1/no-such-thing")
    assert r.status_code == 404 and set(r.json()) == {"error", "detail", "fields"}
    r = http.request("PATCH", "/v1/jobs")
    assert r.status_code == 405 and r.json()["error"] == "method_not_allowed"
    assert r.headers["allow"] == "GET, POST"
    assert http.request("OPTIONS", "/v1/jobs/j1").headers["allow"] == "DELETE, GET"
    broken = '{\n  "gpus": [],\n  "rnics": [,]\n}'
    r = http.put("/v1/nodes/n0", content=broken, headers={"Content-Type": "application/json"})
    body = refused(r, 422, "body")
    assert "line 3 column 13" in body["detail"], body
    r = http.put(
        "/v1/nodes/n0",
        content=b'{"gpus": [], "rnics": [], "x": "' + b"a" * (17 * 2**20) + b'"}',
        headers={"Content-Type": "application/json"},
    )
    refused(r, 413, "body")
    assert snapshot(http) == cluster


def test_a_body_sent_without_json_content_type_says_so(
    http: httpx.Client, cluster: dict[str, Any]
) -> None:
    r = http.post(
        "/v1/jobs",
        content=json.dumps(job_body("j2", ["n0"])),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    body = refused(r, 422, "body")
    assert "Content-Type: application/json" in body["detail"]
    assert snapshot(http) == cluster
