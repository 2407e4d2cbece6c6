"""Fabric health derived from evidence, pure: what is broken now, and when each part clears.

A component (a link = node/device/port, an RNIC, a fabric switch, a GPU, a
node) is healthy unless some evidence says otherwise. Each kind of evidence
has its own clearing rule, and the rule is a function of the evidence and the
time alone, so every replica reaches the same answer at the same `now`:

- a link down (or an RNIC fatal error) clears when the port is up again and
  has stayed up for the damping period;
- CQE, counter and PCIe faults clear after a quiet period with the port
  ACTIVE and no new error;
- a quarantine (a port that flapped too often, or an operator's flag) clears
  only when an operator clears it;
- a topology loss (a GPU or RNIC gone from a registration) clears when the
  node registers it again;
- an inferred switch failure clears when one of its links comes back;
- planned maintenance counts from its start until its end.

Every fault can also be closed at once by an operator (a resolve).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from scheduler_svc.engine.paths import FailedSet

# Fault.port of a fault that takes the whole RNIC rather than one port.
WHOLE_DEVICE = 0


class FaultKind(enum.StrEnum):
    LINK_DOWN = "link_down"
    RNIC_FATAL = "rnic_fatal"
    RETRY_EXCEEDED = "retry_exceeded"  # a CQE error that means the path is gone
    COUNTER_ERRORS = "counter_errors"
    PCIE_DEGRADED = "pcie_degraded"
    GPU_LOST = "gpu_lost"
    RNIC_LOST = "rnic_lost"
    UNREACHABLE = "unreachable"  # commands to the node went unacknowledged


class ClearRule(enum.StrEnum):
    PORT_UP_DAMPED = "port_up_damped"
    QUIET = "quiet"
    REGISTERED = "registered"
    OPERATOR = "operator"


CLEAR_RULE: dict[FaultKind, ClearRule] = {
    FaultKind.LINK_DOWN: ClearRule.PORT_UP_DAMPED,
    FaultKind.RNIC_FATAL: ClearRule.PORT_UP_DAMPED,
    FaultKind.RETRY_EXCEEDED: ClearRule.QUIET,
    FaultKind.COUNTER_ERRORS: ClearRule.QUIET,
    FaultKind.PCIE_DEGRADED: ClearRule.QUIET,
    FaultKind.GPU_LOST: ClearRule.REGISTERED,
    FaultKind.RNIC_LOST: ClearRule.REGISTERED,
    FaultKind.UNREACHABLE: ClearRule.OPERATOR,
}


class Health(enum.StrEnum):
    FAILED = "failed"
    RECOVERING = "recovering"  # the cause went away; waiting out damping or quiet
    HEALTHY = "healthy"


@dataclass(frozen=True, slots=True)
class ClearingRules:
    damping_s: float
    quiet_s: float


@dataclass(frozen=True, slots=True)
class FaultEvidence:
    """An open fault as the store holds it, with what its clearing rule needs."""

    id: int
    node: str
    device: str
    port: int  # WHOLE_DEVICE for the whole RNIC; the GPU index for a lost GPU
    kind: FaultKind
    opened_at: datetime
    # When the port was seen up again (port_up), for PORT_UP_DAMPED faults.
    recovered_at: datetime | None = None
    # The newest error on the component, for QUIET faults.
    last_error_at: datetime | None = None
    port_active: bool = True
    switch: str | None = None
    note: str = ""  # what the service recorded about it (why a node is unreachable)

    @property
    def label(self) -> str:
        if self.kind == FaultKind.GPU_LOST:
            return f"{self.node}/gpu{self.port}"
        if self.kind == FaultKind.UNREACHABLE:
            return self.node
        if self.port == WHOLE_DEVICE:
            return f"{self.node}/{self.device}"
        return f"{self.node}/{self.device}/{self.port}"


@dataclass(frozen=True, slots=True)
class SwitchEvidence:
    id: int
    switch: str
    opened_at: datetime
    reason: str


@dataclass(frozen=True, slots=True)
class Quarantine:
    """A port kept out of service until an operator clears it (flapping, or flagged)."""

    id: int
    node: str
    device: str
    port: int
    since: datetime
    reason: str


@dataclass(frozen=True, slots=True)
class Maintenance:
    """A planned window on a link, an RNIC (port 0), a switch (node None) or a node."""

    id: int
    starts_at: datetime
    ends_at: datetime
    node: str | None = None
    device: str | None = None
    port: int = WHOLE_DEVICE
    switch: str | None = None

    def active(self, now: datetime) -> bool:
        return self.starts_at <= now < self.ends_at


@dataclass(frozen=True, slots=True)
class FaultHealth:
    fault: FaultEvidence
    health: Health
    reason: str
    # When a RECOVERING fault turns HEALTHY if nothing new happens.
    clears_at: datetime | None = None


def fault_health(f: FaultEvidence, now: datetime, rules: ClearingRules) -> FaultHealth:
    """The fault's health at `now` under its kind's clearing rule."""
    rule = CLEAR_RULE[f.kind]
    if rule == ClearRule.PORT_UP_DAMPED:
        if f.recovered_at is None:
            return FaultHealth(f, Health.FAILED, "port is down")
        ready = f.recovered_at + timedelta(seconds=rules.damping_s)
        if now < ready:
            return FaultHealth(
                f, Health.RECOVERING, f"up again, damping {rules.damping_s:g} s", ready
            )
        return FaultHealth(f, Health.HEALTHY, f"up and quiet for {rules.damping_s:g} s", ready)
    if rule == ClearRule.QUIET:
        if not f.port_active:
            return FaultHealth(f, Health.FAILED, "port is not ACTIVE")
        since = max(x for x in (f.opened_at, f.last_error_at) if x is not None)
        ready = since + timedelta(seconds=rules.quiet_s)
        if now < ready:
            return FaultHealth(
                f, Health.RECOVERING, f"port ACTIVE, quiet period {rules.quiet_s:g} s", ready
            )
        return FaultHealth(
            f, Health.HEALTHY, f"port ACTIVE and no new error for {rules.quiet_s:g} s", ready
        )
    if rule == ClearRule.REGISTERED:
        return FaultHealth(f, Health.FAILED, "missing from the node's registration")
    return FaultHealth(f, Health.FAILED, "until an operator resolves it")


@dataclass(frozen=True, slots=True)
class Evidence:
    """Everything known about the fabric's health, as of one read of the store."""

    faults: tuple[FaultEvidence, ...] = ()
    switches: tuple[SwitchEvidence, ...] = ()
    quarantines: tuple[Quarantine, ...] = ()
    maintenance: tuple[Maintenance, ...] = ()


@dataclass(frozen=True, slots=True)
class Unhealthy:
    """One piece of evidence that takes components out of service now."""

    key: str  # stable id: fault:<id>, switch:<id>, flag:<id>, maintenance:<id>
    label: str
    kind: str
    since: datetime
    reason: str
    node: str | None = None
    device: str | None = None
    port: int | None = None
    switch: str | None = None


@dataclass(frozen=True, slots=True)
class FabricHealth:
    failed: FailedSet
    unhealthy: tuple[Unhealthy, ...]
    # Faults whose clearing rule is satisfied: the store closes them.
    cleared: tuple[FaultHealth, ...]
    # The earliest time a RECOVERING fault clears (a deadline to come back at).
    next_change_at: datetime | None = None
    healths: dict[int, FaultHealth] = field(default_factory=dict)


def assess(evidence: Evidence, now: datetime, rules: ClearingRules) -> FabricHealth:
    """What is out of service at `now`, and which faults have cleared."""
    rnics: set[tuple[str, str]] = set()
    links: set[tuple[str, str, int]] = set()
    gpus: set[tuple[str, int]] = set()
    switches: set[str] = set()
    unhealthy: list[Unhealthy] = []
    cleared: list[FaultHealth] = []
    healths: dict[int, FaultHealth] = {}
    next_change: datetime | None = None
    for f in evidence.faults:
        h = fault_health(f, now, rules)
        healths[f.id] = h
        if h.health == Health.HEALTHY:
            cleared.append(h)
            continue
        if h.clears_at is not None and (next_change is None or h.clears_at < next_change):
            next_change = h.clears_at
        if f.kind == FaultKind.GPU_LOST:
            gpus.add((f.node, f.port))
        elif f.kind == FaultKind.UNREACHABLE:
            rnics.add((f.node, "*"))
        elif f.port == WHOLE_DEVICE:
            rnics.add((f.node, f.device))
        else:
            links.add((f.node, f.device, f.port))
        unhealthy.append(
            Unhealthy(
                f"fault:{f.id}",
                f.label,
                f.kind.value,
                f.opened_at,
                f.note if f.kind == FaultKind.UNREACHABLE and f.note else h.reason,
                f.node,
                f.device,
                f.port,
                f.switch,
            )
        )
    for s in evidence.switches:
        switches.add(s.switch)
        unhealthy.append(
            Unhealthy(f"switch:{s.id}", s.switch, "switch", s.opened_at, s.reason, switch=s.switch)
        )
    for q in evidence.quarantines:
        links.add((q.node, q.device, q.port))
        unhealthy.append(
            Unhealthy(
                f"flag:{q.id}",
                f"{q.node}/{q.device}/{q.port}",
                "quarantine",
                q.since,
                q.reason,
                q.node,
                q.device,
                q.port,
            )
        )
    for w in evidence.maintenance:
        if not w.active(now):
            if w.starts_at > now and (next_change is None or w.starts_at < next_change):
                next_change = w.starts_at
            continue
        if w.ends_at and (next_change is None or w.ends_at < next_change):
            next_change = w.ends_at
        if w.switch is not None:
            switches.add(w.switch)
        elif w.node is not None and w.device is None:
            rnics.add((w.node, "*"))
        elif w.node is not None and w.device is not None:
            if w.port == WHOLE_DEVICE:
                rnics.add((w.node, w.device))
            else:
                links.add((w.node, w.device, w.port))
        unhealthy.append(
            Unhealthy(
                f"maintenance:{w.id}",
                w.switch or f"{w.node}/{w.device or '*'}",
                "maintenance",
                w.starts_at,
                f"planned maintenance until {w.ends_at.isoformat()}",
                w.node,
                w.device,
                w.port,
                w.switch,
            )
        )
    return FabricHealth(
        failed=FailedSet(
            rnics=frozenset(rnics),
            links=frozenset(links),
            switches=frozenset(switches),
            gpus=frozenset(gpus),
        ),
        unhealthy=tuple(sorted(unhealthy, key=lambda u: (u.since, u.key))),
        cleared=tuple(cleared),
        next_change_at=next_change,
        healths=healths,
    )


def touching(unhealthy: Iterable[Unhealthy], nodes: set[str]) -> list[Unhealthy]:
    """Evidence on any of `nodes`, plus every switch-wide piece (its links may be theirs)."""
    return [u for u in unhealthy if u.node is None or u.node in nodes]
