"""A rank's route and a job's connectivity: the types s-Bond planning and the job index share.

`route_ranks` resolves each rank to its primary and backup RNIC and whether each
still works under what is failed; `connectivity` counts the fabric pairs left without
a path, in O(ranks). A connectivity built from a job's index (engine.jobindex) keeps
that index, so its type (`JobIndex`, with each communicator's `CommIndex`) is here too:
paths.py plans the endpoints, jobindex.py builds and reads the index, and neither
imports the other.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from scheduler_svc.engine.paths import FailedSet, NodePlan, NodeTopology

T = TypeVar("T")


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
BOTH, PRIMARY, BACKUP, NONE = range(4)


def endpoint_class(r: RankRoute) -> int:
    if r.primary_ok:
        return BOTH if r.backup_ok else PRIMARY
    return BACKUP if r.backup_ok else NONE


def pair_counts(counts: Mapping[object, list[int]]) -> tuple[int, int]:
    """(broken, total) pairs within each group, from its per-class counts."""
    broken = total = 0
    for c in counts.values():
        b, t = _pairs(sum(c), c[NONE], c[PRIMARY], c[BACKUP])
        broken += b
        total += t
    return broken, total


def class_pairs(counts: np.ndarray) -> tuple[int, int]:
    """`pair_counts` of groups given as the rows of an array of per-class counts."""
    broken, total = _pairs(
        counts.sum(axis=1), counts[:, NONE], counts[:, PRIMARY], counts[:, BACKUP]
    )
    return int(broken.sum()), int(total.sum())


def _pairs(n: Any, none: Any, primary: Any, backup: Any) -> tuple[Any, Any]:
    """(broken, total) pairs in a group of `n` ranks: a rank with no endpoint breaks with
    every other, one with only its primary with every one with only its backup. Integers
    or numpy arrays of them (one group each)."""
    broken = none * (n - none) + none * (none - 1) // 2 + primary * backup
    return broken, n * (n - 1) // 2


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
        cls = endpoint_class(r)
        per_rail.setdefault(r.rail, [0, 0, 0, 0])[cls] += 1
        per_rail_node.setdefault((r.rail, r.node), [0, 0, 0, 0])[cls] += 1
    broken_rail, total_rail = pair_counts(per_rail)
    broken_local, total_local = pair_counts(per_rail_node)
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


Positions = tuple[int, ...]


@dataclass(frozen=True, slots=True, eq=False)
class CommIndex:
    """One communicator as `plan_mitigations` and `command_diff` read it."""

    comm_id: int
    # The members that are ranks of the job, in the order the planner reads them.
    ranks: tuple[int, ...]
    order: Mapping[int, int]  # member rank -> its place in `ranks`
    unique: bool  # no member named twice (else the planner reads the members one by one)
    nodes: int  # distinct nodes of the members
    # What command_diff tells: every rank it names (registered or the job's), sorted.
    told: frozenset[int]
    told_sorted: tuple[int, ...]


@dataclass(frozen=True, slots=True, eq=False)
class Lookups:
    """What a job's index finds only for a fault: the ranks it can touch and their counts.

    Positions by (node, RNIC) and by switch of a primary or backup (each position once,
    ascending) and by GPU; per (rail, node) the ranks in each endpoint class; and what
    `evidence.affects` asks: the ports and switches some rank's primary or backup uses,
    and the GPUs some rank runs on. A 65,536-rank job's are about half of its index's
    build, which a registration's answer need not wait for.
    """

    by_device: Mapping[tuple[str, str], Positions]  # primary or backup on that RNIC
    by_switch: Mapping[str, Positions]  # primary or backup behind that switch
    by_gpu: Mapping[tuple[str, int], Positions]
    node_counts: Mapping[tuple[int | None, str], tuple[int, int, int, int]]
    ports_by_node: Mapping[str, frozenset[tuple[str, int]]]
    used_switches: frozenset[str]
    used_gpus: frozenset[tuple[str, int]]


class Once(Generic[T]):
    """A value made on its first read, once, in whichever thread reads first."""

    __slots__ = ("_lock", "_make", "_value")

    def __init__(self, make: Callable[[], T]) -> None:
        self._lock = threading.Lock()
        self._make: Callable[[], T] | None = make
        self._value: T | None = None

    @property
    def made(self) -> bool:
        return self._make is None

    def get(self) -> T:
        if self._make is not None:
            with self._lock:
                if self._make is not None:
                    self._value = self._make()
                    self._make = None  # what it read, it no longer holds
        return self._value  # type: ignore[return-value]  # made above


# What fails on one node, as `jobindex.connectivity` keys its routes: the node's own
# failed parts (("r", device), ("l", device, port), ("g", gpu)) and the failed switches
# its ports are cabled to.
NodeFailures = tuple[frozenset[tuple[object, ...]], frozenset[str]]
NodeRouted = tuple[frozenset[str], NodeFailures, Mapping[int, "RankRoute"]]


@dataclass(frozen=True, slots=True, eq=False)
class JobIndex:
    ranks: tuple[tuple[int, str, int], ...]
    healthy: tuple[RankRoute, ...]  # each rank's route when nothing is failed
    positions: Mapping[int, int]  # rank -> its place in `ranks`
    nodes: frozenset[str]
    by_node: Mapping[str, Positions]
    by_rail: Mapping[int | None, Positions]  # rail of the primary, as the pairs count it
    odd: Positions  # ranks without both endpoints even when nothing is failed
    rail_counts: Mapping[int | None, tuple[int, int, int, int]]
    broken_rail: int
    total_rail: int
    broken_local: int
    total_local: int
    # What only a fault reads, made on its first read (`Lookups`, `warm`).
    lookups: Once[Lookups] = field(repr=False)
    rank_node: Mapping[int, str]
    ranks_in_order: tuple[int, ...]  # the ranks as placed
    sorted_ranks: tuple[int, ...]
    comms: tuple[CommIndex, ...]  # in the order of JobState.communicators
    comm_specs: tuple[tuple[int, int, tuple[int, ...]], ...]
    # The plans and topologies it was built on, each node's as the plan cache gave it.
    plans: Mapping[str, NodePlan]
    topologies: Mapping[str, NodeTopology]
    warnings: tuple[str, ...]  # every plan's warnings, by node name, as reconcile lists them
    # Per node, the last answer `jobindex.connectivity` routed for it: (the switches of
    # its ports, the failures on it, its ranks' routes that differ from healthy).
    routed: dict[str, NodeRouted] = field(default_factory=dict, repr=False)

    @property
    def by_device(self) -> Mapping[tuple[str, str], Positions]:
        return self.lookups.get().by_device

    @property
    def by_switch(self) -> Mapping[str, Positions]:
        return self.lookups.get().by_switch

    @property
    def by_gpu(self) -> Mapping[tuple[str, int], Positions]:
        return self.lookups.get().by_gpu

    @property
    def node_counts(self) -> Mapping[tuple[int | None, str], tuple[int, int, int, int]]:
        return self.lookups.get().node_counts

    @property
    def ports_by_node(self) -> Mapping[str, frozenset[tuple[str, int]]]:
        return self.lookups.get().ports_by_node

    @property
    def used_switches(self) -> frozenset[str]:
        return self.lookups.get().used_switches

    @property
    def used_gpus(self) -> frozenset[tuple[str, int]]:
        return self.lookups.get().used_gpus

    def warm(self) -> None:
        """Make the lookups now (after a registration's answer), not at the first fault."""
        self.lookups.get()

    def built_on(
        self, plans: Mapping[str, NodePlan], topologies: Mapping[str, NodeTopology]
    ) -> bool:
        """Whether the job's nodes have the plans and topologies it was built on."""
        for mine, theirs in ((self.plans, plans), (self.topologies, topologies)):
            if mine is theirs:
                continue
            for n in self.nodes:
                a, b = mine.get(n), theirs.get(n)
                if a is not b and a != b:
                    return False
        return True

    def fits(self, ranks: Sequence[tuple[int, str, int]], comms: Iterable[object]) -> bool:
        """Whether this index was built for these ranks and communicators."""
        if ranks is not self.ranks and tuple(ranks) != self.ranks:
            return False
        return specs_of(comms) == self.comm_specs


def specs_of(comms: Iterable[object]) -> tuple[tuple[int, int, tuple[int, ...]], ...]:
    return tuple(
        (c.comm_id, c.channels, tuple(c.ranks))  # type: ignore[attr-defined]  # CommSpec
        for c in comms
    )
