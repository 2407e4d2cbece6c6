"""Nodes with every kind of RDMA device, and devices reported gone (issue 31), over HTTP on
each store: pci is nullable with its pattern enforced when present, the kind's fields are
checked against the kind, and a ``device_lost`` report opens its topology-loss fault."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from railover_testing.cluster_shapes import hgx_node


def _with(body: dict[str, Any], **rnic: Any) -> dict[str, Any]:
    body["rnics"].append({"name": "x0", "port": 1, **rnic})
    return body


def _lost(at: datetime, **part: Any) -> dict[str, Any]:
    return {
        "events": [
            {
                "event_id": uuid.uuid4().hex,
                "node": "n1",
                "kind": "device_lost",
                "observed_at": at.isoformat(),
                **part,
            }
        ]
    }


def _open_losses(http: httpx.Client) -> list[tuple[str, str]]:
    faults = http.get("/v1/faults", params={"node": "n1", "open": "true"}).json()["faults"]
    return sorted((f["kind"], f["device"]) for f in faults)


def test_kinds_are_kept_and_shown(http: httpx.Client) -> None:
    body = hgx_node()
    _with(body, name="rxe0", pci=None, kind="soft", counters={"link_downed": "available"})
    _with(body, name="x0", pci="0000:14:00.2", kind="vf", physfn="0000:14:00.0")
    _with(
        body,
        name="mlx5_bond_0",
        pci="0000:e1:00.0",
        kind="bond",
        members=["0000:e1:00.0", "0000:e1:00.1"],
        counters={"symbol_error": "unavailable (N/A (no PMA))"},
    )
    _with(body, name="old0", pci="")  # an agent before kinds: "" is no PCI function
    assert http.put("/v1/nodes/n1", json=body).status_code == 200, body
    shown = {r["name"]: r for r in http.get("/v1/nodes/n1").json()["rnics"]}
    assert (shown["rxe0"]["kind"], shown["rxe0"]["pci"]) == ("soft", None)
    assert shown["rxe0"]["counters"] == {"link_downed": "available"}
    assert (shown["x0"]["kind"], shown["x0"]["physfn"]) == ("vf", "0000:14:00.0")
    assert shown["mlx5_bond_0"]["members"] == ["0000:e1:00.0", "0000:e1:00.1"]
    assert shown["mlx5_bond_0"]["counters"] == {"symbol_error": "unavailable (N/A (no PMA))"}
    assert (shown["old0"]["kind"], shown["old0"]["pci"]) == ("physical", None)
    assert shown["mlx5_0"]["kind"] == "physical" and shown["mlx5_0"]["counters"] == {}
    # A counter that learns to count is shown without a new topology version.
    version = http.get("/v1/nodes/n1").json()["topology_version"]
    body["rnics"][-2]["counters"] = {"symbol_error": "available"}
    assert http.put("/v1/nodes/n1", json=body).status_code == 200
    again = http.get("/v1/nodes/n1").json()
    assert again["topology_version"] == version
    bond = next(r for r in again["rnics"] if r["name"] == "mlx5_bond_0")
    assert bond["counters"] == {"symbol_error": "available"}


@pytest.mark.parametrize(
    ("rnic", "named"),
    [
        ({"pci": "device"}, "pci"),  # what agents sent before for a device with no link
        ({"pci": "0000:00:ff.0"}, "pci"),  # no device number above 1f
        ({"pci": "0000:14:00.0", "kind": "soft"}, "soft device"),
        ({"pci": "0000:14:00.0", "physfn": "0000:14:00.0"}, "physfn"),
        ({"pci": "0000:14:00.0", "kind": "sf", "members": ["0000:14:00.0"]}, "members"),
        ({"pci": None, "kind": "wire"}, "kind"),
        ({"pci": None, "counters": {"symbol_error": "broken"}}, "counters"),
    ],
)
def test_a_device_that_does_not_fit_its_kind_is_refused_by_name(
    http: httpx.Client, rnic: dict[str, Any], named: str
) -> None:
    r = http.put("/v1/nodes/n1", json=_with(hgx_node(), **rnic))
    assert r.status_code == 422
    assert named in r.text


def test_a_device_lost_report_opens_the_loss_once(http: httpx.Client) -> None:
    body = hgx_node()
    assert http.put("/v1/nodes/n1", json=body).status_code == 200
    later = datetime.now(UTC) + timedelta(seconds=5)
    gpu3 = body["gpus"][3]["pci"]
    assert (
        http.post("/v1/events", json=_lost(later, gpu=3, detail={"pci": gpu3})).json()[
            "faults_opened"
        ]
        == 1
    )
    assert http.post("/v1/events", json=_lost(later, device="mlx5_2")).json()["faults_opened"] == 1
    # The smaller registration that follows opens nothing more.
    smaller = hgx_node()
    smaller["gpus"] = [g for g in smaller["gpus"] if g["index"] != 3]
    smaller["rnics"] = [r for r in smaller["rnics"] if r["name"] != "mlx5_2"]
    assert http.put("/v1/nodes/n1", json=smaller).status_code == 200
    assert _open_losses(http) == [("gpu_lost", "gpu3"), ("rnic_lost", "mlx5_2")]
    # Back in a registration: closed.
    assert http.put("/v1/nodes/n1", json=body).status_code == 200
    assert _open_losses(http) == []


def test_a_device_lost_report_older_than_the_registration_or_of_another_gpu_is_history(
    http: httpx.Client,
) -> None:
    body = hgx_node()
    before = datetime.now(UTC) - timedelta(minutes=5)
    assert http.put("/v1/nodes/n1", json=body).status_code == 200
    # Observed before the node last registered (it came back since): nothing opens.
    assert http.post("/v1/events", json=_lost(before, device="mlx5_2")).json()["faults_opened"] == 0
    # The GPU at index 3 has another address than the one reported gone.
    later = datetime.now(UTC) + timedelta(seconds=5)
    other = _lost(later, gpu=3, detail={"pci": "0000:99:00.0"})
    assert http.post("/v1/events", json=other).json()["faults_opened"] == 0
    assert _open_losses(http) == []


@pytest.mark.parametrize("part", [{}, {"gpu": 1, "device": "mlx5_0"}])
def test_a_device_lost_report_names_exactly_one_part(
    http: httpx.Client, part: dict[str, Any]
) -> None:
    r = http.post("/v1/events", json=_lost(datetime.now(UTC), **part))
    assert r.status_code == 422
    assert "exactly one of device (an RNIC) or gpu" in r.text
