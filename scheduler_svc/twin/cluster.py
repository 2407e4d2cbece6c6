"""The simulated cluster of the fleet twin: its nodes and leaf switches, its jobs, and the
faults that happen to it, drawn from the planning parameters.

Nothing here decides anything: the twin (scheduler_svc.twin.loop) reports what this
module says happened, and the service decides.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from scheduler_svc.planning.params import JobModel

RAILS = 8  # one 400G RNIC per GPU, each on a rail of its own (hgx_node)
GPUS = 8


class FaultKind(StrEnum):
    """What the twin breaks. Rates per component and hour: LINK and SWITCH are the planning
    parameters' (link_failure_monthly, switch_failure_monthly); the others are multiples
    of the link rate (KIND_SCALE), each times --fault-scale."""

    LINK = "link"  # a cable or transceiver: port_down, port_up after the repair
    RNIC = "rnic"  # the RNIC dies: device_fatal, back (port_up) after the repair
    FLAP = "flap"  # port_down and port_up a few seconds apart
    CQE = "cqe"  # CQE errors (retry exceeded) with no port change
    LEAF = "leaf"  # a leaf switch: every node on it loses that rail within a spread
    # The node's agent cannot reach the service for `repair_s`: its reports wait in its
    # spool and go in order when it is back; its commands wait for it too.
    PARTITION = "partition"
    # A GPU falls off the bus (`rail` is its index): its rank dies, the agent reports it
    # lost; the node registers it again after the repair.
    GPU = "gpu"
    # The node dies: its ranks with it, its agent silent; it registers again after the
    # repair (its agent's spool kept what it saw).
    NODE = "node"


# Per component (a link, an RNIC, a leaf; a node for PARTITION) and hour, as a multiple of
# the link rate; LEAF uses the switch rate itself.
KIND_SCALE = {
    FaultKind.LINK: 1.0,
    FaultKind.RNIC: 0.5,
    FaultKind.FLAP: 4.0,
    FaultKind.CQE: 2.0,
    FaultKind.PARTITION: 4.0,
    FaultKind.GPU: 0.5,
    FaultKind.NODE: 2.0,
}
# Kinds whose rate is per node rather than per link (or GPU: one per link)
PER_NODE = (FaultKind.PARTITION, FaultKind.NODE)
# How long an agent stays cut off: uniform in this range, seconds.
PARTITION_S = (30.0, 900.0)


@dataclass(frozen=True, slots=True)
class Reports:
    """How the agents' reports reach the service: each report (one POST of a node's
    events) is held back with probability `delay_p` for up to `max_delay_s` (so a later
    one may overtake it), sent a second time (the same event ids, up to `max_delay_s`
    later) with probability `duplicate_p`, and stamped by a node clock off by up to
    `skew_s` either way (each node's offset drawn once, within the service's bound)."""

    delay_p: float = 0.0
    duplicate_p: float = 0.0
    max_delay_s: float = 30.0
    skew_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("delay_p", "duplicate_p"):
            p = getattr(self, name)
            if not (math.isfinite(p) and 0 <= p <= 1):
                raise ValueError(f"{name}: a probability in [0, 1], got {p}")
        for name in ("max_delay_s", "skew_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and 0 <= v <= 86400):
                raise ValueError(f"{name}: seconds in [0, 86400], got {v}")


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    nodes: int = 256
    spares: int = 8
    nodes_per_leaf: int = 32  # per rail: rail r of nodes 0..31 is on leaf r of group 0
    jobs: int = 2
    # The jobs may restart without a broken node (a DP replica per node, the service's
    # restart_scaled) when no spare is free, rather than wait for a repair.
    scaling: bool = False

    def __post_init__(self) -> None:
        if self.nodes < 2:
            raise ValueError(f"nodes: a cluster needs at least 2 nodes, got {self.nodes}")
        if not 0 <= self.spares < self.nodes:
            raise ValueError(f"spares: must be in [0, {self.nodes}), got {self.spares}")
        if self.nodes_per_leaf < 1:
            raise ValueError(f"nodes_per_leaf: must be >= 1, got {self.nodes_per_leaf}")
        if not 1 <= self.jobs <= self.nodes - self.spares:
            raise ValueError(
                f"jobs: must be in [1, {self.nodes - self.spares}] (a node each at least), "
                f"got {self.jobs}"
            )


def node_name(i: int) -> str:
    return f"n{i:05d}"


def leaf_names(node: int, nodes_per_leaf: int) -> str:
    """The leaf of each of the node's rails, as hgx_node's `switch_name` takes it."""
    return f"rail{{rail}}-leaf{node // nodes_per_leaf}"


def leaf_of(node: int, rail: int, nodes_per_leaf: int) -> str:
    return leaf_names(node, nodes_per_leaf).format(rail=rail)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A training job as the twin runs it: on whole nodes, 8 ranks a node."""

    job_id: str
    nodes: tuple[str, ...]
    checkpoint: str  # "interval" or "flowcheck"
    interval_s: float  # between checkpoints (an iteration under FlowCheck)
    reload_s: float
    detect_s: float
    timeout_s: float
    k: float  # how much slower it really runs failed over
    allow_scaling: bool = False  # one DP replica per node; it may restart without one

    @property
    def gpus(self) -> int:
        return GPUS * len(self.nodes)


@dataclass(frozen=True, slots=True)
class JobShape:
    """A job of a fleet's history, as the twin lays it out: its size and its regime."""

    nodes: int
    checkpoint: str  # "interval" or "flowcheck"
    interval_s: float  # between checkpoints (an iteration under FlowCheck)
    reload_s: float
    detect_s: float
    timeout_s: float
    k: float


def job_mix(
    spec: ClusterSpec, model: JobModel, shapes: Sequence[JobShape] | None = None
) -> list[JobSpec]:
    """The jobs on the non-spare nodes. From a history (`shapes`, newest first): each at its
    own size and regime, as many of them as fit side by side, up to `spec.jobs` (one larger
    than every non-spare node runs on all of them). Otherwise the first takes half of the
    nodes, the others share the rest, and every other job checkpoints with FlowCheck."""
    usable = spec.nodes - spec.spares
    return _lay_out(spec, shapes or _modelled(spec, model, usable), usable)


def _modelled(spec: ClusterSpec, model: JobModel, usable: int) -> list[JobShape]:
    """`spec.jobs` jobs of the model's regime filling the usable nodes: the first half of
    them, the others the rest in equal shares, every other one on FlowCheck."""
    sizes = [max(1, usable // 2)] if spec.jobs > 1 else [usable]
    rest = usable - sizes[0]
    for j in range(1, spec.jobs):
        share = rest // (spec.jobs - j)
        sizes.append(share)
        rest -= share
    return [
        JobShape(
            nodes=size,
            checkpoint="flowcheck" if j % 2 == 1 else "interval",
            interval_s=model.iteration_s if j % 2 == 1 else model.checkpoint_interval_h * 3600,
            reload_s=model.reload_h * 3600,
            detect_s=model.detect_h * 3600,
            timeout_s=model.timeout_s,
            k=model.k[0],
        )
        for j, size in enumerate(sizes)
    ]


def _lay_out(spec: ClusterSpec, shapes: Sequence[JobShape], usable: int) -> list[JobSpec]:
    """The shapes side by side on the usable nodes, in order, up to `spec.jobs` of them; one
    that does not fit after the others is left out."""
    jobs: list[JobSpec] = []
    start = 0
    for shape in shapes:
        size = min(shape.nodes, usable)
        if len(jobs) == spec.jobs or start + size > usable:
            continue
        jobs.append(
            JobSpec(
                job_id=f"job-{len(jobs)}",
                nodes=tuple(node_name(i) for i in range(start, start + size)),
                checkpoint=shape.checkpoint,
                interval_s=shape.interval_s,
                reload_s=shape.reload_s,
                detect_s=shape.detect_s,
                timeout_s=shape.timeout_s,
                k=shape.k,
                allow_scaling=spec.scaling,
            )
        )
        start += size
    return jobs


@dataclass(frozen=True, slots=True, order=True)
class Fault:
    """One fault of the trace: at `at` seconds from the start, on `node`'s RNIC `rail`
    (LEAF: every node of `leaf`), repaired `repair_s` later (FLAP: back after it)."""

    at: float
    kind: FaultKind = field(compare=False)
    node: int = field(compare=False)
    rail: int = field(compare=False)
    repair_s: float = field(compare=False)
    leaf: str | None = field(default=None, compare=False)


def fleet_rates(
    spec: ClusterSpec,
    model: JobModel,
    per_component_h: Mapping[FaultKind, float] | None = None,
) -> dict[FaultKind, float]:
    """Faults of each kind per hour across the cluster, before --fault-scale (`trace`)."""
    links = spec.nodes * RAILS
    leaves = RAILS * math.ceil(spec.nodes / spec.nodes_per_leaf)
    rates = {kind: links * model.link_rate_per_h * scale for kind, scale in KIND_SCALE.items()}
    for kind in PER_NODE:
        rates[kind] = spec.nodes * model.link_rate_per_h * KIND_SCALE[kind]
    rates[FaultKind.LEAF] = leaves * model.switch_rate_per_h
    for kind, per_h in (per_component_h or {}).items():
        rates[kind] = per_h * (
            spec.nodes if kind in PER_NODE else leaves if kind == FaultKind.LEAF else links
        )
    return rates


def hard_failures_per_h(
    spec: ClusterSpec,
    model: JobModel,
    fault_scale: float,
    per_component_h: Mapping[FaultKind, float] | None = None,
) -> float:
    """The trace's faults only a replacement fixes (a lost GPU, a dead node) per hour: the
    rate the service prices a spare by when the twin runs it with --price-spares."""
    rates = fleet_rates(spec, model, per_component_h)
    return (rates[FaultKind.GPU] + rates[FaultKind.NODE]) * fault_scale


def trace(
    spec: ClusterSpec,
    model: JobModel,
    days: float,
    seed: int,
    fault_scale: float,
    *,
    per_component_h: Mapping[FaultKind, float] | None = None,
) -> list[Fault]:
    """Independent Poisson processes per component kind, seeded: the same trace for every
    policy. A LINK, RNIC or LEAF fault is repaired after an exponential time of mean
    repair_h; a FLAP comes back within seconds; a CQE burst needs no repair; a PARTITION
    lasts PARTITION_S; GPU and NODE are repaired like a link. PARTITION and NODE happen
    per node, the others per link (a GPU: one per link). `per_component_h` replaces the
    rate of the kinds it names (per component and hour: fitted from a history)."""
    if not (days > 0 and math.isfinite(days)):
        raise ValueError(f"days: must be a positive number, got {days}")
    if not (fault_scale >= 0 and math.isfinite(fault_scale)):
        raise ValueError(f"fault_scale: must be a number >= 0, got {fault_scale}")
    rng = np.random.default_rng(seed)
    horizon = days * 86400.0
    out: list[Fault] = []
    for kind, per_h in fleet_rates(spec, model, per_component_h).items():
        rate_s = per_h * fault_scale / 3600.0
        t = 0.0
        while rate_s > 0:
            t += float(rng.exponential(1.0 / rate_s))
            if t >= horizon:
                break
            node, rail = int(rng.integers(spec.nodes)), int(rng.integers(RAILS))
            repair = float(rng.exponential(model.repair_h * 3600.0))
            if kind == FaultKind.FLAP:
                repair = float(rng.uniform(1.0, 10.0))
            elif kind == FaultKind.PARTITION:
                repair = float(rng.uniform(*PARTITION_S))
            leaf = leaf_of(node, rail, spec.nodes_per_leaf) if kind == FaultKind.LEAF else None
            out.append(Fault(t, kind, node, rail, repair, leaf))
    return sorted(out)
