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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scheduler_svc.engine.jobindex import JobIndex

COST_OTHER_PCIE_SWITCH = 1
COST_OTHER_ROOT_COMPLEX = 100
COST_OTHER_NUMA = 200


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
    pci: str = ""
    numa: int | None = None
    pcie_switch: str | None = None
    root_complex: str | None = None
    rate_gbps: float = 0.0
    switch: str | None = None
    rail: int | None = None
    state: str = "ACTIVE"

    @property
    def key(self) -> str:
        """`device/port`, as the rail map and the events name a port."""
        return f"{self.name}/{self.port}"

    @property
    def carries_gpu_traffic(self) -> bool:
        """Ports cabled into the GPU fabric (with a rail) carry GPU traffic; storage NICs do not."""
        return self.rail is not None and self.switch is not None


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
    cap = backup_cap_per_switch or default_backup_cap(node)
    candidates = sorted((r for r in node.rnics if r.carries_gpu_traffic), key=lambda r: r.key)
    keys = {id(r): r.key for r in candidates}  # `key` formats a string; build each once
    warnings: list[str] = []
    if not candidates:
        warnings.append(f"node {node.name} has no RNIC on the GPU fabric (none in the rail map)")
    primary_load: Counter[str] = Counter()
    backup_load_rnic: Counter[str] = Counter()
    backup_load_switch: Counter[str | None] = Counter()
    plans: list[GpuPaths] = []
    for gpu in sorted(node.gpus, key=lambda g: g.index):
        primary = min(
            candidates,
            key=lambda r: (placement_cost(gpu, r), primary_load[keys[id(r)]], keys[id(r)]),
            default=None,
        )
        if primary is None:
            plans.append(GpuPaths(gpu.index, None, None, None, None, None, None))
            continue
        primary_load[primary.key] += 1
        others = [r for r in candidates if r.name != primary.name]
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
            warnings.append(
                f"GPU {gpu.index} has no backup RNIC: {primary.name} is the only fabric RNIC"
            )
        else:
            if backup_load_switch[backup.pcie_switch] >= cap:
                warnings.append(
                    f"GPU {gpu.index} backs up onto {backup.key} although PCIe switch "
                    f"{backup.pcie_switch} already carries {cap} backups (no other choice)"
                )
            backup_load_switch[backup.pcie_switch] += 1
            backup_load_rnic[backup.key] += 1
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
        plans.append(paths)
    return NodePlan(node.name, tuple(plans), cap, tuple(warnings))


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


@dataclass(frozen=True, slots=True)
class RankRoute:
    """One rank's two endpoints and whether each still works."""

    rank: int
    node: str
    gpu: int
    primary: str | None
    backup: str | None
    primary_ok: bool
    backup_ok: bool
    rail: int | None = None  # rail of the primary RNIC

    @property
    def active(self) -> str | None:
        """The RNIC the rank's traffic uses now: its primary while that works, else its backup."""
        if self.primary_ok:
            return self.primary
        return self.backup if self.backup_ok else None


def pair_survives(a: RankRoute, b: RankRoute) -> bool:
    """Primary-to-primary or backup-to-backup: the two paths s-Bond sets up for a pair."""
    return (a.primary_ok and b.primary_ok) or (a.backup_ok and b.backup_ok)


@dataclass(frozen=True, slots=True)
class Connectivity:
    routes: tuple[RankRoute, ...]
    broken_pairs: int
    total_pairs: int
    isolated_ranks: tuple[int, ...]
    failed_over_ranks: tuple[int, ...]
    examples: tuple[tuple[int, int], ...]
    # Set when built from a job index (engine.jobindex): the places in `routes` of the
    # ranks that lack an endpoint, and the index. The same connectivity either way.
    odd: tuple[int, ...] | None = field(default=None, compare=False, repr=False)
    index: JobIndex | None = field(default=None, compare=False, repr=False)

    @property
    def all_pairs_survive(self) -> bool:
        return self.broken_pairs == 0


def route_ranks(
    ranks: Iterable[tuple[int, str, int]],
    plans: Mapping[str, NodePlan],
    topologies: Mapping[str, NodeTopology],
    failed: FailedSet,
) -> list[RankRoute]:
    """Resolve each (rank, node, gpu) to its endpoints and their health under `failed`."""
    routes = []
    for rank, node, gpu in ranks:
        plan, topo = plans.get(node), topologies.get(node)
        known = plan is not None and topo is not None and plan.has_gpu(gpu)
        if not known:
            # A GPU (or node) the job was placed on that the service does not know: no path.
            routes.append(RankRoute(rank, node, gpu, None, None, False, False, None))
            continue
        assert plan is not None
        assert topo is not None
        paths = plan.for_gpu(gpu)
        primary = None if paths.primary is None else topo.rnic(paths.primary)
        gone = (node, gpu) in failed.gpus  # the GPU itself is lost: neither path carries it
        primary_ok = (
            not gone and primary is not None and (failed.empty or failed.port_ok(node, primary))
        )
        backup_ok = (
            not gone
            and paths.backup is not None
            and (failed.empty or failed.port_ok(node, topo.rnic(paths.backup)))
        )
        rail = None if primary is None else primary.rail
        routes.append(
            RankRoute(rank, node, gpu, paths.primary, paths.backup, primary_ok, backup_ok, rail)
        )
    return routes


# Endpoint classes of a rank: both work, only primary, only backup, neither.
_BOTH, _PRIMARY, _BACKUP, _NONE = range(4)


def _class(r: RankRoute) -> int:
    if r.primary_ok:
        return _BOTH if r.backup_ok else _PRIMARY
    return _BACKUP if r.backup_ok else _NONE


def _pairs(counts: Mapping[object, list[int]]) -> tuple[int, int]:
    """(broken, total) pairs within each group, from its per-class counts."""
    broken = total = 0
    for c in counts.values():
        n, x = sum(c), c[_NONE]
        broken += x * (n - x) + x * (x - 1) // 2 + c[_PRIMARY] * c[_BACKUP]
        total += n * (n - 1) // 2
    return broken, total


def talks_over_fabric(a: RankRoute, b: RankRoute) -> bool:
    """Rail-local pairs on different nodes are the ones whose traffic crosses the RNICs.

    Rail-optimised collectives (NCCL with PXN) move cross-rail traffic over
    NVLink to the GPU on the destination's rail first, and ranks on one node
    talk over NVLink/PCIe, so only same-rail pairs on different nodes use the
    RNIC paths that s-Bond protects.
    """
    return a.node != b.node and a.rail == b.rail


def connectivity(routes: Sequence[RankRoute], max_examples: int = 10) -> Connectivity:
    """Which fabric pairs lost every path, counted in O(ranks), not O(pairs).

    A pair survives when both primaries or both backups work. So a pair breaks
    when either rank has no working endpoint, or when one has only its primary
    and the other only its backup. Pairs are those of `talks_over_fabric`:
    counted within each rail, minus those within one node of that rail.
    """
    per_rail: dict[object, list[int]] = {}
    per_rail_node: dict[object, list[int]] = {}
    for r in routes:
        cls = _class(r)
        per_rail.setdefault(r.rail, [0, 0, 0, 0])[cls] += 1
        per_rail_node.setdefault((r.rail, r.node), [0, 0, 0, 0])[cls] += 1
    broken_rail, total_rail = _pairs(per_rail)
    broken_local, total_local = _pairs(per_rail_node)
    broken, total = broken_rail - broken_local, total_rail - total_local
    isolated = [r for r in routes if not (r.primary_ok or r.backup_ok)]
    examples: list[tuple[int, int]] = []
    if broken:
        suspects = isolated + [r for r in routes if r.backup_ok and not r.primary_ok]
        for a in suspects:
            for b in routes:
                if talks_over_fabric(a, b) and not pair_survives(a, b):
                    examples.append((min(a.rank, b.rank), max(a.rank, b.rank)))
                    if len(examples) >= max_examples:
                        break
            if len(examples) >= max_examples:
                break
    return Connectivity(
        routes=tuple(routes),
        broken_pairs=broken,
        total_pairs=total,
        isolated_ranks=tuple(r.rank for r in isolated),
        failed_over_ranks=tuple(r.rank for r in routes if not r.primary_ok and r.backup_ok),
        examples=tuple(sorted(set(examples))),
    )


def bandwidth_left(routes: Sequence[RankRoute], topologies: Mapping[str, NodeTopology]) -> float:
    """Fraction of its primary's bandwidth that the worst-off rank still gets under s-Bond.

    A failed-over GPU shares its backup RNIC with the GPUs whose primary it is
    (and with other failed-over GPUs), and a collective runs at the pace of its
    slowest member.
    """
    healthy = Counter((r.node, r.primary) for r in routes if r.primary is not None)
    now = Counter((r.node, r.active) for r in routes if r.active is not None)
    worst = 1.0
    for r in routes:
        if r.active is None or r.primary is None:
            continue
        topo = topologies[r.node]
        primary_rate = topo.rnic(r.primary).rate_gbps or 1.0
        active_rate = topo.rnic(r.active).rate_gbps or primary_rate
        before = primary_rate / healthy[(r.node, r.primary)]
        after = active_rate / now[(r.node, r.active)]
        worst = min(worst, after / before)
    return worst
