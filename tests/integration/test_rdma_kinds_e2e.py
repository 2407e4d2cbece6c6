"""Issue 31's done-when: an agent on a node with every kind of RDMA device registers it with
the real service over loopback HTTP (each store), and ``GET /v1/nodes/{n}`` shows each
device's kind, PCI function (or null) and the availability of each watched counter; a
device that then vanishes from sysfs opens its topology-loss fault from the agent's
``device_lost`` report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from railover_testing.agents import AgentThread, settings_for
from railover_testing.sysfs_node import write_rail_map
from railover_testing.sysfs_rdma_kinds import kinds_node
from railover_testing.waiting import wait_until

WATCHED = "link_downed,symbol_error,req_cqe_error"
NO_PMA = "unavailable (N/A (no PMA))"
ABSENT = "unavailable (not exposed by the driver)"


def _node(http: httpx.Client) -> dict[str, Any] | None:
    r = http.get("/v1/nodes/n0")
    return r.json() if r.status_code == 200 else None


def test_every_kind_of_rdma_device_registers_and_shows(
    service: str, http: httpx.Client, tmp_path: Path
) -> None:
    kn = kinds_node(tmp_path / "sys")
    rails = write_rail_map(tmp_path / "rails.json", kn.rail_map())
    settings = settings_for(
        kn.root, tmp_path / "agent", service, rails, counter_events=WATCHED, topology_interval_s=1
    )
    a = AgentThread(settings).start()
    try:
        assert wait_until(lambda: _node(http) is not None, timeout=30)
        body = _node(http)
        assert body is not None
        assert len(body["gpus"]) == 8
        by = {r["name"]: r for r in body["rnics"]}
        shown = {n: (r["kind"], r["pci"], r["physfn"], tuple(r["members"])) for n, r in by.items()}
        assert shown == {d.name: (d.kind, d.pci, d.physfn, d.members) for d in kn.devices.values()}
        assert by["mlx5_0"]["counters"] == dict.fromkeys(WATCHED.split(","), "available")
        assert by["mlx5_4"]["counters"] == {
            "link_downed": NO_PMA,
            "symbol_error": NO_PMA,
            "req_cqe_error": "available",
        }
        assert by["siw0"]["counters"] == dict.fromkeys(WATCHED.split(","), ABSENT)
        # The planner: rxe0 is in the rail map but never used, and said so; the SF of
        # mlx5_0 and the VF of mlx5_1 never back up their own PF.
        assert any(w.startswith("rxe0/1 is a software RDMA device") for w in body["warnings"])
        used = {p["primary"] for p in body["backup_plan"]} | {
            p["backup"] for p in body["backup_plan"]
        }
        assert "rxe0/1" not in used
        for p in body["backup_plan"]:
            assert (p["primary"], p["backup"]) not in {
                ("mlx5_0/1", "mlx5_5/1"),
                ("mlx5_5/1", "mlx5_0/1"),
                ("mlx5_1/1", "mlx5_6/1"),
                ("mlx5_6/1", "mlx5_1/1"),
            }

        # The VF goes away (its driver unbound): the agent's report opens the fault.
        (kn.root / "class" / "infiniband" / "mlx5_6").unlink()

        def vf_lost() -> bool:
            faults = http.get("/v1/faults", params={"node": "n0", "open": "true"}).json()
            return any(
                (f["kind"], f["device"]) == ("rnic_lost", "mlx5_6") for f in faults["faults"]
            )

        assert wait_until(vf_lost, timeout=30)
    finally:
        a.stop()
