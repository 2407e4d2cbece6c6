"""What stock NCCL does by itself when an RNIC fails: its failover domain, modelled.

NCCL (>= 2.29.7, with NCCL_IB_RESILIENCY_PORT_FAILOVER=1) runs each GPU's
traffic over a *virtual NIC* that may merge several devices. When one device
of a virtual NIC fails, NCCL moves its traffic to the healthy partners and the
job runs on at reduced bandwidth; Railover sends it nothing. When every device
of a virtual NIC is lost (two of a merged pair, or the one device of a virtual
NIC that merges nothing), or port failover is off or unsupported, NCCL aborts
the communicator: only a restart (or a restart without the node) is left.
From 2.30 NCCL also recovers a port that comes back (fail-back); before, the job
keeps its partner device until it restarts.

Pure: plain values in, an assessment with a reason out; no store, clock or I/O.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from scheduler_svc.engine.paths import FailedSet, NodeTopology
from scheduler_svc.engine.routes import RankRoute

PORT_FAILOVER_SINCE = (2, 29, 7)
PORT_RECOVERY_SINCE = (2, 30, 0)

_VERSION = re.compile(r"^(\d{1,3})\.(\d{1,3})(?:\.(\d{1,3}))?$")


def parse_version(text: str) -> tuple[int, int, int]:
    """ "2.29.7" -> (2, 29, 7); "2.30" -> (2, 30, 0)."""
    m = _VERSION.match(text)
    if m is None:
        raise ValueError(f"NCCL version {text!r} is not MAJOR.MINOR[.PATCH]")
    return int(m[1]), int(m[2]), int(m[3] or 0)


@dataclass(frozen=True, slots=True)
class NcclSpec:
    """The job's NCCL: its version, whether port failover is on, how it merges devices."""

    version: tuple[int, int, int]
    port_failover: bool
    merge: str = "explicit"  # explicit | rail | pcie_switch
    merged_nics: tuple[frozenset[str], ...] = ()

    @classmethod
    def from_declaration(cls, ccl: Mapping[str, object]) -> NcclSpec:
        """From a job's stored ``ccl`` declaration (api.schemas.jobs.CclIn as JSON)."""
        groups = ccl.get("merged_nics") or []
        assert isinstance(groups, list)
        return cls(
            version=parse_version(str(ccl["version"])),
            port_failover=bool(ccl.get("port_failover", False)),
            merge=str(ccl.get("merge", "explicit")),
            merged_nics=tuple(frozenset(str(d) for d in g) for g in groups),
        )

    @property
    def fails_over(self) -> bool:
        """NCCL itself moves a failed device's traffic to its virtual NIC's partners."""
        return self.port_failover and self.version >= PORT_FAILOVER_SINCE

    @property
    def recovers_ports(self) -> bool:
        """NCCL itself moves traffic back to a device whose port came back."""
        return self.fails_over and self.version >= PORT_RECOVERY_SINCE

    def describe(self) -> str:
        v = ".".join(map(str, self.version))
        if self.fails_over:
            return f"NCCL {v} with port failover"
        if self.port_failover:
            return f"NCCL {v} (port failover needs {'.'.join(map(str, PORT_FAILOVER_SINCE))})"
        return f"NCCL {v} without port failover"


@dataclass(frozen=True, slots=True)
class Device:
    """One RNIC port of a node as NCCL sees it, and whether it works now."""

    name: str
    healthy: bool
    rail: int | None = None
    pcie_switch: str | None = None


@dataclass(frozen=True, slots=True)
class RankDevice:
    """The device NCCL picked for a rank's GPU (the nearest RNIC)."""

    rank: int
    node: str
    device: str


def virtual_nics(spec: NcclSpec, devices: Sequence[Device]) -> tuple[frozenset[str], ...]:
    """A node's virtual NICs under the spec's merge policy; an unmerged device stands alone."""
    present = {d.name for d in devices}
    groups: list[frozenset[str]] = []
    if spec.merge == "explicit":
        groups = [g & present for g in spec.merged_nics if g & present]
    else:
        by: dict[object, set[str]] = {}
        for d in devices:
            key = d.rail if spec.merge == "rail" else d.pcie_switch
            if key is not None:
                by.setdefault(key, set()).add(d.name)
        groups = [frozenset(g) for _, g in sorted(by.items(), key=lambda kv: str(kv[0]))]
    grouped = set().union(*groups) if groups else set()
    groups += [frozenset({d}) for d in sorted(present - grouped)]
    return tuple(groups)


class Outcome(enum.StrEnum):
    UNTOUCHED = "untouched"  # no rank's virtual NIC lost a device
    FAILS_OVER = "fails_over"  # NCCL runs on the healthy partners, degraded
    FATAL = "fatal"  # some virtual NIC has nothing left: NCCL aborts


@dataclass(frozen=True, slots=True)
class VnicState:
    node: str
    members: tuple[str, ...]
    failed: tuple[str, ...]
    outcome: Outcome
    ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class NcclAssessment:
    outcome: Outcome
    vnics: tuple[VnicState, ...]  # only those that lost a device and carry a rank
    degraded_ranks: tuple[int, ...]
    fatal_ranks: tuple[int, ...]
    bandwidth_left: float  # the worst touched virtual NIC's healthy share, 1.0 if none
    reason: str

    @property
    def path_available(self) -> bool:
        """Running on (degraded) is an option: NCCL keeps every communicator alive."""
        return self.outcome != Outcome.FATAL

    @property
    def affected(self) -> bool:
        return self.outcome != Outcome.UNTOUCHED

    @property
    def actions(self) -> tuple[str, ...]:
        """What Railover may choose; it sends NCCL no path commands either way."""
        if self.outcome == Outcome.FATAL:
            return ("restart", "restart_scaled")
        if self.outcome == Outcome.FAILS_OVER:
            return ("failover", "restart", "restart_scaled")
        return ("none",)

    def record(self) -> dict[str, object]:
        """The decision plan's account of it."""
        return {
            "outcome": self.outcome.value,
            "degraded_ranks": list(self.degraded_ranks),
            "fatal_ranks": list(self.fatal_ranks),
            "bandwidth_left": round(self.bandwidth_left, 4),
            "virtual_nics": [
                {
                    "node": v.node,
                    "members": list(v.members),
                    "failed": list(v.failed),
                    "outcome": v.outcome.value,
                }
                for v in self.vnics
            ],
        }


def assess(
    spec: NcclSpec, nodes: Mapping[str, Sequence[Device]], ranks: Iterable[RankDevice]
) -> NcclAssessment:
    """What NCCL does about the failed devices of `nodes` for the job's `ranks`.

    `nodes` need hold only the nodes with a failed device: a rank elsewhere is
    untouched, so the work grows with the fault, not with the job.
    """
    vnic_of: dict[tuple[str, str], frozenset[str]] = {}
    health: dict[tuple[str, str], bool] = {}
    for node, devices in nodes.items():
        if all(d.healthy for d in devices):
            continue
        for d in devices:
            health[(node, d.name)] = d.healthy
        for group in virtual_nics(spec, devices):
            for name in group:
                vnic_of[(node, name)] = group
    touched: dict[tuple[str, frozenset[str]], list[int]] = {}
    for r in ranks:
        vnic = vnic_of.get((r.node, r.device))
        if vnic is not None and not all(health[(r.node, d)] for d in vnic):
            touched.setdefault((r.node, vnic), []).append(r.rank)
    states = []
    for (node, group), rank_list in sorted(
        touched.items(), key=lambda kv: (kv[0][0], sorted(kv[0][1]))
    ):
        members = tuple(sorted(group))
        failed = tuple(d for d in members if not health[(node, d)])
        survives = spec.fails_over and len(failed) < len(members)
        outcome = Outcome.FAILS_OVER if survives else Outcome.FATAL
        states.append(VnicState(node, members, failed, outcome, tuple(sorted(rank_list))))
    fatal = tuple(sorted(r for s in states if s.outcome == Outcome.FATAL for r in s.ranks))
    degraded = tuple(sorted(r for s in states if s.outcome == Outcome.FAILS_OVER for r in s.ranks))
    left = min(((len(s.members) - len(s.failed)) / len(s.members) for s in states), default=1.0)
    if fatal:
        outcome = Outcome.FATAL
    elif degraded:
        outcome = Outcome.FAILS_OVER
    else:
        outcome = Outcome.UNTOUCHED
    return NcclAssessment(outcome, tuple(states), degraded, fatal, left, _reason(spec, states))


def _reason(spec: NcclSpec, states: Sequence[VnicState]) -> str:
    name = spec.describe()
    if not states:
        return f"{name}: no rank's virtual NIC lost a device"
    worst = next((s for s in states if s.outcome == Outcome.FATAL), states[0])
    where = f"{worst.node} virtual NIC [{', '.join(worst.members)}]"
    lost = ", ".join(worst.failed)
    if worst.outcome == Outcome.FAILS_OVER:
        return (
            f"{name}: {where} lost {lost}; NCCL fails over to its healthy partner itself "
            f"({sum(len(s.ranks) for s in states)} rank(s) run degraded)"
        )
    if not spec.fails_over:
        why = "port failover is not active, so a lost device aborts the communicator"
    elif len(worst.members) == 1:
        why = "a virtual NIC of one device has no partner to fail over to"
    else:
        why = "every device of the virtual NIC is lost"
    return f"{name}: {where} lost {lost}; {why}: fatal inside NCCL, only a restart is left"


def assess_job(
    spec: NcclSpec,
    topologies: Mapping[str, NodeTopology],
    failed: FailedSet,
    routes: Iterable[RankRoute],
) -> NcclAssessment:
    """`assess` for a job's routed ranks under the fabric's failed set.

    Only nodes with a failed device (or one cabled to a failed switch) are
    looked at; a rank's device is its nearest RNIC, the s-Bond primary.
    """
    devices: dict[str, list[Device]] = {}
    for name, topo in topologies.items():
        by_name: dict[str, Device] = {}
        for r in topo.rnics:
            ok = failed.port_ok(name, r)
            seen = by_name.get(r.name)
            # A device with several ports counts as lost when any of them is.
            by_name[r.name] = Device(
                r.name, ok and (seen is None or seen.healthy), r.rail, r.pcie_switch
            )
        if not all(d.healthy for d in by_name.values()):
            devices[name] = list(by_name.values())
    ranks = [
        RankDevice(r.rank, r.node, r.primary.partition("/")[0])
        for r in routes
        if r.node in devices and r.primary
    ]
    return assess(spec, devices, ranks)


def failback_note(spec: NcclSpec, where: str) -> str:
    """What fail-back means for a stock-NCCL job: NCCL's own port recovery, or none."""
    if spec.recovers_ports:
        return (
            f"{spec.describe()} recovers {where} by itself (port recovery); recorded, no "
            "commands sent"
        )
    return (
        f"{where} is back, but {spec.describe()} has no port recovery (2.30+): its ranks stay "
        "on the partner device until the job restarts"
    )
