"""Soft bonding (s-Bond): primary and backup RNIC per GPU, and which paths survive a fault.

ReCCL picks, for every GPU, the nearest RNIC as primary and the nearest other
RNIC as backup, by a PCIe distance cost: +1 behind another PCIe switch, +100
behind another root complex, +200 on another NUMA node. Ties go to the RNIC
whose PCIe switch carries the fewest backups, so one switch does not absorb
every failed-over GPU. Traffic that fails over goes backup-to-backup: the
sender's backup talks to the receiver's backup, which in a rail-optimised
fabric sits on another rail switch and so survives the loss of the primary's
switch.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache

COST_OTHER_PCIE_SWITCH = 1
COST_OTHER_ROOT_COMPLEX = 100
COST_OTHER_NUMA = 200

# What an RDMA device is (the agent's discovery): a PCI function of its own, a scalable
# function of one, an SR-IOV virtual function, a RoCE LAG bond over several, or a
# software device (rxe, siw) with no hardware of its own.
KIND_PHYSICAL = "physical"
KIND_SOFT = "soft"


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    pci: str
    numa: int | None = None
    pcie_switch: str | None = None
    root_complex: str | None = None
    nvlink: bool = False


@dataclass(frozen=True, slots=True)
class Rnic:
    name: str
    port: int
    pci: str | None = ""
    numa: int | None = None
    pcie_switch: str | None = None
    root_complex: str | None = None
    rate_gbps: float = 0.0
    switch: str | None = None
    rail: int | None = None
    state: str = "ACTIVE"
    kind: str = KIND_PHYSICAL
    physfn: str | None = None
    members: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """`device/port`, as the rail map and the events name a port."""
        return f"{self.name}/{self.port}"

    @property
    def carries_gpu_traffic(self) -> bool:
        """Ports cabled into the GPU fabric (with a rail) carry GPU traffic; storage NICs do
        not, nor does a software device (its traffic is the CPU's, over another NIC)."""
        return self.rail is not None and self.switch is not None and self.kind != KIND_SOFT

    @property
    def functions(self) -> frozenset[str]:
        """The PCI functions this device's traffic depends on: its own, a VF's physical
        function, a bond's members."""
        return frozenset(f for f in (self.pci, self.physfn, *self.members) if f)

    def shares_hardware(self, other: Rnic) -> bool:
        """Whether one failure can take both: the same device, or a PCI function in common
        (an SF or VF on the other's function, a bond over it)."""
        return self.name == other.name or bool(self.functions & other.functions)


@dataclass(frozen=True, slots=True)
class NodeTopology:
    name: str
    gpus: tuple[Gpu, ...]
    rnics: tuple[Rnic, ...]
    _by_key: dict[str, Rnic] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_key", {r.key: r for r in self.rnics})

    def rnic(self, key: str) -> Rnic:
        try:
            return self._by_key[key]
        except KeyError:
            raise KeyError(f"node {self.name} has no RNIC port {key}") from None


def placement_cost(gpu: Gpu, rnic: Rnic) -> int:
    """ReCCL's PCIe distance from a GPU to an RNIC; unknown locality counts as different."""
    cost = 0
    if gpu.pcie_switch is None or gpu.pcie_switch != rnic.pcie_switch:
        cost += COST_OTHER_PCIE_SWITCH
    if gpu.root_complex is None or gpu.root_complex != rnic.root_complex:
        cost += COST_OTHER_ROOT_COMPLEX
    if gpu.numa is None or gpu.numa != rnic.numa:
        cost += COST_OTHER_NUMA
    return cost


@dataclass(frozen=True, slots=True)
class GpuPaths:
    gpu: int
    primary: str | None
    backup: str | None
    primary_cost: int | None
    backup_cost: int | None
    primary_switch: str | None
    backup_switch: str | None

    @property
    def rail_disjoint(self) -> bool:
        """The backup avoids the primary's fabric switch, so it survives that switch's loss."""
        return (
            self.primary_switch is not None
            and self.backup_switch is not None
            and self.primary_switch != self.backup_switch
        )


@dataclass(frozen=True, slots=True)
class NodePlan:
    node: str
    gpus: tuple[GpuPaths, ...]
    backup_cap_per_switch: int
    warnings: tuple[str, ...] = field(default=())
    _by_gpu: dict[int, GpuPaths] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_gpu: dict[int, GpuPaths] = {}
        for g in self.gpus:
            by_gpu.setdefault(g.gpu, g)  # the first, as a search in order finds it
        object.__setattr__(self, "_by_gpu", by_gpu)

    def has_gpu(self, index: int) -> bool:
        return index in self._by_gpu

    def for_gpu(self, index: int) -> GpuPaths:
        try:
            return self._by_gpu[index]
        except KeyError:
            raise KeyError(f"node {self.node} has no GPU {index}") from None


def default_backup_cap(node: NodeTopology) -> int:
    """Spread backups evenly: GPUs divided by the PCIe switches that hold fabric RNICs."""
    switches = {r.pcie_switch for r in node.rnics if r.carries_gpu_traffic}
    return max(1, math.ceil(len(node.gpus) / max(1, len(switches))))


def plan_node(node: NodeTopology, backup_cap_per_switch: int | None = None) -> NodePlan:
    """Primary (nearest) and backup (nearest other) RNIC for every GPU of a node."""
    cap, paths, soft, fabricless, warned = _plan(node.gpus, node.rnics, backup_cap_per_switch)
    warnings = list(soft)
    if fabricless:
        warnings.append(f"node {node.name} has no RNIC on the GPU fabric (none in the rail map)")
    return NodePlan(node.name, paths, cap, (*warnings, *warned))


@lru_cache(maxsize=4096)
def _plan(
    gpus: tuple[Gpu, ...], rnics: tuple[Rnic, ...], backup_cap_per_switch: int | None
) -> tuple[int, tuple[GpuPaths, ...], tuple[str, ...], bool, tuple[str, ...]]:
    """`plan_node` but for the node's name: (cap, paths, soft-device warnings, whether no
    RNIC is on the fabric, the GPUs' warnings). Kept per parts: a fleet's nodes are mostly
    alike (nodes cabled to the same leaf switches are equal but for their names)."""
    cap = backup_cap_per_switch or default_backup_cap(NodeTopology("", gpus, rnics))
    candidates = sorted((r for r in rnics if r.carries_gpu_traffic), key=lambda r: r.key)
    keys = {id(r): r.key for r in candidates}  # `key` formats a string; build each once
    soft = tuple(
        f"{r.key} is a software RDMA device (soft: rxe, siw): never a primary or backup"
        for r in sorted(rnics, key=lambda r: r.key)
        if r.kind == KIND_SOFT
    )
    warnings: list[str] = []
    primary_load: Counter[str] = Counter()
    backup_load_rnic: Counter[str] = Counter()
    backup_load_switch: Counter[str | None] = Counter()
    plans: list[GpuPaths] = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        primary = min(
            candidates,
            key=lambda r: (placement_cost(gpu, r), primary_load[keys[id(r)]], keys[id(r)]),
            default=None,
        )
        if primary is None:
            plans.append(GpuPaths(gpu.index, None, None, None, None, None, None))
            continue
        primary_load[primary.key] += 1
        # Another port of the primary's card, a function carved from it or a bond over it
        # fails with it: not a backup.
        others = [r for r in candidates if not r.shares_hardware(primary)]
        backup = min(
            others,
            key=lambda r: (
                placement_cost(gpu, r),
                backup_load_switch[r.pcie_switch] >= cap,
                backup_load_switch[r.pcie_switch],
                backup_load_rnic[keys[id(r)]],
                keys[id(r)],
            ),
            default=None,
        )
        if backup is None:
            warnings.append(_no_backup(gpu, primary, candidates))
        else:
            if backup_load_switch[backup.pcie_switch] >= cap:
                warnings.append(
                    f"GPU {gpu.index} backs up onto {backup.key} although PCIe switch "
                    f"{backup.pcie_switch} already carries {cap} backups (no other choice)"
                )
            backup_load_switch[backup.pcie_switch] += 1
            backup_load_rnic[backup.key] += 1
        plans.append(_gpu_paths(gpu, primary, backup, warnings))
    return cap, tuple(plans), soft, not candidates, tuple(warnings)


def _no_backup(gpu: Gpu, primary: Rnic, candidates: list[Rnic]) -> str:
    shared = sorted({r.name for r in candidates if r.name != primary.name})
    if not shared:
        return f"GPU {gpu.index} has no backup RNIC: {primary.name} is the only fabric RNIC"
    return (
        f"GPU {gpu.index} has no backup RNIC: {', '.join(shared)} share PCI functions "
        f"with {primary.name} ({', '.join(sorted(primary.functions))}), so one failure "
        "takes both"
    )


def _gpu_paths(gpu: Gpu, primary: Rnic, backup: Rnic | None, warnings: list[str]) -> GpuPaths:
    """The GPU's two paths; a backup behind the primary's fabric switch is warned of."""
    paths = GpuPaths(
        gpu=gpu.index,
        primary=primary.key,
        backup=None if backup is None else backup.key,
        primary_cost=placement_cost(gpu, primary),
        backup_cost=None if backup is None else placement_cost(gpu, backup),
        primary_switch=primary.switch,
        backup_switch=None if backup is None else backup.switch,
    )
    if backup is not None and not paths.rail_disjoint:
        warnings.append(
            f"GPU {gpu.index}: backup {backup.key} hangs off the same fabric switch "
            f"{primary.switch} as primary {primary.key}; losing that switch loses both"
        )
    return paths


@dataclass(frozen=True, slots=True)
class FailedSet:
    """What is broken right now: whole RNICs, single ports (links), fabric switches, GPUs."""

    rnics: frozenset[tuple[str, str]] = frozenset()  # (node, device); device "*": every RNIC
    links: frozenset[tuple[str, str, int]] = frozenset()  # (node, device, port)
    switches: frozenset[str] = frozenset()
    gpus: frozenset[tuple[str, int]] = frozenset()  # (node, GPU index): gone from the node

    def port_ok(self, node: str, rnic: Rnic) -> bool:
        return (
            (node, rnic.name) not in self.rnics
            and (node, "*") not in self.rnics
            and (node, rnic.name, rnic.port) not in self.links
            and (rnic.switch is None or rnic.switch not in self.switches)
        )

    @property
    def empty(self) -> bool:
        return not (self.rnics or self.links or self.switches or self.gpus)
