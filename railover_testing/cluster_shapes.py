"""Node topologies of common GPU servers, as an agent would register them.

Used by the demo and the tests when no sysfs tree is at hand: 8 GPUs in pairs
behind 4 PCIe switches, two switches per NUMA node, each switch with its own
root port, and one 400G RNIC per GPU on a rail of its own.
"""

from __future__ import annotations

from typing import Any


def hgx_node(
    rails: int = 8,
    gpus: int = 8,
    *,
    switches: int = 4,
    numa_nodes: int = 2,
    rate_gbps: float = 400.0,
    switch_name: str = "rail{rail}-leaf",
) -> dict[str, Any]:
    """The PUT /v1/nodes body of an HGX-style node (GPU i and RNIC i share a PCIe switch)."""
    per_switch_gpu = max(1, gpus // switches)
    per_switch_nic = max(1, rails // switches)
    per_numa = max(1, switches // numa_nodes)

    def place(sw: int) -> dict[str, Any]:
        bus = 0x10 + 0x20 * sw
        return {
            "numa": sw // per_numa,
            "pcie_switch": f"0000:{bus + 1:02x}:00.0",
            "root_complex": f"pci0000:{bus:02x}",
        }

    gpu_rows = [
        {
            "index": i,
            "pci": f"0000:{0x10 + 0x20 * (i // per_switch_gpu) + 3:02x}:00.{i % 2}",
            "nvlink": True,
        }
        | place(i // per_switch_gpu)
        for i in range(gpus)
    ]
    rnic_rows = [
        {
            "name": f"mlx5_{r}",
            "port": 1,
            "pci": f"0000:{0x10 + 0x20 * (r // per_switch_nic) + 4:02x}:00.{r % 2}",
            "rate_gbps": rate_gbps,
            "link_layer": "InfiniBand",
            "switch": switch_name.format(rail=r),
            "rail": r,
            "state": "ACTIVE",
        }
        | place(r // per_switch_nic)
        for r in range(rails)
    ]
    return {"gpus": gpu_rows, "rnics": rnic_rows}
