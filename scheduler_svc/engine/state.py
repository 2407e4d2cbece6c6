"""A job's state as the engine reads and writes it: the types every other engine module shares.

What one job looks like to `reconcile` (`JobState`, its checkpoints and FlowCheck
rebuild failures), the fabric as far as the job sees it (`FabricView`), the service's
settings (`Options`), the desired state stored with the job and compared on the next
pass (`Desired`, with its `Mode`), and what a pass returns (`Reconciled`, with the
`DecisionRecord` to store when the outcome changed).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from scheduler_svc.engine import decision as cost
from scheduler_svc.engine import nccl
from scheduler_svc.engine.fabric import Degraded, Unhealthy
from scheduler_svc.engine.paths import FailedSet, NodePlan, NodeTopology
from scheduler_svc.engine.routes import Connectivity

# The communicator a job that registered none is planned as: all its ranks, 8 channels.
IMPLICIT_COMM = 0
IMPLICIT_CHANNELS = 8


class Mode(enum.StrEnum):
    NORMAL = "normal"
    FAILED_OVER = "failed_over"
    RESTARTING = "restarting"


class Action(enum.StrEnum):
    FAILOVER = "failover"
    RESTART = "restart"
    RESTART_SCALED = "restart_scaled"
    NONE = "none"
    FAILBACK = "failback"
    # Channels reweighted by the bandwidth each RNIC has left; nobody moves.
    REBALANCE = "rebalance"


@dataclass(frozen=True, slots=True)
class CommSpec:
    comm_id: int
    channels: int
    ranks: tuple[int, ...] = ()  # empty: every rank of the job


@dataclass(frozen=True, slots=True)
class HeldBack:
    """A fail-back its ranks refused: they stay on their backup until it is tried again."""

    comm_id: int
    ranks: tuple[int, ...]  # the ranks the refused fail-back was returning
    since: datetime  # when it was refused
    why: str = ""


@dataclass(frozen=True, slots=True)
class Desired:
    """What the job should look like; stored with the job and compared on the next pass."""

    mode: Mode = Mode.NORMAL
    # rank -> the RNIC it uses instead of its primary
    moved: Mapping[int, str] = field(default_factory=dict)
    # comm_id -> channels disabled (DCR, balance); absent: none
    disabled: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    # comm_id -> each channel's share of the traffic (R²CCL balance); absent: even
    weights: Mapping[int, tuple[float, ...]] = field(default_factory=dict)
    # comm_id -> share of an allreduce the degraded node hands off (R²CCL-AllReduce)
    split: Mapping[int, float] = field(default_factory=dict)
    # comm_id -> rank -> node-local GPU it sends through over NVLink (NVL transit)
    transit: Mapping[int, Mapping[int, int]] = field(default_factory=dict)
    # Evidence keys the outcome accounts for (fault:<id>, switch:<id>, flag:<id>, ...).
    evidence: frozenset[str] = frozenset()
    k: float | None = None  # k the last cost decision used
    checkpoint_id: int | None = None  # newest checkpoint already re-decided at
    verdict: str | None = None  # "keep" or "restart" at that checkpoint
    mitigation: Mapping[int, str] = field(default_factory=dict)
    # FlowCheck: a normal checkpoint is wanted after this iteration (a checkpoint node
    # could not rebuild it); None once a newer checkpoint was reported. Not a path outcome.
    checkpoint_after: int | None = None
    # Optional mitigations the ranks refused (their failed acks, recorded by the service),
    # kept until the job restarts: comm_id -> why its ranks run s-Bond, never NVL transit;
    # and fail-backs refused, each tried again Options.failback_retry_s after it.
    no_transit: Mapping[int, str] = field(default_factory=dict)
    # comm_id -> why its ranks refused channel weights: its plans are DCR, never BALANCE.
    no_balance: Mapping[int, str] = field(default_factory=dict)
    held: tuple[HeldBack, ...] = ()
    # Evidence a restart was decided for; kept across incarnations, so the same evidence
    # restarts a job once: an incarnation placed back on it runs failed over.
    restarted_for: frozenset[str] = frozenset()

    def same_outcome(self, other: Desired) -> bool:
        return (
            self.mode == other.mode
            and dict(self.moved) == dict(other.moved)
            and {c: tuple(d) for c, d in self.disabled.items() if d}
            == {c: tuple(d) for c, d in other.disabled.items() if d}
            and self.channel_plan() == other.channel_plan()
        )

    def channel_plan(
        self,
    ) -> tuple[dict[int, tuple[float, ...]], dict[int, float], dict[int, dict[int, int]]]:
        """Weights, split and transit, normalised for comparison."""
        return (
            {c: tuple(w) for c, w in self.weights.items() if w},
            {c: x for c, x in self.split.items() if x},
            {c: dict(t) for c, t in self.transit.items() if t},
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "moved": {str(r): k for r, k in sorted(self.moved.items())},
            "disabled": {str(c): list(d) for c, d in sorted(self.disabled.items()) if d},
            "evidence": sorted(self.evidence),
            "k": self.k,
            "checkpoint_id": self.checkpoint_id,
            "verdict": self.verdict,
            "mitigation": {str(c): m for c, m in sorted(self.mitigation.items())},
            "weights": {str(c): list(w) for c, w in sorted(self.weights.items()) if w},
            "split": {str(c): x for c, x in sorted(self.split.items()) if x},
            "transit": {
                str(c): {str(r): g for r, g in sorted(t.items())}
                for c, t in sorted(self.transit.items())
                if t
            },
            "checkpoint_after": self.checkpoint_after,
        } | self._refusals_json()

    def _refusals_json(self) -> dict[str, Any]:
        """The refusals, only where there are some: most jobs never store one."""
        out: dict[str, Any] = {}
        if self.no_transit:
            out["no_transit"] = {str(c): why for c, why in sorted(self.no_transit.items())}
        if self.no_balance:
            out["no_balance"] = {str(c): why for c, why in sorted(self.no_balance.items())}
        if self.held:
            out["held"] = [
                {
                    "comm_id": h.comm_id,
                    "ranks": list(h.ranks),
                    "since": h.since.isoformat(),
                    "why": h.why,
                }
                for h in self.held
            ]
        if self.restarted_for:
            out["restarted_for"] = sorted(self.restarted_for)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Desired:
        if not data:
            return cls()
        return cls(
            mode=Mode(data.get("mode", Mode.NORMAL.value)),
            moved={int(r): str(k) for r, k in (data.get("moved") or {}).items()},
            disabled={int(c): tuple(d) for c, d in (data.get("disabled") or {}).items()},
            evidence=frozenset(data.get("evidence") or ()),
            k=data.get("k"),
            checkpoint_id=data.get("checkpoint_id"),
            verdict=data.get("verdict"),
            mitigation={int(c): str(m) for c, m in (data.get("mitigation") or {}).items()},
            weights={
                int(c): tuple(float(x) for x in w) for c, w in (data.get("weights") or {}).items()
            },
            split={int(c): float(x) for c, x in (data.get("split") or {}).items()},
            transit={
                int(c): {int(r): int(g) for r, g in t.items()}
                for c, t in (data.get("transit") or {}).items()
            },
            checkpoint_after=data.get("checkpoint_after"),
            no_transit={int(c): str(why) for c, why in (data.get("no_transit") or {}).items()},
            no_balance={int(c): str(why) for c, why in (data.get("no_balance") or {}).items()},
            held=tuple(
                HeldBack(
                    int(h["comm_id"]),
                    tuple(int(r) for r in h["ranks"]),
                    datetime.fromisoformat(h["since"]),
                    str(h.get("why", "")),
                )
                for h in data.get("held") or ()
            ),
            restarted_for=frozenset(data.get("restarted_for") or ()),
        )


# What clears every channel plan (restart, full fail-back, stock NCCL).
NO_PLAN: dict[str, Any] = {"weights": {}, "split": {}, "transit": {}}


@dataclass(frozen=True, slots=True)
class CheckpointSeen:
    id: int
    at: datetime
    received_at: datetime
    kind: str = "full"
    iteration: int | None = None


@dataclass(frozen=True, slots=True)
class MirrorFailureSeen:
    """A checkpoint node could not rebuild `iteration` from the mirrored traffic (FlowCheck)."""

    id: int
    iteration: int
    at: datetime
    # When the newest checkpoint below `iteration` (the last one rebuilt) was taken;
    # None when the job reported none with an iteration number.
    rebuilt_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class JobState:
    """Everything `reconcile` needs to know about one job, read from the store."""

    job_id: str
    mode: Mode
    ranks: tuple[tuple[int, str, int], ...]  # (rank, node, gpu)
    checkpoint_interval_s: float
    reload_s: float
    detect_s: float
    timeout_s: float
    last_checkpoint_at: datetime
    communicators: tuple[CommSpec, ...] = ()
    slowdown_k: float | None = None  # k the job reported
    measured_k: float | None = None  # k the service measured from its iteration times
    comm_share: float | None = None
    dp_size: int = 1
    tp_size: int = 1
    pp_size: int = 1
    allow_scaling: bool = False
    spare_nodes: bool = True
    spares_free: int | None = None  # how many, where the fleet manager said
    node_replace_s: float = 0.0
    repair_estimate_s: float | None = None
    failed_over_at: datetime | None = None
    # When the restart was decided; None while restarting means the job was posted again.
    restart_decided_at: datetime | None = None
    # The pass that registers the job (none before it): what is broken then was broken
    # before the job started, so it starts on the paths left rather than re-deciding.
    registering: bool = False
    newest_checkpoint: CheckpointSeen | None = None
    previous: Desired = field(default_factory=Desired)
    # Stock NCCL (issue 16): it fails over inside its virtual NICs by itself and takes no
    # commands, so NCCL's own failover domain replaces the s-Bond path check.
    nccl: nccl.NcclSpec | None = None
    # GPU memory this job gives NVL transit on one GPU, MB; None: the service's setting.
    nvl_cap_mb: float | None = None
    # FlowCheck (issue 15): rebuild failures not yet known to be answered; the highest
    # iteration of a normal ("full") checkpoint, and when the newest normal one reported
    # without an iteration number was taken.
    mirror_failures: tuple[MirrorFailureSeen, ...] = ()
    full_checkpoint_iteration: int | None = None
    full_checkpoint_unnumbered_at: datetime | None = None


def open_mirror_failures(job: JobState) -> tuple[MirrorFailureSeen, ...]:
    """Rebuild failures no newer normal checkpoint answers yet, oldest iteration first.

    A normal checkpoint answers a failure at iteration N when it is of a later
    iteration, or, reported without an iteration number, when it was taken after the
    failure. FlowCheck checkpoints of later iterations do not: they are rebuilt on top
    of the state iteration N never reached.
    """
    top, unnumbered = job.full_checkpoint_iteration, job.full_checkpoint_unnumbered_at

    def answered(f: MirrorFailureSeen) -> bool:
        if top is not None and top > f.iteration:
            return True
        return unnumbered is not None and unnumbered > f.at

    return tuple(
        sorted((f for f in job.mirror_failures if not answered(f)), key=lambda f: f.iteration)
    )


def checkpoint_request(job: JobState) -> int | None:
    """The iteration a normal checkpoint must follow, while some rebuild failure is open."""
    still = open_mirror_failures(job)
    return still[-1].iteration if still else None


def usable_checkpoint_at(job: JobState) -> datetime:
    """When the newest checkpoint a restart could resume from was taken: t_elapsed's origin.

    Normally the newest reported one. After a rebuild failure at iteration N, and until a
    normal checkpoint newer than N, it is the last iteration rebuilt (the newest checkpoint
    below N): restart cost grows from there, whatever FlowCheck reported since.
    """
    still = open_mirror_failures(job)
    if not still:
        return job.last_checkpoint_at
    first = still[0]
    if first.rebuilt_at is not None:
        return min(job.last_checkpoint_at, first.rebuilt_at)
    # No checkpoint below N is known: iteration N-1, rebuilt, ended before N failed.
    return min(job.last_checkpoint_at, first.at)


@dataclass(frozen=True, slots=True)
class FabricView:
    """The fabric as far as one job sees it: its nodes' plans and what is out of service."""

    topologies: Mapping[str, NodeTopology]
    plans: Mapping[str, NodePlan]
    failed: FailedSet
    unhealthy: tuple[Unhealthy, ...] = ()
    # node -> (device, port) of its GPU-fabric ports, to tell a dead node from a dead link
    fabric_ports: Mapping[str, frozenset[tuple[str, int]]] = field(default_factory=dict)
    # Maintenance windows announced and not yet moving jobs (engine.fabric.FabricHealth).
    scheduled: tuple[Unhealthy, ...] = ()
    # Parts working at part of their bandwidth (engine.fabric.FabricHealth.degraded).
    degraded: Mapping[tuple[str, str, int], Degraded] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Options:
    default_k: tuple[float, ...] = (1.03, 1.20, 1.50)
    default_repair_s: float = 86400.0
    measured_k_tolerance: float = 0.02
    nvl_mb_per_channel: float = 40.0
    nvl_cap_mb: float = 512.0
    # A fail-back the ranks refused is tried again this long after (the damping period).
    failback_retry_s: float = 120.0
    # How faults are answered: the cost model, or a behaviour it is compared with.
    policy: cost.Policy = cost.Policy.RAILOVER
    # Spares kept for faults only a replacement fixes (decision.spare_usable).
    spare_reserve: int = 0
    # The fleet's rate of those faults, per hour: a spare's price (decision.spare_price_s).
    hard_failures_per_h: float = 0.0


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """A decision to store: what changed, why, and every number it rests on."""

    trigger: str
    action: Action
    reason: str
    inputs: dict[str, Any]
    costs_s: dict[str, float | None]
    costs_gpu_s: dict[str, float | None]
    plan: dict[str, Any]
    fault_key: str | None = None  # the evidence that caused it (fault:<id>, switch:<id>)
    # GPU time it saved against restarting (decision.saved_gpu_s, the one definition).
    saved_gpu_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Reconciled:
    desired: Desired
    decision: DecisionRecord | None
    conn: Connectivity
    warnings: tuple[str, ...] = ()


def comms_of(job: JobState) -> tuple[CommSpec, ...]:
    return job.communicators or (CommSpec(IMPLICIT_COMM, IMPLICIT_CHANNELS),)
