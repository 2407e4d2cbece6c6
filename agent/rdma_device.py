"""Where an RDMA device sits: its nearest PCI function, and what kind of device it is.

``/sys/class/infiniband/<dev>`` links to the device's own directory, which the
kernel places under its parent device; ``<dev>/device`` links to that parent.
The parent is a PCI function for a plain HCA, but not always:

- a scalable function (``mlx5_core.sf.N`` on the auxiliary bus) sits one level
  below the PCI function it was carved from: ``.../0000:08:00.0/mlx5_core.sf.2``;
- an SR-IOV virtual function is a PCI function of its own, whose ``physfn``
  links to the physical function it belongs to;
- a RoCE LAG bond (``mlx5_bond_0``) hangs off its first member's PCI function
  and runs over a bonding netdev whose lower devices are the member functions;
- soft RoCE (``rxe``) and soft iWARP (``siw``) have no parent on current kernels
  (``devices/virtual/infiniband/<dev>``, no ``device`` link); older kernels gave
  them the parent of the netdev they run over;
- dumps of older or Omni-Path machines may lack the ``device`` link altogether.

``locate`` walks from the parent (or, without a link, from the device's own
directory) up to the nearest PCI function and reports ``pci`` None where there
is none. It only reads: a missing, dangling or looping link, an unreadable or
odd file is "not there", never an exception, and every address it reports
matches ``PCI_ADDR_RE``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from agent.sysfs import PCI_ADDR_RE, read_attr

PHYSICAL = "physical"
SF = "sf"
VF = "vf"
BOND = "bond"
SOFT = "soft"
KINDS = (PHYSICAL, SF, VF, BOND, SOFT)

# The names the kernel's soft drivers give (rxe0, siw0, siw_eth0); as ``rdma link add``
# names them by convention too.
_SOFT_NAME = re.compile(r"^(rxe|siw)")
_BOND_NAME = re.compile(r"_bond_[0-9]+\Z")
_SF_NAME = re.compile(r"\.sf\.[0-9]+\Z")
_NETDEV_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,14}\Z")


@dataclass(frozen=True)
class RdmaPlace:
    """An RDMA device's kind and the PCI function(s) it runs on."""

    kind: str
    # Real path of the nearest PCI function, and its address; None when there is none.
    pci_path: str | None
    pci: str | None
    # A VF's physical function.
    physfn: str | None = None
    # A bond's member functions (its own ``pci`` among them).
    members: tuple[str, ...] = ()
    # Where the device's netdevs are (``<dir>/net/<if>``): the SF's own directory, else the
    # PCI function's.
    netdev_parent: str | None = None


def _inside(path: str, devices: str) -> bool:
    return path.startswith(devices + os.sep)


def _real_dir(path: str | Path) -> str | None:
    """The real path of ``path`` when it resolves to a directory, else None."""
    try:
        real = os.path.realpath(path)
        return real if os.path.isdir(real) else None
    except (OSError, ValueError):
        return None


def nearest_pci(path: str | None, devices: str) -> str | None:
    """The real path of the nearest PCI function at or above ``path`` within ``devices``."""
    if path is None or not _inside(path, devices):
        return None
    parts = os.path.relpath(path, devices).split(os.sep)
    for i in range(len(parts) - 1, -1, -1):
        if PCI_ADDR_RE.match(parts[i]):
            return os.path.join(devices, *parts[: i + 1])
    return None


def _parent_device(ib_dir: Path, devices: str) -> str | None:
    """The device the RDMA device hangs off: its ``device`` link, else its own directory's
    parent (``<parent>/infiniband/<dev>``)."""
    linked = _real_dir(ib_dir / "device")
    if linked is not None and _inside(linked, devices):
        return linked
    own = _real_dir(ib_dir)
    if own is None or not _inside(own, devices):
        return None
    holder = os.path.dirname(own)
    if os.path.basename(holder) != "infiniband":
        return None
    return os.path.dirname(holder)


def _port_netdev(ib_dir: Path) -> str | None:
    """The netdev of the device's first RoCE GID (``ports/N/gid_attrs/ndevs/0``), if any."""
    try:
        ports = sorted(p for p in os.listdir(ib_dir / "ports") if p.isdigit())
    except OSError:
        return None
    for p in ports:
        name = read_attr(ib_dir / "ports" / p / "gid_attrs" / "ndevs" / "0")
        if name and _NETDEV_NAME.match(name):
            return name
    return None


def _bond_members(root: Path, bond: str | None, devices: str) -> tuple[str, ...]:
    """The PCI functions under a bonding netdev's lower devices (or its ``bonding/slaves``)."""
    if bond is None:
        return ()
    net = root / "class" / "net"
    lowers: list[str] = []
    try:
        entries = sorted(os.listdir(net / bond))
    except OSError:
        entries = []
    lowers = [e[len("lower_") :] for e in entries if e.startswith("lower_")]
    if not lowers:
        lowers = (read_attr(net / bond / "bonding" / "slaves") or "").split()
    found: list[str] = []
    for lower in lowers:
        if not _NETDEV_NAME.match(lower):
            continue
        pci = nearest_pci(_real_dir(net / lower / "device"), devices)
        name = None if pci is None else os.path.basename(pci)
        if name is not None and name not in found:
            found.append(name)
    return tuple(sorted(found))


def _is_bond_netdev(root: Path, netdev: str | None) -> bool:
    return netdev is not None and os.path.isdir(root / "class" / "net" / netdev / "bonding")


def _physfn(pci_path: str, devices: str) -> str | None:
    pf = _real_dir(os.path.join(pci_path, "physfn"))
    if pf is None or not _inside(pf, devices):
        return None
    name = os.path.basename(pf)
    return name if PCI_ADDR_RE.match(name) else None


def _is_sf(parent: str | None, pci_path: str | None) -> bool:
    if parent is None or parent == pci_path:
        return False
    if _SF_NAME.search(os.path.basename(parent)):
        return True
    bus = _real_dir(os.path.join(parent, "subsystem"))
    return bus is not None and os.path.basename(bus) == "auxiliary" and pci_path is not None


def locate(sysfs_root: Path, dev: str) -> RdmaPlace:
    """Kind and PCI function of ``/sys/class/infiniband/<dev>``; never raises."""
    root = Path(sysfs_root)
    devices = os.path.realpath(root / "devices")
    ib_dir = root / "class" / "infiniband" / dev
    parent = _parent_device(ib_dir, devices)
    pci_path = nearest_pci(parent, devices)
    pci = None if pci_path is None else os.path.basename(pci_path)
    own = _real_dir(ib_dir)
    virtual = own is not None and _inside(own, os.path.join(devices, "virtual"))
    if _SOFT_NAME.match(dev) or (virtual and pci_path is None):
        # A soft device runs on whatever netdev it was added to; no hardware of its own.
        return RdmaPlace(SOFT, None, None)
    netdev_parent = parent if parent is not None and pci_path is not None else pci_path
    gid_netdev = _port_netdev(ib_dir)
    if _BOND_NAME.search(dev) or _is_bond_netdev(root, gid_netdev):
        members = _bond_members(root, gid_netdev, devices)
        if pci is not None and pci not in members:
            members = tuple(sorted({*members, pci}))
        return RdmaPlace(BOND, pci_path, pci, members=members, netdev_parent=netdev_parent)
    if _is_sf(parent, pci_path):
        return RdmaPlace(SF, pci_path, pci, netdev_parent=netdev_parent)
    if pci_path is not None:
        physfn = _physfn(pci_path, devices)
        if physfn is not None and physfn != pci:
            return RdmaPlace(VF, pci_path, pci, physfn=physfn, netdev_parent=netdev_parent)
    return RdmaPlace(PHYSICAL, pci_path, pci, netdev_parent=netdev_parent)


def port_netdev(sysfs_root: Path, dev: str, place: RdmaPlace, port: int) -> str | None:
    """The netdev carrying ``dev``'s port: the port's RoCE GID netdev (a bond's is the bond),
    else the one of the device's functions whose ``dev_port`` is the port."""
    ib_dir = Path(sysfs_root) / "class" / "infiniband" / dev
    name = read_attr(ib_dir / "ports" / str(port) / "gid_attrs" / "ndevs" / "0")
    if name and _NETDEV_NAME.match(name):
        return name
    if place.netdev_parent is None:
        return None
    net = os.path.join(place.netdev_parent, "net")
    try:
        names = sorted(n for n in os.listdir(net) if _NETDEV_NAME.match(n))
    except OSError:
        return None
    for n in names:
        # dev_port is the 0-based physical port of a multi-port function.
        dev_port = read_attr(os.path.join(net, n, "dev_port"))
        if dev_port is not None and dev_port.isdigit() and int(dev_port) == port - 1:
            return n
    return names[0] if len(names) == 1 else None
