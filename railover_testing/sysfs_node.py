"""Generate sysfs trees laid out the way Linux lays them out on GPU nodes.

The agent reads nothing but files under its configurable sysfs root, so a tree
built here exercises exactly the code that runs on a real machine: the real
``devices/pciDDDD:BB/<root port>/<switch up>/<switch down>/<endpoint>``
hierarchy, ``class/infiniband/<dev>`` and ``class/net/<if>`` symlinks into it,
``bus/pci/devices/*`` symlinks, and ``devices/system/node/node*/cpulist``.

Used by the agent's tests and by ``make demo`` (which builds one tree per
simulated node). What the files hold is in ``sysfs_kernel_values``; changing them
under a running agent (a port going down, a counter rising, a PCIe link training
down) is ``sysfs_faults``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from railover_testing.sysfs_kernel_values import (
    BROADCOM_VENDOR,
    CLASS_3D_CONTROLLER,
    CLASS_ETHERNET,
    CLASS_INFINIBAND,
    CLASS_OTHER_BRIDGE,
    CLASS_PCI_BRIDGE,
    CX7_DEVICE,
    GEN4,
    GEN5,
    H100_SXM_DEVICE,
    HW_COUNTERS,
    IB_COUNTERS,
    INTEL_VENDOR,
    MELLANOX_VENDOR,
    NO_PMA,
    NVIDIA_VENDOR,
    NVSWITCH_DEVICE,
    PEX_SWITCH_DEVICE,
    ROCE_NO_PMA_COUNTERS,
    ROOT_PORT_DEVICE,
)

LinkLayer = Literal["InfiniBand", "Ethernet"]


@dataclass(frozen=True)
class FixtureGpu:
    """What discovery must find for one GPU of a fixture node."""

    index: int
    pci: str
    numa: int
    pcie_switch: str | None
    root_complex: str


@dataclass(frozen=True)
class FixtureRnic:
    """What discovery must find for one RNIC of a fixture node."""

    name: str
    pci: str
    numa: int
    pcie_switch: str | None
    root_complex: str
    netdev: str
    link_layer: LinkLayer
    rate_gbps: int
    ports: tuple[int, ...] = (1,)
    storage: bool = False


@dataclass(frozen=True)
class RnicSpec:
    """One RNIC to place in a fixture."""

    link_layer: LinkLayer = "InfiniBand"
    rate: str = "400 Gb/sec (4X NDR)"
    storage: bool = False
    # Ports of the one PCI function (ConnectX dual-port cards: ports 1 and 2, one netdev each).
    ports: int = 1


@dataclass(frozen=True)
class SwitchSpec:
    """One PCIe switch with the GPUs and RNICs behind it."""

    numa: int
    gpus: int
    rnics: tuple[RnicSpec, ...]
    # Switches with the same rc_group share one host bridge (pciDDDD:BB), each
    # on its own root port; None gives the switch a root complex of its own.
    rc_group: int | None = None


@dataclass(frozen=True)
class NodeSpec:
    """A whole node: switches, RNICs directly on root ports, NUMA layout."""

    switches: tuple[SwitchSpec, ...]
    numa_nodes: int = 2
    cpus_per_numa: int = 56
    # RNICs on their own root port, no switch (storage NICs on most HGX boards).
    direct_rnics: tuple[tuple[int, RnicSpec], ...] = ()
    nvswitches: int = 4
    # First PCI domain. Above 0xffff it takes more than four hex digits, as the
    # domains that Intel VMD creates do (10000:e1:00.0).
    domain: int = 0
    # What every error and traffic counter reads before any test touches it: a node
    # that has been up a while has counted something already.
    counter_start: int = 0


@dataclass
class FixtureNode:
    """A generated tree and what is in it."""

    root: Path
    gpus: list[FixtureGpu] = field(default_factory=list)
    rnics: list[FixtureRnic] = field(default_factory=list)

    def rnic(self, name: str) -> FixtureRnic:
        for r in self.rnics:
            if r.name == name:
                return r
        raise KeyError(name)

    def rail_map(
        self, switch_name: Callable[[int], str] = lambda rail: f"rail{rail}-a"
    ) -> dict[str, dict[str, str | int]]:
        """Rail i for the i-th GPU-traffic RNIC port; storage NICs are left out."""
        out: dict[str, dict[str, str | int]] = {}
        rail = 0
        for r in self.rnics:
            if r.storage:
                continue
            # Each port of a multi-port RNIC is cabled to a rail of its own.
            for port in r.ports:
                out[f"{r.name}/{port}"] = {"switch": switch_name(rail), "rail": rail}
                rail += 1
        return out


def write_rail_map(
    path: Path,
    mapping: dict[str, dict[str, str | int]],
    fmt: Literal["json", "yaml"] = "json",
) -> Path:
    """Write a rail map file in the format RAILOVER_AGENT_RAIL_MAP reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(mapping, indent=2) if fmt == "json" else yaml.safe_dump(mapping)
    path.write_text(text)
    return path


def _put(path: Path, value: str | int) -> None:
    """Write a sysfs attribute; newline-terminated like the kernel's show()."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")


def _symlink(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(target, link.parent))


class _Builder:
    def __init__(self, root: Path, spec: NodeSpec) -> None:
        self.root = root
        self.spec = spec
        self.devices = root / "devices"
        self.node = FixtureNode(root=root)
        self.next_rc = 0
        self.rc_buses: dict[str, int] = {}
        self.rc_ports: dict[str, int] = {}
        self.rc_by_group: dict[int, tuple[str, int]] = {}
        self.gpu_index = 0
        self.rnic_index = 0
        self.ib_netdev_index = 0
        self.eth_netdev_index = 0

    # -- PCI plumbing ---------------------------------------------------------------------------
    def _new_rc(self) -> tuple[str, int]:
        i = self.next_rc
        self.next_rc += 1
        domain, base = self.spec.domain + i // 8, 0x14 + 0x20 * (i % 8)
        name = f"pci{domain:04x}:{base:02x}"
        self.rc_buses[name] = base
        self.rc_ports[name] = 0
        return name, domain

    def _rc_for(self, group: int | None) -> tuple[str, int]:
        if group is None:
            return self._new_rc()
        if group not in self.rc_by_group:
            self.rc_by_group[group] = self._new_rc()
        return self.rc_by_group[group]

    def _next_bus(self, rc: str) -> int:
        self.rc_buses[rc] += 1
        return self.rc_buses[rc]

    def _pci_function(
        self,
        path: Path,
        *,
        vendor: str,
        device: str,
        cls: str,
        numa: int,
        speed: str,
        width: int,
        driver: str | None = None,
    ) -> None:
        path.mkdir(parents=True, exist_ok=True)
        _put(path / "vendor", vendor)
        _put(path / "device", device)
        _put(path / "subsystem_vendor", vendor)
        _put(path / "class", cls)
        _put(path / "numa_node", numa)
        _put(path / "local_cpulist", self._cpulist(numa))
        _put(path / "current_link_speed", speed)
        _put(path / "max_link_speed", speed)
        _put(path / "current_link_width", width)
        _put(path / "max_link_width", width)
        _put(path / "enable", 1)
        _symlink(path / "subsystem", self.root / "bus" / "pci")
        if driver is not None:
            drv = self.root / "bus" / "pci" / "drivers" / driver
            drv.mkdir(parents=True, exist_ok=True)
            _symlink(path / "driver", drv)
            _symlink(drv / path.name, path)
        _symlink(self.root / "bus" / "pci" / "devices" / path.name, path)

    def _root_port(self, rc: str, domain: int, numa: int) -> tuple[Path, str]:
        base = int(rc.split(":")[1], 16)
        self.rc_ports[rc] += 1
        addr = f"{domain:04x}:{base:02x}:{self.rc_ports[rc]:02x}.0"
        path = self.devices / rc / addr
        self._pci_function(
            path,
            vendor=INTEL_VENDOR,
            device=ROOT_PORT_DEVICE,
            cls=CLASS_PCI_BRIDGE,
            numa=numa,
            speed=GEN5,
            width=16,
            driver="pcieport",
        )
        return path, addr

    def _cpulist(self, numa: int) -> str:
        n = self.spec.cpus_per_numa
        lo = numa * n
        # Hyperthread siblings follow all cores, as on x86 servers.
        total = n * self.spec.numa_nodes
        return f"{lo}-{lo + n - 1},{total + lo}-{total + lo + n - 1}"

    # -- endpoints ------------------------------------------------------------------------------
    def _gpu(self, parent: Path, domain: int, rc: str, switch: str | None, numa: int) -> None:
        bus = self._next_bus(rc)
        addr = f"{domain:04x}:{bus:02x}:00.0"
        self._pci_function(
            parent / addr,
            vendor=NVIDIA_VENDOR,
            device=H100_SXM_DEVICE,
            cls=CLASS_3D_CONTROLLER,
            numa=numa,
            speed=GEN5,
            width=16,
            driver="nvidia",
        )
        self.node.gpus.append(
            FixtureGpu(
                index=self.gpu_index, pci=addr, numa=numa, pcie_switch=switch, root_complex=rc
            )
        )
        self.gpu_index += 1

    def _rnic(
        self,
        parent: Path,
        domain: int,
        rc: str,
        switch: str | None,
        numa: int,
        *,
        spec: RnicSpec,
    ) -> None:
        bus = self._next_bus(rc)
        addr = f"{domain:04x}:{bus:02x}:00.0"
        pci_path = parent / addr
        ib = spec.link_layer == "InfiniBand"
        self._pci_function(
            pci_path,
            vendor=MELLANOX_VENDOR,
            device=CX7_DEVICE,
            cls=CLASS_INFINIBAND if ib else CLASS_ETHERNET,
            numa=numa,
            speed=GEN5,
            width=16,
            driver="mlx5_core",
        )
        name = f"mlx5_{self.rnic_index}"
        self.rnic_index += 1

        dev_dir = pci_path / "infiniband" / name
        _put(dev_dir / "node_type", "1: CA")
        _put(dev_dir / "fw_ver", "28.39.1002")
        _put(dev_dir / "hca_type", "MT4129")
        _put(dev_dir / "board_id", "MT_0000000838")
        _put(dev_dir / "node_guid", f"a088:c203:00{self.rnic_index:02x}:1e4c")
        _symlink(dev_dir / "device", pci_path)
        _symlink(dev_dir / "subsystem", self.root / "class" / "infiniband")
        _symlink(self.root / "class" / "infiniband" / name, dev_dir)
        eth_card = self.eth_netdev_index + 1
        netdevs: list[str] = []
        for number in range(1, spec.ports + 1):
            port = dev_dir / "ports" / str(number)
            _put(port / "state", "4: ACTIVE")
            _put(port / "phys_state", "5: LinkUp")
            _put(port / "rate", spec.rate)
            _put(port / "link_layer", spec.link_layer)
            lid = self.rnic_index + 1 + 0x100 * (number - 1)
            _put(port / "lid", f"0x{lid:x}" if ib else "0x0")
            _put(port / "sm_lid", "0x1" if ib else "0x0")
            for c in IB_COUNTERS:
                start = self.spec.counter_start
                _put(
                    port / "counters" / c, NO_PMA if not ib and c in ROCE_NO_PMA_COUNTERS else start
                )
            for c in HW_COUNTERS:
                _put(port / "hw_counters" / c, 10 if c == "lifespan" else self.spec.counter_start)

            if ib:
                netdev = f"ib{self.ib_netdev_index}"
                self.ib_netdev_index += 1
            else:
                netdev = f"ens{eth_card}f0np{number - 1}"
            net_dir = pci_path / "net" / netdev
            # dev_port: the 0-based physical port of a multi-port function.
            _put(net_dir / "dev_port", number - 1)
            _put(net_dir / "dev_id", "0x0")
            _put(net_dir / "type", 32 if ib else 1)
            _put(net_dir / "operstate", "up")
            _put(net_dir / "mtu", 4092 if ib else 9000)
            _symlink(net_dir / "device", pci_path)
            _symlink(self.root / "class" / "net" / netdev, net_dir)
            netdevs.append(netdev)
        if not ib:
            self.eth_netdev_index += 1

        rate_gbps = int(float(spec.rate.split()[0]))
        self.node.rnics.append(
            FixtureRnic(
                name=name,
                pci=addr,
                numa=numa,
                pcie_switch=switch,
                root_complex=rc,
                netdev=netdevs[0],
                link_layer=spec.link_layer,
                rate_gbps=rate_gbps,
                ports=tuple(range(1, spec.ports + 1)),
                storage=spec.storage,
            )
        )

    def _switch(self, sw: SwitchSpec) -> None:
        rc, domain = self._rc_for(sw.rc_group)
        rp_path, _ = self._root_port(rc, domain, sw.numa)
        up_bus = self._next_bus(rc)
        up_addr = f"{domain:04x}:{up_bus:02x}:00.0"
        up_path = rp_path / up_addr
        self._pci_function(
            up_path,
            vendor=BROADCOM_VENDOR,
            device=PEX_SWITCH_DEVICE,
            cls=CLASS_PCI_BRIDGE,
            numa=sw.numa,
            speed=GEN5,
            width=16,
            driver="pcieport",
        )
        down_bus = self._next_bus(rc)
        endpoints: list[RnicSpec | None] = [None] * sw.gpus + list(sw.rnics)
        for slot, ep in enumerate(endpoints):
            dp_path = up_path / f"{domain:04x}:{down_bus:02x}:{slot:02x}.0"
            self._pci_function(
                dp_path,
                vendor=BROADCOM_VENDOR,
                device=PEX_SWITCH_DEVICE,
                cls=CLASS_PCI_BRIDGE,
                numa=sw.numa,
                speed=GEN5,
                width=16,
                driver="pcieport",
            )
            if ep is None:
                self._gpu(dp_path, domain, rc, up_addr, sw.numa)
            else:
                self._rnic(dp_path, domain, rc, up_addr, sw.numa, spec=ep)

    def build(self) -> FixtureNode:
        self.root.mkdir(parents=True, exist_ok=True)
        for n in range(self.spec.numa_nodes):
            _put(self.devices / "system" / "node" / f"node{n}" / "cpulist", self._cpulist(n))
        _put(self.devices / "system" / "node" / "online", f"0-{self.spec.numa_nodes - 1}")
        (self.root / "class" / "infiniband").mkdir(parents=True, exist_ok=True)
        (self.root / "class" / "net").mkdir(parents=True, exist_ok=True)
        for sw in self.spec.switches:
            self._switch(sw)
        for numa, spec in self.spec.direct_rnics:
            rc, domain = self._new_rc()
            rp_path, _ = self._root_port(rc, domain, numa)
            self._rnic(rp_path, domain, rc, None, numa, spec=spec)
        # NVSwitches show up as PCI "other bridge" functions from NVIDIA; their
        # presence is how a sysfs-only agent knows the GPUs share NVLink.
        for i in range(self.spec.nvswitches):
            rc, domain = self._new_rc()
            rp_path, _ = self._root_port(rc, domain, i % self.spec.numa_nodes)
            bus = self._next_bus(rc)
            self._pci_function(
                rp_path / f"{domain:04x}:{bus:02x}:00.0",
                vendor=NVIDIA_VENDOR,
                device=NVSWITCH_DEVICE,
                cls=CLASS_OTHER_BRIDGE,
                numa=i % self.spec.numa_nodes,
                speed=GEN4,
                width=2,
                driver="nvidia-nvswitch",
            )
        return self.node


def build_node(root: Path, spec: NodeSpec) -> FixtureNode:
    """Build a sysfs tree for ``spec`` under ``root`` (used as SYSFS_ROOT)."""
    return _Builder(Path(root), spec).build()


def rail_node(
    root: Path,
    *,
    gpus: int = 8,
    rnics: int = 8,
    switches: int = 4,
    numa_nodes: int = 2,
    storage_nics: int = 0,
    rate: str = "400 Gb/sec (4X NDR)",
    link_layer: LinkLayer = "InfiniBand",
) -> FixtureNode:
    """A rail-optimised node: GPUs and RNICs spread evenly over PCIe switches.

    Each switch gets its own root complex; switches are spread over NUMA nodes
    in order (the first half on node 0 for two nodes). Storage NICs sit on
    their own root ports, one per NUMA node in turn, RoCE at 200G.
    """
    if gpus % switches or rnics % switches or switches % numa_nodes:
        raise ValueError("gpus and rnics must divide evenly over switches, switches over NUMA")
    per_numa = switches // numa_nodes
    rnic = RnicSpec(link_layer=link_layer, rate=rate)
    sws = tuple(
        SwitchSpec(numa=i // per_numa, gpus=gpus // switches, rnics=(rnic,) * (rnics // switches))
        for i in range(switches)
    )
    storage = RnicSpec(link_layer="Ethernet", rate="200 Gb/sec (4X HDR)", storage=True)
    direct = tuple((i % numa_nodes, storage) for i in range(storage_nics))
    return build_node(root, NodeSpec(switches=sws, numa_nodes=numa_nodes, direct_rnics=direct))


def shape_a(root: Path) -> FixtureNode:
    """(a) 8 GPUs, 8×400G RNICs, 4 PCIe switches, 2 NUMA nodes, 2 storage NICs."""
    return rail_node(root, gpus=8, rnics=8, switches=4, numa_nodes=2, storage_nics=2)


def shape_b(root: Path) -> FixtureNode:
    """(b) 8 GPUs, 4 RNICs, two GPUs per RNIC; two switches per root complex."""
    rnic = RnicSpec()
    sws = tuple(SwitchSpec(numa=i // 2, gpus=2, rnics=(rnic,), rc_group=i // 2) for i in range(4))
    return build_node(root, NodeSpec(switches=sws, numa_nodes=2))


def shape_c(root: Path) -> FixtureNode:
    """(c) 8 GPUs, 4 dual-port 200G RNICs (8 ports), 2 storage NICs, PCI domain 0x10000.

    Its counters start at 17, not 0: the agent's first reading is a baseline.

    Two GPUs and one dual-port RNIC behind each of 4 PCIe switches, switches in
    pairs on one root complex per NUMA node, in a domain above 0xffff (as behind
    Intel VMD). Port 2 of an RNIC is never a backup for its port 1: one card
    failing takes both.
    """
    rnic = RnicSpec(rate="200 Gb/sec (4X HDR)", ports=2)
    sws = tuple(SwitchSpec(numa=i // 2, gpus=2, rnics=(rnic,), rc_group=i // 2) for i in range(4))
    storage = RnicSpec(link_layer="Ethernet", rate="100 Gb/sec (4X EDR)", storage=True)
    return build_node(
        root,
        NodeSpec(
            switches=sws,
            numa_nodes=2,
            direct_rnics=((0, storage), (1, storage)),
            domain=0x10000,
            counter_start=17,
        ),
    )


def build_cluster(
    base: Path,
    nodes: Iterable[str],
    *,
    gpus: int = 8,
    rnics: int = 8,
    switches: int = 4,
    numa_nodes: int = 2,
) -> dict[str, tuple[FixtureNode, Path]]:
    """One rail node per name under ``base/<name>/sys`` plus its rail map file.

    Rail i of every node is cabled to switch ``rail<i>-a``, so one rail switch
    failing shows up on every node at once.
    """
    out: dict[str, tuple[FixtureNode, Path]] = {}
    for name in nodes:
        node = rail_node(
            base / name / "sys", gpus=gpus, rnics=rnics, switches=switches, numa_nodes=numa_nodes
        )
        rail_map = write_rail_map(base / name / "rail_map.json", node.rail_map())
        out[name] = (node, rail_map)
    return out
