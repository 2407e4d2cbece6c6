"""Discovering a node's GPUs and RNICs and where they sit on the PCIe tree.

Where a device sits comes from its real sysfs path: the kernel names every
bridge on the way down from the host bridge, e.g.
``devices/pci0000:14/0000:14:01.0/0000:15:00.0/0000:16:02.0/0000:19:00.0`` is
host bridge ``pci0000:14`` (the root complex), root port ``0000:14:01.0``,
switch upstream port ``0000:15:00.0``, switch downstream port ``0000:16:02.0``,
endpoint ``0000:19:00.0``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent import rdma_device
from agent.counter_files import availability
from agent.railmap import RailMap
from agent.sysfs import PCI_ADDR_RE, normalise_pci, parse_rate, parse_state, read_attr

log = logging.getLogger(__name__)

NVIDIA_VENDOR = 0x10DE
# An RDMA device name as the kernel gives it (at most 63 characters, no slash).
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")
# PCI class codes (upper 16 bits of the class attribute).
CLASS_VGA = 0x0300
CLASS_3D = 0x0302
CLASS_OTHER_BRIDGE = 0x0680


# A host bridge (root complex) as the kernel names it: pci<domain>:<bus>.
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}\Z")
_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}\Z")
# Linux's NR_CPUS limit; a cpulist beyond it is not one the kernel prints.
MAX_CPUS = 8192
# The highest NUMA node number the service accepts.
MAX_NUMA = 1023
# The fastest port rate the service accepts (Gb/s); a larger one is a misread.
MAX_RATE_GBPS = 10000


@dataclass(frozen=True)
class PciPlace:
    pci: str
    numa: int | None
    pcie_switch: str | None
    root_complex: str | None


@dataclass(frozen=True)
class Gpu:
    index: int
    pci: str
    numa: int | None
    pcie_switch: str | None
    root_complex: str | None
    nvlink: bool | None


@dataclass(frozen=True)
class RnicPort:
    name: str
    port: int
    # The nearest PCI function (an SF's parent, a bond's first member); None for a soft
    # device or one whose sysfs names none.
    pci: str | None
    numa: int | None
    pcie_switch: str | None
    root_complex: str | None
    rate_gbps: float | None
    link_layer: str | None
    netdev: str | None
    switch: str | None
    rail: int | None
    state: str | None
    kind: str = rdma_device.PHYSICAL
    physfn: str | None = None
    members: tuple[str, ...] = ()
    # (counter, "available" | "unavailable (why)") for each watched counter.
    counters: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        return f"{self.name}/{self.port}"


@dataclass(frozen=True)
class Topology:
    gpus: tuple[Gpu, ...] = ()
    rnics: tuple[RnicPort, ...] = ()
    sources: tuple[str, ...] = field(default=("sysfs",), compare=False)

    def payload(self) -> dict[str, Any]:
        """The body of ``PUT /v1/nodes/{node}``."""
        rnics = []
        for r in self.rnics:
            d = asdict(r)
            rate = d["rate_gbps"]
            if rate is None or not 0 <= rate <= MAX_RATE_GBPS:
                del d["rate_gbps"]  # unknown: the service's default (0, unknown)
            elif float(rate).is_integer():
                d["rate_gbps"] = int(rate)
            # Not a state ib_core prints (unreadable, odd): not ACTIVE either.
            state_ok = r.state and _LABEL.match(r.state)
            d["state"] = r.state if state_ok else "UNKNOWN"
            d["members"] = list(r.members)
            d["counters"] = dict(r.counters)
            rnics.append(d)
        return {"gpus": [asdict(g) for g in self.gpus], "rnics": rnics}

    @functools.cached_property
    def fingerprint_value(self) -> str:
        """Changes when the hardware or cabling changes, not when a port flaps."""
        body = self.payload()
        for r in body["rnics"]:
            r.pop("state", None)
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    def fingerprint(self) -> str:
        # Asked every poll; the topology it describes is immutable.
        return self.fingerprint_value

    def rnic_ports(self) -> list[tuple[str, int]]:
        return [(r.name, r.port) for r in self.rnics]

    def pci_of(self, device: str) -> str | None:
        """The device's PCI function (None for a soft device, or an unknown name)."""
        for r in self.rnics:
            if r.name == device:
                return r.pci
        return None


def _cpu_set(text: str | None) -> frozenset[int]:
    out: set[int] = set()
    for raw in (text or "").split(","):
        part = raw.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            return frozenset()
        if not 0 <= first <= last < MAX_CPUS:
            return frozenset()  # not a list the kernel prints
        out.update(range(first, last + 1))
    return frozenset(out)


class PciTree:
    """Answers "where is this PCI function" for one sysfs root."""

    def __init__(self, sysfs_root: Path) -> None:
        self.root = Path(sysfs_root)
        self.devices = os.path.realpath(self.root / "devices")
        self._node_cpus: dict[int, frozenset[int]] | None = None

    def _numa_from_cpus(self, dev_path: str) -> int | None:
        # numa_node is -1 when firmware gives no proximity info; the device's
        # local_cpulist still says which node's cores are near it.
        if self._node_cpus is None:
            self._node_cpus = {}
            node_dir = self.root / "devices" / "system" / "node"
            for entry in sorted(node_dir.glob("node[0-9]*")):
                number = entry.name[4:]
                if not number.isdigit() or int(number) > MAX_NUMA:
                    continue
                cpus = _cpu_set(read_attr(entry / "cpulist"))
                if cpus:
                    self._node_cpus[int(number)] = cpus
        local = _cpu_set(read_attr(os.path.join(dev_path, "local_cpulist")))
        for node, cpus in self._node_cpus.items():
            if local and local <= cpus:
                return node
        return None

    def place(self, pci_real_path: str) -> PciPlace:
        rel = os.path.relpath(pci_real_path, self.devices)
        parts = rel.split(os.sep)
        rc = parts[0] if parts and _HOST_BRIDGE.match(parts[0]) else None
        chain = [p for p in parts if PCI_ADDR_RE.match(p)]
        pci = chain[-1] if chain else os.path.basename(pci_real_path)
        # chain = [root port, (switch up, switch down)*, endpoint]. The switch
        # above the device is the upstream port just above its downstream port.
        between = chain[1:-1]
        switch: str | None
        if not between:
            switch = None
        elif len(between) >= 2:
            switch = between[-2]
        else:
            switch = between[0]
        numa_raw = read_attr(os.path.join(pci_real_path, "numa_node"))
        try:
            numa: int | None = int(numa_raw) if numa_raw is not None else None
        except ValueError:
            numa = None
        if numa is None or not 0 <= numa <= MAX_NUMA:
            numa = self._numa_from_cpus(pci_real_path)
        return PciPlace(pci=pci, numa=numa, pcie_switch=switch, root_complex=rc)

    def real_path_of(self, pci: str) -> str:
        return os.path.realpath(self.root / "bus" / "pci" / "devices" / pci)


def _hex(text: str | None) -> int | None:
    if not text:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


def _class_code(text: str | None) -> int | None:
    code = _hex(text)
    return None if code is None else code >> 8


def _sysfs_gpus(tree: PciTree) -> tuple[list[str], bool]:
    """PCI addresses of NVIDIA display/3D functions, and whether NVSwitches exist."""
    gpus: list[str] = []
    nvswitch = False
    bus = tree.root / "bus" / "pci" / "devices"
    try:
        entries = sorted(os.listdir(bus))
    except OSError:
        return [], False
    for addr in entries:
        if not PCI_ADDR_RE.match(addr):
            continue  # not a name the kernel gives; nothing the service could place
        d = bus / addr
        if _hex(read_attr(d / "vendor")) != NVIDIA_VENDOR:
            continue
        cls = _class_code(read_attr(d / "class"))
        if cls in (CLASS_VGA, CLASS_3D):
            gpus.append(addr)
        elif cls == CLASS_OTHER_BRIDGE:
            nvswitch = True
    return gpus, nvswitch


def _nvml_gpus() -> list[tuple[int, str, bool | None]] | None:
    """(index, pci, nvlink) from NVML, or None when NVML is not usable here."""
    try:
        import pynvml  # noqa: PLC0415  # optional: nvidia-ml-py is only on GPU nodes
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # any NVML failure means "use sysfs"
        log.info("NVML unavailable (%s); using sysfs alone", exc)
        return None
    out: list[tuple[int, str, bool | None]] = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            pci = normalise_pci(pynvml.nvmlDeviceGetPciInfo(h).busId)
            nvlink: bool | None = None
            try:
                nvlink = bool(pynvml.nvmlDeviceGetNvLinkState(h, 0))
            except Exception:  # no NVLink on this GPU model
                nvlink = False
            out.append((i, pci, nvlink))
    finally:
        # A failing shutdown changes nothing we report.
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return out


def list_rnic_ports(sysfs_root: Path) -> list[tuple[str, int]]:
    """Every (device, port) under class/infiniband, cheaply."""
    base = Path(sysfs_root) / "class" / "infiniband"
    out: list[tuple[str, int]] = []
    try:
        devs = sorted(os.listdir(base))
    except OSError:
        return out
    for dev in devs:
        if not _DEVICE_NAME.match(dev):
            log.warning("ignoring RDMA device %r: not a name the kernel gives", dev)
            continue
        try:
            ports = sorted(
                int(p) for p in os.listdir(base / dev / "ports") if p.isdigit() and len(p) <= 3
            )
        except OSError:
            continue
        out.extend((dev, p) for p in ports if 1 <= p <= 255)
    return out


def _rnic_port(
    tree: PciTree,
    sysfs_root: Path,
    dev: str,
    port: int,
    *,
    rail_map: RailMap,
    watched: tuple[str, ...],
) -> RnicPort:
    where = rdma_device.locate(sysfs_root, dev)
    place = None if where.pci_path is None else tree.place(where.pci_path)
    pdir = Path(sysfs_root) / "class" / "infiniband" / dev / "ports" / str(port)
    state = parse_state(read_attr(pdir / "state"))
    assign = rail_map.get((dev, port))
    return RnicPort(
        name=dev,
        port=port,
        pci=where.pci,
        numa=None if place is None else place.numa,
        pcie_switch=None if place is None else place.pcie_switch,
        root_complex=None if place is None else place.root_complex,
        rate_gbps=parse_rate(read_attr(pdir / "rate")),
        link_layer=_label(read_attr(pdir / "link_layer")),
        netdev=rdma_device.port_netdev(sysfs_root, dev, where, port),
        switch=assign.switch if assign else None,
        rail=assign.rail if assign else None,
        state=state[1] if state else None,
        kind=where.kind,
        physfn=where.physfn,
        members=where.members,
        counters=availability(str(pdir), watched),
    )


def _label(text: str | None) -> str | None:
    """An attribute the service keeps as a label: one word of at most 32 characters."""
    return text if text and _LABEL.match(text) else None


def discover(
    sysfs_root: Path,
    rail_map: RailMap,
    use_nvml: bool = True,
    watched: tuple[str, ...] = (),
) -> Topology:
    """The node's GPUs and RNIC ports with their PCIe places and cabling, and whether each
    ``watched`` counter can count on each port."""
    tree = PciTree(sysfs_root)
    sources = ["sysfs"]
    sysfs_gpus, nvswitch = _sysfs_gpus(tree)
    nvml = _nvml_gpus() if use_nvml else None
    gpus: list[Gpu] = []
    if nvml:
        sources.append("nvml")
        for index, pci, nvlink in nvml:
            place = tree.place(tree.real_path_of(pci))
            gpus.append(Gpu(index, pci, place.numa, place.pcie_switch, place.root_complex, nvlink))
    else:
        # Without NVML, indices follow PCI bus order, which is NVML's and
        # CUDA's (CUDA_DEVICE_ORDER=PCI_BUS_ID) order too. NVSwitches on the
        # board mean every GPU is on NVLink; absent them we cannot tell.
        for index, pci in enumerate(sysfs_gpus):
            place = tree.place(tree.real_path_of(pci))
            gpus.append(
                Gpu(
                    index,
                    pci,
                    place.numa,
                    place.pcie_switch,
                    place.root_complex,
                    True if nvswitch else None,
                )
            )

    rnics = [
        _rnic_port(tree, sysfs_root, dev, port, rail_map=rail_map, watched=watched)
        for dev, port in list_rnic_ports(sysfs_root)
    ]
    missing = set(rail_map) - {(r.name, r.port) for r in rnics}
    if missing:
        log.warning(
            "rail map names ports this node does not have: %s",
            ", ".join(f"{d}/{p}" for d, p in sorted(missing)),
        )
    return Topology(gpus=tuple(gpus), rnics=tuple(rnics), sources=tuple(sources))
