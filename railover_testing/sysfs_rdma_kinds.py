"""RDMA devices that are not one plain PCI function each, added to a fixture node's tree.

Laid out as the kernel lays them out (drivers/infiniband/core/device.c registers an
RDMA device under its parent device, ``<parent>/infiniband/<dev>``, with a
``device`` link to the parent when it has one; Documentation/ABI/testing/
sysfs-bus-pci for ``physfn`` and ``virtfn<N>``; the mlx5 subfunction patches for
``/sys/bus/auxiliary/devices/mlx5_core.sf.<N>``; bonding's ``lower_<if>`` links):

- a scalable function: ``<PF>/mlx5_core.sf.<N>/`` (``sfnum``, ``subsystem`` ->
  ``bus/auxiliary``), its RDMA device and netdev below it;
- an SR-IOV VF: a PCI function beside its PF, ``physfn`` -> the PF, ``virtfn0`` back;
- a RoCE LAG bond: ``mlx5_bond_0`` under the first of two PFs of one card, its port's
  GID netdev the bonding master ``bond0`` (``devices/virtual/net/bond0``) whose lower
  devices are the two PFs' netdevs;
- soft RoCE and soft iWARP: ``devices/virtual/infiniband/rxe0`` and ``siw0``, with no
  ``device`` link (current kernels give emulated devices no parent);
- an HCA whose PMA counters read ``N/A (no PMA)``: the base node's RoCE NIC.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from railover_testing.sysfs_kernel_values import (
    CLASS_ETHERNET,
    CLASS_PCI_BRIDGE,
    CX7_DEVICE,
    GEN5,
    HW_COUNTERS,
    IB_COUNTERS,
    INTEL_VENDOR,
    MELLANOX_VENDOR,
    NO_PMA,
    ROCE_NO_PMA_COUNTERS,
    ROOT_PORT_DEVICE,
)
from railover_testing.sysfs_node import FixtureNode, NodeSpec, RnicSpec, SwitchSpec, build_node

CX7_VF_DEVICE = "0x101e"
# What rxe's hw_counters are called (drivers/infiniband/sw/rxe/rxe_hw_counters.c).
RXE_HW_COUNTERS = (
    "sent_pkts",
    "rcvd_pkts",
    "duplicate_request",
    "out_of_seq_request",
    "rcvd_rnr_err",
    "send_rnr_err",
    "rcvd_seq_err",
    "ack_deferred",
    "retry_exceeded_err",
    "retry_rnr_exceeded_err",
    "completer_retry_err",
    "send_err",
    "link_downed",
    "rdma_sends",
    "rdma_recvs",
)


@dataclass(frozen=True)
class ExpectedDevice:
    """What discovery must report for one RDMA device of the kinds node."""

    name: str
    kind: str
    pci: str | None
    physfn: str | None = None
    members: tuple[str, ...] = ()
    netdev: str | None = None


@dataclass
class KindsNode:
    node: FixtureNode
    devices: dict[str, ExpectedDevice] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return self.node.root

    def rail_map(self) -> dict[str, dict[str, str | int]]:
        """The four IB HCAs on rails 0-3; the SF, the VF, the bond and rxe0 cabled too (on
        rails of their own), so the planner has to refuse them where they share hardware."""
        out: dict[str, dict[str, str | int]] = {
            f"mlx5_{i}/1": {"switch": f"rail{i}-a", "rail": i} for i in range(4)
        }
        for rail, dev in enumerate(("mlx5_bond_0", "mlx5_5", "mlx5_6", "rxe0"), start=4):
            out[f"{dev}/1"] = {"switch": f"rail{rail}-a", "rail": rail}
        return out


def _put(path: Path, value: str | int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(target, link.parent))


def _port(port_dir: Path, *, link_layer: str, rate: str, pma: bool) -> None:
    """One port: state, rate, and (with a PMA) counters/; RoCE ports read N/A where the
    kernel prints it."""
    _put(port_dir / "state", "4: ACTIVE")
    _put(port_dir / "phys_state", "5: LinkUp")
    _put(port_dir / "rate", rate)
    _put(port_dir / "link_layer", link_layer)
    if pma:
        roce = link_layer == "Ethernet"
        for c in IB_COUNTERS:
            _put(port_dir / "counters" / c, NO_PMA if roce and c in ROCE_NO_PMA_COUNTERS else 0)
        for c in HW_COUNTERS:
            _put(port_dir / "hw_counters" / c, 0)


def _rdma_device(root: Path, parent: Path | None, name: str, node_type: str = "1: CA") -> Path:
    """``<parent>/infiniband/<name>`` with its ``device`` link, or, with no parent, the
    kernel's ``devices/virtual/infiniband/<name>`` without one; the class link either way."""
    if parent is None:
        d = root / "devices" / "virtual" / "infiniband" / name
    else:
        d = parent / "infiniband" / name
        _link(d / "device", parent)
    _put(d / "node_type", node_type)
    _link(d / "subsystem", root / "class" / "infiniband")
    _link(root / "class" / "infiniband" / name, d)
    return d


def _netdev(root: Path, parent: Path, name: str, dev_port: int = 0) -> Path:
    d = parent / "net" / name
    _put(d / "dev_port", dev_port)
    _put(d / "type", 1)
    _put(d / "operstate", "up")
    _link(d / "device", parent)
    _link(root / "class" / "net" / name, d)
    return d


def _pci_function(root: Path, path: Path, *, device: str, numa: int, cls: str) -> None:
    _put(path / "vendor", MELLANOX_VENDOR)
    _put(path / "device", device)
    _put(path / "class", cls)
    _put(path / "numa_node", numa)
    _put(path / "current_link_speed", GEN5)
    _put(path / "max_link_speed", GEN5)
    _put(path / "current_link_width", 16)
    _put(path / "max_link_width", 16)
    _link(path / "subsystem", root / "bus" / "pci")
    _link(root / "bus" / "pci" / "devices" / path.name, path)


def _pf_path(node: FixtureNode, name: str) -> Path:
    return (node.root / "bus" / "pci" / "devices" / node.rnic(name).pci).resolve()


def add_sf(kn: KindsNode, pf_of: str, name: str, index: int, sfnum: int) -> None:
    """A scalable function of ``pf_of``'s PCI function, with its RDMA device and netdev."""
    root = kn.root
    pf = _pf_path(kn.node, pf_of)
    sf = pf / f"mlx5_core.sf.{index}"
    _put(sf / "sfnum", sfnum)
    _link(sf / "subsystem", root / "bus" / "auxiliary")
    _link(root / "bus" / "auxiliary" / "devices" / sf.name, sf)
    ib = _rdma_device(root, sf, name)
    _port(ib / "ports" / "1", link_layer="Ethernet", rate="200 Gb/sec (4X HDR)", pma=True)
    netdev = f"enp{int(pf.name.split(':')[1], 16)}s0f0s{sfnum}"
    _netdev(root, sf, netdev)
    kn.devices[name] = ExpectedDevice(name, "sf", pf.name, netdev=netdev)


def add_vf(kn: KindsNode, pf_of: str, name: str) -> None:
    """SR-IOV VF 0 of ``pf_of``: function 1 of its bus, ``physfn`` and ``virtfn0`` between."""
    root = kn.root
    pf = _pf_path(kn.node, pf_of)
    vf = pf.parent / f"{pf.name[:-1]}1"
    _pci_function(root, vf, device=CX7_VF_DEVICE, numa=kn.node.rnic(pf_of).numa, cls="0x020700")
    _put(pf / "sriov_totalvfs", 8)
    _put(pf / "sriov_numvfs", 1)
    _link(pf / "virtfn0", vf)
    _link(vf / "physfn", pf)
    ib = _rdma_device(root, vf, name)
    _port(ib / "ports" / "1", link_layer="InfiniBand", rate="400 Gb/sec (4X NDR)", pma=True)
    kn.devices[name] = ExpectedDevice(name, "vf", vf.name, physfn=pf.name)


def add_roce_bond(kn: KindsNode, domain: int = 0, bus: int = 0xE0, numa: int = 1) -> None:
    """A dual-port card (two PFs) on its own root port, bonded: ``mlx5_bond_0`` over
    ``bond0``, whose lower devices are the two PFs' netdevs."""
    root = kn.root
    rp = root / "devices" / f"pci{domain:04x}:{bus:02x}" / f"{domain:04x}:{bus:02x}:01.0"
    _put(rp / "vendor", INTEL_VENDOR)
    _put(rp / "device", ROOT_PORT_DEVICE)
    _put(rp / "class", CLASS_PCI_BRIDGE)
    pfs = [rp / f"{domain:04x}:{bus + 1:02x}:00.{f}" for f in (0, 1)]
    bond = root / "devices" / "virtual" / "net" / "bond0"
    slaves = []
    for f, pf in enumerate(pfs):
        _pci_function(root, pf, device=CX7_DEVICE, numa=numa, cls=CLASS_ETHERNET)
        nd = _netdev(root, pf, f"ens{bus}f{f}np{f}")
        _link(nd / "master", bond)
        _link(nd / "upper_bond0", bond)
        _link(bond / f"lower_{nd.name}", nd)
        slaves.append(nd.name)
    _put(bond / "bonding" / "slaves", " ".join(slaves))
    _put(bond / "bonding" / "mode", "802.3ad 4")
    _put(bond / "operstate", "up")
    _link(root / "class" / "net" / "bond0", bond)
    ib = _rdma_device(root, pfs[0], "mlx5_bond_0")
    port = ib / "ports" / "1"
    _port(port, link_layer="Ethernet", rate="400 Gb/sec (4X NDR)", pma=True)
    _put(port / "gid_attrs" / "ndevs" / "0", "bond0")
    kn.devices["mlx5_bond_0"] = ExpectedDevice(
        "mlx5_bond_0",
        "bond",
        pfs[0].name,
        members=tuple(p.name for p in pfs),
        netdev="bond0",
    )


def add_soft(kn: KindsNode, name: str, over: str | None) -> None:
    """rxe (a CA with hw_counters) or siw (an RNIC with none), with no parent device; its
    port's GID netdev is ``over``."""
    root = kn.root
    rxe = name.startswith("rxe")
    ib = _rdma_device(root, None, name, node_type="1: CA" if rxe else "4: RNIC")
    port = ib / "ports" / "1"
    _port(port, link_layer="Ethernet", rate="100 Gb/sec (4X EDR)", pma=False)
    if rxe:
        for c in RXE_HW_COUNTERS:
            _put(port / "hw_counters" / c, 0)
    if over is not None:
        _put(port / "gid_attrs" / "ndevs" / "0", over)
    kn.devices[name] = ExpectedDevice(name, "soft", None, netdev=over)


def kinds_node(root: Path) -> KindsNode:
    """8 GPUs and 4 IB HCAs (mlx5_0-3) behind 2 PCIe switches, a RoCE HCA whose PMA
    counters read ``N/A (no PMA)`` (mlx5_4), and beside them: an SF of mlx5_0 (mlx5_5),
    a VF of mlx5_1 (mlx5_6), a RoCE bond (mlx5_bond_0), rxe0 and siw0."""
    ib = RnicSpec()
    sws = tuple(SwitchSpec(numa=i, gpus=4, rnics=(ib, ib)) for i in range(2))
    roce = RnicSpec(link_layer="Ethernet", rate="200 Gb/sec (4X HDR)")
    node = build_node(root, NodeSpec(switches=sws, direct_rnics=((0, roce),)))
    kn = KindsNode(node)
    for r in node.rnics:
        kn.devices[r.name] = ExpectedDevice(r.name, "physical", r.pci, netdev=r.netdev)
    add_sf(kn, "mlx5_0", "mlx5_5", index=2, sfnum=88)
    add_vf(kn, "mlx5_1", "mlx5_6")
    add_roce_bond(kn)
    add_soft(kn, "rxe0", over=node.rnic("mlx5_4").netdev)
    add_soft(kn, "siw0", over=node.rnic("mlx5_4").netdev)
    return kn
