"""Fabric health derived from evidence, pure: what is broken now, and when each part clears.

A component (a link = node/device/port, an RNIC, a fabric switch, a GPU, a
node) is healthy unless some evidence says otherwise. Each kind of evidence
has its own clearing rule, and the rule is a function of the evidence and the
time alone, so every replica reaches the same answer at the same `now`:

- a link down (or an RNIC fatal error) clears when the port is up again and
  has stayed up for the damping period; the port's level (its newest observed
  state, by observation time) decides, so a fault whose port's newest report is
  DOWN is failed whatever came before;
- CQE, counter and PCIe faults clear after a quiet period with the port
  ACTIVE and no new error;
- a degradation (a port rate below its registered rate, a PCIe link trained below its
  maximum, error counters rising above their limit) takes nothing out of service: it
  says what share of its bandwidth the part has left (`FabricHealth.degraded`), for as
  long as its level still shows it and then for the quiet period;
- a quarantine (a port that flapped too often, or an operator's flag) clears
  only when an operator clears it;
- a topology loss (a GPU or RNIC gone from a registration) clears when the
  node registers it again;
- a node unreachable (commands to it went unacknowledged, or its ranks could not
  move) clears when its agent is heard from again: a poll, a stream opened, an
  acknowledgement (`recovered_at` is when);
- an inferred switch failure clears when the port faults on it (the evidence that
  made it, and any since) have all cleared, each by its own damped rule;
- planned maintenance counts from a lead time before its start (so jobs move
  before anything breaks) until its end, and clears after the damping period
  once its window had started (a cancelled window that never started clears at
  once).

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
    DEGRADED = "degraded"  # works at part of its bandwidth: rebalanced, not failed over


class ClearRule(enum.StrEnum):
    PORT_UP_DAMPED = "port_up_damped"
    QUIET = "quiet"
    REGISTERED = "registered"
    CONTACT = "contact"  # the node's agent was heard from again


CLEAR_RULE: dict[FaultKind, ClearRule] = {
    FaultKind.LINK_DOWN: ClearRule.PORT_UP_DAMPED,
    FaultKind.RNIC_FATAL: ClearRule.PORT_UP_DAMPED,
    FaultKind.RETRY_EXCEEDED: ClearRule.QUIET,
    FaultKind.COUNTER_ERRORS: ClearRule.QUIET,
    FaultKind.PCIE_DEGRADED: ClearRule.QUIET,
    FaultKind.GPU_LOST: ClearRule.REGISTERED,
    FaultKind.RNIC_LOST: ClearRule.REGISTERED,
    FaultKind.UNREACHABLE: ClearRule.CONTACT,
    FaultKind.DEGRADED: ClearRule.QUIET,
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
    # When the port was seen up again (port_up), for PORT_UP_DAMPED faults; when the
    # node's agent was heard from again, for CONTACT faults.
    recovered_at: datetime | None = None
    # The newest error on the component, for QUIET faults.
    last_error_at: datetime | None = None
    # The port's level: whether its newest observed state is ACTIVE, and when that was
    # observed (None: as registered, never reported).
    port_active: bool = True
    port_since: datetime | None = None
    switch: str | None = None
    note: str = ""  # what the service recorded about it (why a node is unreachable)
    # DEGRADED: the share of its bandwidth the part has left, and whether a level (the
    # port's rate, the PCIe link) still shows the degradation; `recovered_at` is when the
    # last such level was seen restored. `note` is the measured figure.
    share: float = 1.0
    degraded_level: bool = False

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


class MaintenancePhase(enum.StrEnum):
    SCHEDULED = "scheduled"  # announced; jobs still on their primaries
    MOVING = "moving"  # the lead time: jobs on the target move to their backups
    ACTIVE = "active"  # the window is open: the target may be taken down
    ENDED = "ended"  # over or cancelled; still out of service for the damping period
    DONE = "done"  # cleared: jobs fail back


# Phases in which the target carries no traffic.
OUT_OF_SERVICE = frozenset(
    {MaintenancePhase.MOVING, MaintenancePhase.ACTIVE, MaintenancePhase.ENDED}
)


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
    # When its jobs start moving off the target (starts_at less the lead time).
    moves_at: datetime | None = None
    cancelled_at: datetime | None = None
    reason: str = ""

    @property
    def until(self) -> datetime:
        """When the window ends: its end, or its cancellation if that came first."""
        if self.cancelled_at is not None and self.cancelled_at < self.ends_at:
            return self.cancelled_at
        return self.ends_at

    def _marks(self, damping_s: float) -> tuple[datetime, datetime, datetime, datetime]:
        moves = min(self.moves_at or self.starts_at, self.starts_at)
        until = self.until
        # Damping only for a target that may have been worked on (its window opened).
        settle = damping_s if until > self.starts_at else 0.0
        return moves, self.starts_at, until, until + timedelta(seconds=settle)

    def phase(self, now: datetime, damping_s: float = 0.0) -> MaintenancePhase:
        moves, starts, until, clears = self._marks(damping_s)
        if until <= moves:  # cancelled before anything moved
            return MaintenancePhase.DONE if now >= until else MaintenancePhase.SCHEDULED
        if now < moves:
            return MaintenancePhase.SCHEDULED
        if now < until:
            return MaintenancePhase.MOVING if now < starts else MaintenancePhase.ACTIVE
        return MaintenancePhase.ENDED if now < clears else MaintenancePhase.DONE

    def next_change(self, now: datetime, damping_s: float = 0.0) -> datetime | None:
        """The next time its phase can change without anything new happening."""
        moves, starts, until, clears = self._marks(damping_s)
        marks = (until,) if until <= moves else (moves, starts, until, clears)
        # Nothing changes after it has cleared (a start after its cancellation is no change).
        return min((t for t in marks if now < t <= clears), default=None)

    def active(self, now: datetime, damping_s: float = 0.0) -> bool:
        return self.phase(now, damping_s) in OUT_OF_SERVICE

    @property
    def label(self) -> str:
        if self.switch is not None:
            return self.switch
        if self.device is None:
            return str(self.node)
        if self.port == WHOLE_DEVICE:
            return f"{self.node}/{self.device}"
        return f"{self.node}/{self.device}/{self.port}"


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
        # The level decides: a fault cannot be recovering while its port's newest report
        # is DOWN, whatever up came before it.
        if f.recovered_at is None or not f.port_active:
            return FaultHealth(f, Health.FAILED, "port is down")
        ready = f.recovered_at + timedelta(seconds=rules.damping_s)
        if now < ready:
            return FaultHealth(
                f, Health.RECOVERING, f"up again, damping {rules.damping_s:g} s", ready
            )
        return FaultHealth(f, Health.HEALTHY, f"up and quiet for {rules.damping_s:g} s", ready)
    if rule == ClearRule.QUIET:
        if f.kind == FaultKind.DEGRADED and f.degraded_level:
            return FaultHealth(f, Health.FAILED, f"degraded: {f.note}")
        if not f.port_active:
            return FaultHealth(f, Health.FAILED, "port is not ACTIVE")
        # Quiet with the port ACTIVE: from the newest error, from the port's return, and
        # (a degradation) from the level seen restored.
        marks: tuple[datetime | None, ...] = (f.opened_at, f.last_error_at, f.port_since)
        if f.kind == FaultKind.DEGRADED:
            marks += (f.recovered_at,)
        since = max(x for x in marks if x is not None)
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
    # CONTACT, without damping: a node that answers is reachable (what its ranks carry
    # fails back damped, by the rules of its own evidence).
    if f.recovered_at is None or f.recovered_at < f.opened_at:
        return FaultHealth(f, Health.FAILED, "until its agent polls or acknowledges again")
    return FaultHealth(f, Health.HEALTHY, "its agent was heard from again", f.recovered_at)


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
    # A recovering fault: when it clears if nothing new happens (its cause is gone).
    clears_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Degraded:
    """A part that works at part of its bandwidth (a DEGRADED fault not yet cleared)."""

    key: str  # fault:<id>
    label: str
    share: float  # of its bandwidth left, 0 to 1
    figure: str  # what was measured, for the decision's reason
    restored: bool = False  # the level is back; waiting out the quiet period


@dataclass(frozen=True, slots=True)
class FabricHealth:
    failed: FailedSet
    unhealthy: tuple[Unhealthy, ...]
    # Faults whose clearing rule is satisfied: the store closes them.
    cleared: tuple[FaultHealth, ...]
    # The earliest time a RECOVERING fault clears (a deadline to come back at).
    next_change_at: datetime | None = None
    healths: dict[int, FaultHealth] = field(default_factory=dict)
    # Maintenance windows announced but not yet moving jobs: nothing is out of service for
    # them yet, but a restart decided now knows of them.
    scheduled: tuple[Unhealthy, ...] = ()
    # (node, device, port) -> the degradation of that port (port 0: every port of the RNIC).
    degraded: dict[tuple[str, str, int], Degraded] = field(default_factory=dict)


def assess(evidence: Evidence, now: datetime, rules: ClearingRules) -> FabricHealth:
    """What is out of service at `now`, and which faults have cleared."""
    out = _OutOfService()
    for f in evidence.faults:
        out.fault(f, fault_health(f, now, rules))
    for s in evidence.switches:
        out.switches.add(s.switch)
        out.unhealthy.append(
            Unhealthy(f"switch:{s.id}", s.switch, "switch", s.opened_at, s.reason, switch=s.switch)
        )
    for q in evidence.quarantines:
        out.quarantine(q)
    for w in evidence.maintenance:
        out.window(w, now, rules)
    return FabricHealth(
        failed=FailedSet(
            rnics=frozenset(out.rnics),
            links=frozenset(out.links),
            switches=frozenset(out.switches),
            gpus=frozenset(out.gpus),
        ),
        unhealthy=tuple(sorted(out.unhealthy, key=lambda u: (u.since, u.key))),
        scheduled=tuple(out.scheduled),
        cleared=tuple(out.cleared),
        next_change_at=out.next_change,
        healths=out.healths,
        degraded=out.degraded,
    )


@dataclass(slots=True)
class _OutOfService:
    """What `assess` gathers, one piece of evidence at a time."""

    rnics: set[tuple[str, str]] = field(default_factory=set)
    links: set[tuple[str, str, int]] = field(default_factory=set)
    gpus: set[tuple[str, int]] = field(default_factory=set)
    switches: set[str] = field(default_factory=set)
    unhealthy: list[Unhealthy] = field(default_factory=list)
    scheduled: list[Unhealthy] = field(default_factory=list)
    cleared: list[FaultHealth] = field(default_factory=list)
    healths: dict[int, FaultHealth] = field(default_factory=dict)
    degraded: dict[tuple[str, str, int], Degraded] = field(default_factory=dict)
    next_change: datetime | None = None

    def fault(self, f: FaultEvidence, h: FaultHealth) -> None:
        self.healths[f.id] = h
        if h.health == Health.HEALTHY:
            self.cleared.append(h)
            return
        if h.clears_at is not None and (self.next_change is None or h.clears_at < self.next_change):
            self.next_change = h.clears_at
        if f.kind == FaultKind.GPU_LOST:
            self.gpus.add((f.node, f.port))
        elif f.kind == FaultKind.UNREACHABLE:
            self.rnics.add((f.node, "*"))
        elif f.kind == FaultKind.DEGRADED:
            # In service at part of its bandwidth: the weakest degradation of a part counts.
            was = self.degraded.get((f.node, f.device, f.port))
            if was is None or f.share < was.share:
                self.degraded[(f.node, f.device, f.port)] = Degraded(
                    f"fault:{f.id}", f.label, f.share, f.note, h.health == Health.RECOVERING
                )
        elif f.port == WHOLE_DEVICE:
            self.rnics.add((f.node, f.device))
        else:
            self.links.add((f.node, f.device, f.port))
        self.unhealthy.append(
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
                h.clears_at if h.health == Health.RECOVERING else None,
            )
        )

    def quarantine(self, q: Quarantine) -> None:
        self.links.add((q.node, q.device, q.port))
        self.unhealthy.append(
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

    def window(self, w: Maintenance, now: datetime, rules: ClearingRules) -> None:
        phase = w.phase(now, rules.damping_s)
        change = w.next_change(now, rules.damping_s)
        if change is not None and (self.next_change is None or change < self.next_change):
            self.next_change = change
        if phase == MaintenancePhase.SCHEDULED:
            self.scheduled.append(_window(w, f"planned maintenance {w.id} ({w.reason}) scheduled"))
        if phase not in OUT_OF_SERVICE:
            return
        if w.switch is not None:
            self.switches.add(w.switch)
        elif w.node is not None and w.device is None:
            self.rnics.add((w.node, "*"))
        elif w.node is not None and w.device is not None:
            if w.port == WHOLE_DEVICE:
                self.rnics.add((w.node, w.device))
            else:
                self.links.add((w.node, w.device, w.port))
        window = f"{w.starts_at.isoformat(timespec='seconds')} to "
        window += w.ends_at.isoformat(timespec="seconds")
        reason = f"planned maintenance {w.id} ({w.reason}) from {window}"
        if phase == MaintenancePhase.ENDED:
            reason = f"planned maintenance {w.id} ({w.reason}) over, damping {rules.damping_s:g} s"
        self.unhealthy.append(_window(w, reason))


def _window(w: Maintenance, reason: str) -> Unhealthy:
    return Unhealthy(
        f"maintenance:{w.id}",
        w.label,
        "maintenance",
        w.moves_at or w.starts_at,
        reason,
        w.node,
        w.device,
        w.port,
        w.switch,
    )


def touching(unhealthy: Iterable[Unhealthy], nodes: set[str]) -> list[Unhealthy]:
    """Evidence on any of `nodes`, plus every switch-wide piece (its links may be theirs)."""
    return [u for u in unhealthy if u.node is None or u.node in nodes]
