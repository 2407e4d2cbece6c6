"""Node topologies of common GPU servers, as an agent would register them.

Used by the fleet twin, the demo and the tests when no sysfs tree is at hand: 8 GPUs in pairs
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
            # two functions per device, a device per pair behind the switch: unique
            "pci": f"0000:{0x10 + 0x20 * (i // per_switch_gpu) + 3:02x}:"
            f"{(i % per_switch_gpu) // 2:02x}.{i % 2}",
            "nvlink": True,
        }
        | place(i // per_switch_gpu)
        for i in range(gpus)
    ]
    rnic_rows = [
        {
            "name": f"mlx5_{r}",
            "port": 1,
            "pci": f"0000:{0x10 + 0x20 * (r // per_switch_nic) + 4:02x}:"
            f"{(r % per_switch_nic) // 2:02x}.{r % 2}",
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


def dual_port_node(
    *, rate_gbps: float = 200.0, switch_name: str = "rail{rail}-leaf"
) -> dict[str, Any]:
    """A second shape: 8 GPUs, 4 dual-port RNICs (8 ports, one rail each), 2 storage NICs.

    Two GPUs and one dual-port card behind each of 4 PCIe switches, two switches
    per root complex and NUMA node, in PCI domain 0x10000 (VMD), like
    railover_testing.sysfs_node.shape_c. Both ports of a card sit on the same
    switch as its GPUs, so the cheapest "other" port for a GPU is the second port
    of its own card, which s-Bond must never pick: one card failing takes both.
    """
    domain = "10000"

    def place(sw: int) -> dict[str, Any]:
        bus = 0x14 + 0x20 * (sw // 2)
        return {
            "numa": sw // 2,
            "pcie_switch": f"{domain}:{bus + 1 + 5 * (sw % 2):02x}:00.0",
            "root_complex": f"pci{domain}:{bus:02x}",
        }

    def gpu_bus(i: int) -> int:
        return 0x17 + 0x20 * (i // 4) + 5 * (i // 2 % 2) + i % 2

    gpu_rows = [
        {"index": i, "pci": f"{domain}:{gpu_bus(i):02x}:00.0", "nvlink": True} | place(i // 2)
        for i in range(8)
    ]
    rnic_rows = [
        {
            "name": f"mlx5_{card}",
            "port": port,
            "pci": f"{domain}:{0x19 + 0x20 * (card // 2) + 5 * (card % 2):02x}:00.0",
            "rate_gbps": rate_gbps,
            "link_layer": "InfiniBand",
            "switch": switch_name.format(rail=2 * card + port - 1),
            "rail": 2 * card + port - 1,
            "state": "ACTIVE",
        }
        | place(card)
        for card in range(4)
        for port in (1, 2)
    ]
    storage_rows = [
        {
            "name": f"mlx5_{4 + i}",
            "port": 1,
            "pci": f"{domain}:{0x55 + 0x20 * i:02x}:00.0",
            "rate_gbps": 100.0,
            "link_layer": "Ethernet",
            "numa": i,
            "pcie_switch": None,
            "root_complex": f"pci{domain}:{0x54 + 0x20 * i:02x}",
            "state": "ACTIVE",
        }
        for i in range(2)
    ]
    return {"gpus": gpu_rows, "rnics": rnic_rows + storage_rows}
