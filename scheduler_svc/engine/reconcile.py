"""A job's desired state under the fabric as it is, pure: `reconcile(now, job, fabric, options)`.

Every outcome of the fault lifecycle comes out of this one function: failover,
restart, restart with the node dropped, DCR, balance, NVL transit, fail-back
(whole or partial), staying on a quarantined backup and the re-decision at a
checkpoint or on a measured k. The service records evidence, calls it for each
job the evidence touches, stores the decision when there is one, and sends the
difference between the desired state and what it already commanded
(`command_diff`). Calling it again with nothing changed returns the same
desired state and no decision, so no command either.

The desired state is what a job should look like: its mode, the RNIC every
rank that is off its primary uses, and per communicator the channels that stay
disabled, the channel weights and allreduce split of R²CCL balance, and the
transit GPU of each rank sent over NVLink. A decision is produced only when that
changes (or when a checkpoint or a measured k changes the answer to "restart or keep
running degraded").
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from scheduler_svc.engine import coordination as coord
from scheduler_svc.engine import decision as cost
from scheduler_svc.engine import jobindex, layout, nccl
from scheduler_svc.engine.fabric import FaultKind, Unhealthy
from scheduler_svc.engine.paths import (
    Connectivity,
    FailedSet,
    NodePlan,
    NodeTopology,
    RankRoute,
    bandwidth_left,
    connectivity,
    route_ranks,
)
from scheduler_svc.engine.slowdown import estimate_k

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
_NO_PLAN: dict[str, Any] = {"weights": {}, "split": {}, "transit": {}}


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


# --- the function ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Pass:
    """One call's arguments and what every outcome below reads from them."""

    now: datetime
    job: JobState
    fabric: FabricView
    conn: Connectivity
    options: Options
    warnings: tuple[str, ...]
    evidence: tuple[Unhealthy, ...]


def routes_of(
    job: JobState, fabric: FabricView, index: jobindex.JobIndex | None = None
) -> Connectivity:
    """Every rank's route and the pairs left; from the ranks the faults touch given an index
    built for this job and these plans (the same answer, in O(touched ranks))."""
    if index is not None and index_fits(index, job, fabric):
        return jobindex.connectivity(index, fabric.failed, fabric.plans, fabric.topologies)
    return connectivity(route_ranks(job.ranks, fabric.plans, fabric.topologies, fabric.failed))


def index_for(job: JobState, fabric: FabricView) -> jobindex.JobIndex:
    """The job's index on the fabric's plans: built once per placement and plans, then kept."""
    return jobindex.build(job.ranks, fabric.plans, fabric.topologies, comms_of(job))


def index_fits(index: jobindex.JobIndex, job: JobState, fabric: FabricView) -> bool:
    """Whether `index` was built for this job's placement and communicators on these plans."""
    return index.fits(job.ranks, comms_of(job)) and index.built_on(fabric.plans, fabric.topologies)


def reconcile(
    now: datetime,
    job: JobState,
    fabric: FabricView,
    options: Options,
    index: jobindex.JobIndex | None = None,
) -> Reconciled:
    """The job's desired state at `now`, and the decision when the outcome changed.

    Beside the paths, the desired state says whether a normal checkpoint is wanted
    (a FlowCheck rebuild failure no newer checkpoint answers yet). With `index` (see
    `index_for`) a fault costs the ranks it touches; the answer is the same without.
    Optional mitigations the ranks refused are planned around (`refusals`): a
    communicator that refused NVL transit runs s-Bond only, and the ranks of a refused
    fail-back stay on their backup until it is tried again; neither is a restart.
    """
    no_transit, held = refusals(now, job, options)
    out = _reconcile_paths(now, job, _holding_back(job, fabric, held), options, index)
    out = _with_refusals(out, job, no_transit, held, options)
    wanted = checkpoint_request(job)
    if out.desired.checkpoint_after == wanted:
        return out
    return replace(out, desired=replace(out.desired, checkpoint_after=wanted))


# --- refused optional mitigations ---------------------------------------------------------------


def refusals(
    now: datetime, job: JobState, options: Options
) -> tuple[Mapping[int, str], tuple[HeldBack, ...]]:
    """The refusals in force at `now`: the communicators that run without NVL transit,
    and the fail-backs still held back (each until failback_retry_s after it was refused).

    None while the job restarts: its next incarnation is asked afresh.
    """
    if job.mode == Mode.RESTARTING:
        return {}, ()
    retry = timedelta(seconds=options.failback_retry_s)
    held = tuple(h for h in job.previous.held if now < h.since + retry)
    return job.previous.no_transit, held


def recheck_at(desired: Desired, options: Options) -> datetime | None:
    """When the job must be reconciled again though nothing else happens: the moment a
    refused fail-back is tried again."""
    retry = timedelta(seconds=options.failback_retry_s)
    return min((h.since + retry for h in desired.held), default=None)


def _holding_back(job: JobState, fabric: FabricView, held: Sequence[HeldBack]) -> FabricView:
    """The fabric with the primaries of ranks held on their backup counted failed, for
    this job alone: every outcome then reads as it did before the refused fail-back.
    A rank whose backup failed since is not held: it returns (held, it would have no path)."""
    if not held:
        return fabric
    wanted = {r for h in held for r in h.ranks}
    failed = fabric.failed
    links: set[tuple[str, str, int]] = set()
    for rank, node, gpu in job.ranks:
        plan, topo = fabric.plans.get(node), fabric.topologies.get(node)
        if rank not in wanted or plan is None or topo is None or not plan.has_gpu(gpu):
            continue
        paths = plan.for_gpu(gpu)
        if paths.primary is None or paths.backup is None or (node, gpu) in failed.gpus:
            continue
        if failed.port_ok(node, topo.rnic(paths.backup)):
            primary = topo.rnic(paths.primary)
            links.add((node, primary.name, primary.port))
    if links <= fabric.failed.links:
        return fabric
    return replace(fabric, failed=replace(fabric.failed, links=fabric.failed.links | links))


def _with_refusals(
    out: Reconciled,
    job: JobState,
    no_transit: Mapping[int, str],
    held: tuple[HeldBack, ...],
    options: Options,
) -> Reconciled:
    """The refusals carried into the desired state (dropped at a restart), and a decision
    that only follows one of them told as such."""
    desired = out.desired
    no_balance = {} if job.mode == Mode.RESTARTING else job.previous.no_balance
    if desired.mode == Mode.RESTARTING:
        no_transit, held, no_balance = {}, (), {}
    note = _refusal_note(out, job, no_transit, held, options)
    if (
        dict(desired.no_transit) == dict(no_transit)
        and dict(desired.no_balance) == dict(no_balance)
        and desired.held == held
        and note is None
    ):
        return out
    desired = replace(desired, no_transit=dict(no_transit), no_balance=dict(no_balance), held=held)
    if note is None or out.decision is None:
        return replace(out, desired=desired)
    trigger, reason = note
    return replace(
        out, desired=desired, decision=replace(out.decision, trigger=trigger, reason=reason)
    )


def _refusal_note(
    out: Reconciled,
    job: JobState,
    no_transit: Mapping[int, str],
    held: Sequence[HeldBack],
    options: Options,
) -> tuple[str, str] | None:
    """The trigger and reason of a failover that nothing new caused but a refusal: ranks
    kept on their backup, or a communicator's NVL transit given up."""
    d, prev, desired = out.decision, job.previous, out.desired
    if d is None or d.action != Action.FAILOVER or d.fault_key is not None:
        return None
    notes: list[tuple[str, str]] = []
    retry = timedelta(seconds=options.failback_retry_s)
    for h in held:
        kept = [r for r in h.ranks if r in desired.moved and r not in prev.moved]
        if kept:
            notes.append(
                (
                    f"refused:failback:{h.comm_id}",
                    f"fail-back refused ({h.why or 'no detail'}): {len(kept)} rank(s) of "
                    f"communicator {h.comm_id} stay on their backup; it is tried again at "
                    f"{(h.since + retry).isoformat()}",
                )
            )
    for c, why in sorted(prev.no_balance.items()):
        if prev.weights.get(c) and not desired.weights.get(c):
            notes.append(
                (
                    f"refused:balance:{c}",
                    f"channel weights refused by communicator {c}'s ranks ({why}): they "
                    "run the DCR plan, its channels on failed rails off, and are not asked "
                    "for weights again",
                )
            )
    nvl = coord.Mitigation.NVL.value
    for c, why in sorted(no_transit.items()):
        if prev.mitigation.get(c) == nvl and desired.mitigation.get(c) != nvl:
            notes.append(
                (
                    f"refused:nvl_transit:{c}",
                    f"NVL transit refused by communicator {c}'s ranks ({why}): they run "
                    "s-Bond only and are not asked again",
                )
            )
    if not notes:
        return None
    return notes[0][0], "; ".join(n for _, n in notes)


def _reconcile_paths(
    now: datetime,
    job: JobState,
    fabric: FabricView,
    options: Options,
    index: jobindex.JobIndex | None = None,
) -> Reconciled:
    conn = routes_of(job, fabric, index)
    if conn.index is not None and conn.index.plans is fabric.plans:
        warnings = conn.index.warnings
    else:
        warnings = tuple(w for n in sorted(fabric.plans) for w in fabric.plans[n].warnings)
    prev = job.previous
    new_life = False
    nodes = _nodes(job, conn)
    evidence = tuple(_evidence_for(conn, fabric, nodes))
    keys = frozenset(u.key for u in evidence)
    if job.mode == Mode.RESTARTING:
        cp = job.newest_checkpoint
        # No restart time while restarting: the next incarnation started (the service
        # clears it when the fleet manager posts the job again, or a checkpoint names it).
        if job.restart_decided_at is not None:
            # Aborted and waiting for the fleet manager: nothing is decided for the old
            # incarnation. What breaks meanwhile is known when the new one starts (it
            # starts on the paths left).
            return Reconciled(replace(prev, evidence=keys), None, conn, warnings)
        # The new incarnation starts with every rank on its primary; evidence that was
        # known at the restart is not news to it, and what a restart was decided for
        # is not restarted for again.
        prev = Desired(
            evidence=prev.evidence,
            k=prev.k,
            checkpoint_id=cp.id if cp else None,
            # Back on what it was restarted for, it runs degraded: that is decided.
            verdict="keep" if prev.restarted_for else None,
            restarted_for=prev.restarted_for,
        )
        new_life = True

    # A switch inferred failed is one failure with its ports' faults: restarted for one of
    # them, the job was restarted for all of it, whichever was reported first.
    prev = replace(prev, restarted_for=_one_failure(prev.restarted_for, evidence))
    fresh = job.registering and not new_life and bool(keys)
    if fresh:
        # What broke before the job was registered is no news to it.
        prev = replace(prev, evidence=keys)
    p = _Pass(now, job, fabric, conn, options, warnings, evidence)
    # A restart of this job was decided for some evidence: that is no news to any of its
    # incarnations, wherever the fleet manager placed them since.
    new = [u for u in evidence if u.key not in prev.evidence and u.key not in prev.restarted_for]
    moved = {
        r.rank: r.backup
        for r in jobindex.odd_routes(conn)
        if not r.primary_ok and r.backup_ok and r.backup
    }
    isolated = bool(conn.isolated_ranks) or not conn.all_pairs_survive
    # A rank on its backup that failed too, its primary still failed: no command helps
    # it, and a fail-back would send it onto its dead primary. It stays where it was told.
    moved.update(_stranded(conn, prev, moved))
    held = _held(job, prev, moved, fabric, conn, options=options)
    moved.update(held)
    if not options.policy.fails_back:  # NCCL keeps the partner device until a restart
        stay = _routes_by_rank(conn, sorted(prev.moved))
        moved.update(
            {
                r: b
                for r, b in prev.moved.items()
                if r not in moved and r in stay and stay[r].backup_ok
            }
        )
    returning = sorted(r for r in prev.moved if r not in moved)
    newly_moved = sorted(r for r in moved if r not in prev.moved or prev.moved[r] != moved[r])

    # A new incarnation's prev is a fresh Desired, so base is in mode NORMAL then too.
    base = replace(prev, evidence=keys)

    # 1. Something new broke a path this job uses (or left some GPU without any): decide
    #    by the cost model, at the time the earliest new evidence appeared.
    if isolated or newly_moved:
        # Evidence the job was already restarted for, and nothing new: the fleet manager
        # placed it back on that hardware. A restart would land it there again, so it runs
        # on what is left, says so once, and is not restarted for that evidence again.
        restarted_for_it = (
            isolated
            and all(u.key in prev.restarted_for for u in new)
            and (
                (bool(keys) and keys <= prev.restarted_for)  # only what it was restarted for
                or _isolated_by(fabric, conn, evidence, prev.restarted_for)
            )
        )
        if restarted_for_it and not (new_life or newly_moved or returning):
            return Reconciled(base, None, conn, warnings)  # said already: nothing changed
        if restarted_for_it:
            back_on = (
                "the restarted job resumes on the faults it was restarted for, "
                + (
                    f"{len(conn.isolated_ranks)} rank(s) without a usable path"
                    if conn.isolated_ranks
                    else "rank pairs without a usable path between them"
                )
                + ": it is not restarted again for them (place it without the faulty node)"
            )
            if moved:
                return _failover(p, base, moved, note=back_on)
            if returning:  # the last on a backup can return: nobody is left there
                return _failback(p, prev, base, moved, returning)
            # Nobody can move to a backup: it runs as placed, and that is the decision.
            record = DecisionRecord(
                f"replan:{now.isoformat()}",
                Action.NONE,
                back_on + "; no rank can move to a backup",
                inputs=inputs_now(now, job, options, base.k),
                costs_s={},
                costs_gpu_s={},
                plan={"failed_over": [], "warnings": list(warnings)},
            )
            return Reconciled(replace(base, mode=Mode.NORMAL), record, conn, warnings)
        if not new and not isolated:
            # Paths moved without new evidence (a plan changed under re-registration, or a
            # restarted job starts on the paths its open faults leave): no cost question.
            note = None
            if new_life:
                note = "the restarted job starts on its backups: faults still open"
                if keys & prev.restarted_for:
                    note += "; it is not restarted again for them"
            elif fresh:
                note = "the job starts on its backups: faults open before it was registered"
            return _failover(p, base, moved, note=note)
        # A switch inferred failed names the decision: its port faults are that one failure.
        first = next((u for u in new if u.kind == "switch"), new[0] if new else None)
        at = min(u.since for u in new) if new else now
        note = _note(first, evidence)
        if new_life and not new:
            note = "the restarted job resumes with faults still open"
        # Only planned windows are new: the job moves ahead of them, whatever the cost model
        # would say about restarting after a fault.
        planned = bool(new) and all(u.kind == "maintenance" for u in new)
        return _cost_decision(p, base, moved, at=at, first=first, note=note, planned=planned)

    # 2. Ranks whose primary is healthy again return to it; the others stay on backup.
    if returning:
        return _failback(p, prev, base, moved, returning)

    desired = _with_mitigations(job, fabric, conn, base, moved, options=options) if moved else base
    # 3. A checkpoint while failed over: restart cleanly now, or keep running degraded?
    # First, and with the newest k: a k measured in the same pass is decided with it here,
    # not in a second decision on the next pass.
    cp = job.newest_checkpoint
    if (
        prev.mode == Mode.FAILED_OVER
        and cp is not None
        and job.failed_over_at is not None
        and cp.at > job.failed_over_at
        and cp.id != prev.checkpoint_id
    ):
        return _at_checkpoint(p, desired, prev, cp)
    # 4. While failed over, a steady measured k far enough from the decided one is asked
    #    the cost question again; only a changed answer (restart now, or nothing to do) is
    #    a decision. The same failover again is none: k stays the one decided with.
    if (
        prev.mode == Mode.FAILED_OVER
        and job.measured_k is not None
        and prev.k is not None
        and abs(job.measured_k - prev.k) > options.measured_k_tolerance * prev.k
    ):
        note = f"measured k {job.measured_k:.3f} replaces {prev.k:.3f}"
        again = _cost_decision(
            p,
            base,
            moved,
            at=now,
            first=None,
            note=note,
            trigger=f"measured_k:{job.measured_k:.4f}",
        )
        same = again.decision is not None and again.decision.action == Action.FAILOVER
        if not (same and again.desired.same_outcome(desired)):
            return again
    if not desired.same_outcome(prev) and prev.mode == Mode.FAILED_OVER and moved:
        # Same ranks off their primary, another channel plan (a second rail of a node).
        return _failover(p, base, moved, note=None)
    return Reconciled(desired, None, conn, warnings)


def _stranded(conn: Connectivity, prev: Desired, moved: Mapping[int, str]) -> dict[int, str]:
    """Ranks of `prev.moved` whose backup and primary are both failed now."""
    gone = sorted(r for r in prev.moved if r not in moved)
    routes = _routes_by_rank(conn, gone)
    return {
        r: prev.moved[r]
        for r in gone
        if r in routes and not routes[r].primary_ok and not routes[r].backup_ok
    }


def _held(
    job: JobState,
    prev: Desired,
    moved: Mapping[int, str],
    fabric: FabricView,
    conn: Connectivity,
    *,
    options: Options,
) -> dict[int, str]:
    """Ranks whose primary is healthy again that must wait on their backup.

    A fail-back is one switch point for every rank of a registered communicator:
    "return to your primary paths, but for these disabled channels". While some member
    stays on its backup (its primary still failed) and the plan disables no channel to
    keep that rail out (one rail, s-Bond only, NVL), such a fail-back would send that
    member back onto its dead primary; so nobody of that communicator returns until all
    can. A job without registered communicators is told rank by rank instead.
    """
    candidates = {r for r in prev.moved if r not in moved}
    if not candidates or not moved or not job.communicators or job.nccl is not None:
        return {}
    disabled = _with_mitigations(job, fabric, conn, prev, dict(moved), options=options).disabled
    held: dict[int, str] = {}
    staying = set(moved)
    changed = True
    while changed:  # a held rank stays on its backup, so its other communicators wait too
        changed = False
        for comm in job.communicators:
            if comm.comm_id == IMPLICIT_COMM or disabled.get(comm.comm_id):
                continue
            members = set(comm.ranks) if comm.ranks else {r for r, _, _ in job.ranks}
            waiting = (candidates & members) - held.keys()
            if waiting and staying & members:
                for r in waiting:
                    held[r] = prev.moved[r]
                staying |= waiting
                changed = True
    return held


# --- the outcomes -----------------------------------------------------------------------------


def _cost_decision(
    p: _Pass,
    base: Desired,
    moved: dict[int, str],
    *,
    at: datetime,
    first: Unhealthy | None,
    note: str | None,
    trigger: str | None = None,
    planned: bool = False,
) -> Reconciled:
    """Failover against restart by ReCCL eq. (1)-(4), for what is failed right now."""
    now, job, fabric, conn, options = p.now, p.job, p.fabric, p.conn, p.options
    warnings, evidence = p.warnings, p.evidence
    affecting = [u for u in evidence if _affects(u, conn, fabric)]
    # Port faults on a switch known to have failed are that one failure, not more.
    failed_switches = {u.switch for u in affecting if u.kind == "switch"}
    concurrent = len(
        [u for u in affecting if u.kind == "switch" or u.switch not in failed_switches]
    )
    affected = bool(conn.failed_over_ranks or conn.isolated_ranks or conn.broken_pairs)
    bw = _bandwidth_left(conn, fabric) if job.comm_share is not None else None
    k_now = job.measured_k if job.measured_k is not None else job.slowdown_k
    estimate = estimate_k(
        measured_k=k_now,
        comm_share=job.comm_share,
        bandwidth_left=bw if bw is None or bw > 0 else None,
        concurrent_faults=max(1, concurrent),
        table=options.default_k,
    )
    path_available = conn.all_pairs_survive and not conn.isolated_ranks
    domain = None
    if job.nccl is not None:
        domain = nccl.assess_job(job.nccl, fabric.topologies, fabric.failed, conn.routes)
        # NCCL fails over between NICs; a rank whose GPU is gone has no path under any.
        gone = any((r.node, r.gpu) in fabric.failed.gpus for r in conn.routes)
        path_available = domain.path_available and not gone
        affected = domain.affected or gone
    elapsed = max(0.0, (at - usable_checkpoint_at(job)).total_seconds())
    scaled = _scaled_plan(job, conn) if job.allow_scaling else None
    inputs = cost.DecisionInputs(
        checkpoint_interval_s=job.checkpoint_interval_s,
        elapsed_s=elapsed,
        detect_s=job.detect_s,
        reload_s=job.reload_s,
        timeout_s=job.timeout_s,
        k=estimate.k,
        k_source=estimate.source.value,
        gpus=max(1, len(conn.routes)),
        path_available=path_available,
        affected=affected,
        dp_size=job.dp_size,
        new_dp_size=None if scaled is None else scaled.new_dp_size,
        allow_scaling=job.allow_scaling,
        spare_nodes=job.spare_nodes,
        node_replace_s=job.node_replace_s,
        planned=planned,
    )
    result = cost.with_policy(cost.decide(inputs), options.policy)
    reasons = [result.reason]
    if domain is None and not conn.all_pairs_survive:
        reasons.insert(
            0,
            f"{conn.broken_pairs} rank pair(s) across nodes have no path left "
            f"({len(conn.isolated_ranks)} rank(s) lost both RNICs)",
        )
    dead = _node_failure_note(evidence, fabric, _nodes(job, conn))
    if dead:
        reasons.insert(0, dead)
    if note:
        reasons.insert(0, note)
    plan = _plan(conn, bw, estimate.detail, result, evidence=evidence, warnings=warnings)
    if domain is not None:  # NCCL's own failover is the plan: no channels, no switch points
        reasons.insert(0, domain.reason)
        plan.update(mitigation="nccl", failed_over=[], nccl=domain.record())
    name = trigger or (first.key if first is not None else f"state:{now.isoformat()}")

    def record(action: Action, desired: Desired) -> Reconciled:
        costs = dict(result.costs_s)
        changed = dict(desired.moved) != dict(base.moved)
        return Reconciled(
            desired,
            DecisionRecord(
                name,
                action,
                ": ".join(reasons),
                inputs=inputs_record(result, concurrent),
                costs_s=costs,
                costs_gpu_s=dict(result.costs_gpu_s),
                plan=plan,
                fault_key=None if first is None else first.key,
                saved_gpu_s=cost.saved_gpu_s(action.value, costs, inputs.gpus, moved=changed),
            ),
            conn,
            warnings,
        )

    if result.action == cost.Action.RESTART_SCALED:
        assert scaled is not None  # decide() offers it only with a new DP size
        # What the fleet manager executes: requeue without these nodes, at this DP size.
        plan.update(
            drop_nodes=list(scaled.drop_nodes),
            new_dp_size=scaled.new_dp_size,
            dropped_replicas=list(scaled.dropped_replicas),
        )
        reasons[-1] += (
            f"; drop {', '.join(scaled.drop_nodes)} (DP replicas "
            f"{', '.join(map(str, scaled.dropped_replicas))}): "
            f"DP {scaled.dp_size} -> {scaled.new_dp_size}"
        )
    if result.action in (cost.Action.RESTART, cost.Action.RESTART_SCALED):
        restarting = replace(
            base,
            mode=Mode.RESTARTING,
            moved={},
            disabled={},
            mitigation={},
            **_NO_PLAN,
            k=estimate.k,
            # Every evidence known now, windows announced on the job's parts included: an
            # incarnation placed back on any of it is not restarted for it again.
            restarted_for=base.restarted_for | _known(job, conn, fabric, evidence),
        )
        return record(Action(result.action.value), restarting)
    if result.action == cost.Action.NONE:
        # Only backups lost: say why, change nothing but the k it rests on (a measured k
        # that decided "none" would otherwise decide it again on every pass).
        return record(Action.NONE, replace(base, k=estimate.k))
    if domain is not None:
        nccl_desired = replace(base, mode=Mode.FAILED_OVER, moved=dict(moved), k=estimate.k)
        return record(Action.FAILOVER, nccl_desired)
    desired = _with_mitigations(
        job,
        fabric,
        conn,
        replace(base, mode=Mode.FAILED_OVER, k=estimate.k),
        moved,
        options=options,
    )
    plan.update(_describe(desired, fabric, job, conn, options))
    if desired.mitigation:
        plan["mitigation"] = next(iter(dict(sorted(desired.mitigation.items())).values()))
    return record(Action.FAILOVER, desired)


def _scaled_plan(job: JobState, conn: Connectivity) -> layout.ScaledPlan | None:
    """Restart without the nodes whose failed part leaves some rank off its primary."""
    drop = {r.node for r in jobindex.odd_routes(conn) if not r.primary_ok}
    return layout.scaled_plan(
        job.ranks, drop, dp_size=job.dp_size, tp_size=job.tp_size, pp_size=job.pp_size
    )


def _failover(p: _Pass, base: Desired, moved: dict[int, str], *, note: str | None) -> Reconciled:
    """Ranks move (or channels change) without new evidence: no cost question to ask."""
    now, job, fabric, conn, options, warnings = (
        p.now,
        p.job,
        p.fabric,
        p.conn,
        p.options,
        p.warnings,
    )
    desired = _with_mitigations(
        job, fabric, conn, replace(base, mode=Mode.FAILED_OVER), moved, options=options
    )
    plan = {
        "mitigation": next(iter(desired.mitigation.values()), "s-bond"),
        "failed_over": _moved_plan(conn),
        "warnings": list(warnings),
    }
    plan.update(_describe(desired, fabric, job, conn, options))
    return Reconciled(
        desired,
        DecisionRecord(
            f"replan:{now.isoformat()}",
            Action.FAILOVER,
            note or "ranks follow the paths the open faults leave them (nothing new failed)",
            inputs=inputs_now(now, job, options, base.k),
            costs_s={},
            costs_gpu_s={},
            plan=plan,
        ),
        conn,
        warnings,
    )


def _failback(
    p: _Pass, prev: Desired, base: Desired, moved: dict[int, str], returning: list[int]
) -> Reconciled:
    """Ranks whose primary is healthy return; channels of rails still failed stay disabled."""
    now, job, fabric, conn, options, warnings = (
        p.now,
        p.job,
        p.fabric,
        p.conn,
        p.options,
        p.warnings,
    )
    by_rank = _routes_by_rank(conn, returning)
    gone = sorted(prev.evidence - base.evidence)
    still = sorted(moved)
    # Primary healthy, kept on the backup until their communicator can return (_held).
    held = sorted(_primary_ok(conn, still))
    if still:
        desired = _with_mitigations(
            job, fabric, conn, replace(base, mode=Mode.FAILED_OVER), moved, options=options
        )
    else:
        desired = replace(
            base, mode=Mode.NORMAL, moved={}, disabled={}, mitigation={}, **_NO_PLAN, k=None
        )
    plan: dict[str, Any] = {
        "mitigation": "failback",
        "returning": [
            {"rank": r, "node": by_rank[r].node, "gpu": by_rank[r].gpu, "to": by_rank[r].primary}
            for r in returning
            if r in by_rank
        ],
        "still_failed_over": still,
        "held": held,
        "disabled_channels": {str(c): list(d) for c, d in sorted(desired.disabled.items()) if d},
        "cleared": gone,
    }
    nodes = sorted({by_rank[r].node for r in returning if r in by_rank})
    what = ", ".join(nodes)
    reason = (
        f"fail back: the primary paths on {what} are healthy again; "
        f"{len(returning)} rank(s) return to their primary at one op count"
    )
    if len(still) > len(held):
        reason += (
            f"; {len(still) - len(held)} rank(s) stay on their backup "
            "(their primary is still failed)"
        )
    if held:
        reason += (
            f"; {len(held)} rank(s) wait on their backup until every rank of their "
            "communicator can return (no channel plan keeps the failed rail out)"
        )
    if job.nccl is not None:
        # NCCL recovers the port itself (2.30+) or keeps the partner device until the job
        # restarts; either way Railover only records it.
        where = ", ".join(
            sorted({f"{by_rank[r].node}/{by_rank[r].primary}" for r in returning if r in by_rank})
        )
        reason = f"fail back: {nccl.failback_note(job.nccl, where)}"
        if not still and not job.nccl.recovers_ports:
            desired = replace(desired, mode=Mode.FAILED_OVER)
    trigger = f"failback:{gone[0].split(':', 1)[1]}" if gone else f"failback:{now.isoformat()}"
    if gone and not gone[0].startswith("fault:"):
        trigger = f"failback:{gone[0]}"
    return Reconciled(
        desired,
        DecisionRecord(
            trigger,
            Action.FAILBACK,
            reason,
            inputs=inputs_now(now, job, options, prev.k),
            costs_s={},
            costs_gpu_s={},
            plan=plan,
            fault_key=gone[0] if gone else None,
        ),
        conn,
        warnings,
    )


def _at_checkpoint(p: _Pass, desired: Desired, prev: Desired, cp: CheckpointSeen) -> Reconciled:
    """Restart onto healthy hardware at this checkpoint, or run degraded until the repair.

    A restart is worth it only where it escapes the fault: a spare node the fleet
    manager can put in the faulty one's place (it excludes it: Slurm's ExcNodeList, a
    Kubernetes taint), or a scaled restart without it. And the same evidence restarts a
    job once: an incarnation placed back on it runs degraded. The repair clock runs from
    the oldest evidence the job runs degraded on, whatever incarnations came since.
    """
    job, conn, options, warnings = p.job, p.conn, p.options, p.warnings
    k = job.measured_k or prev.k or job.slowdown_k or options.default_k[0]
    repair = job.repair_estimate_s or options.default_repair_s
    assert job.failed_over_at is not None
    broken_since = min([job.failed_over_at, *(u.since for u in p.evidence)])
    degraded_for = max(0.0, (cp.at - broken_since).total_seconds())
    remaining = max(0.0, repair - degraded_for)
    if p.evidence and all(u.clears_at is not None for u in p.evidence):
        # Every cause is gone already (a flap's port is back): the repair is the damping
        # or quiet period left, not a field engineer's day.
        clears = max(u.clears_at for u in p.evidence if u.clears_at is not None)
        remaining = min(remaining, max(0.0, (clears - cp.at).total_seconds()))
    restart, reason = coord.restart_at_checkpoint(k=k, reload_s=job.reload_s, repair_s=remaining)
    keys = frozenset(u.key for u in p.evidence)
    if restart and not options.policy.restarts_at_checkpoints:
        restart = False
        reason = f"keep running degraded: policy {options.policy.value} never restarts a job "
        reason += "at a checkpoint"
    elif restart and keys and keys <= prev.restarted_for:
        restart = False
        reason = (
            "keep running degraded: a restart was already decided for this evidence, and "
            "the job came back on it"
        )
    elif restart and not (job.spare_nodes or (job.allow_scaling and _scaled_plan(job, conn))):
        restart = False
        reason = (
            "keep running degraded: a restart cannot escape the fault (no spare node to "
            f"take the faulty one's place, and no scaled restart): {reason}"
        )
    verdict = "restart" if restart else "keep"
    seen = replace(desired, checkpoint_id=cp.id, verdict=verdict, k=k)
    if restart:
        seen = replace(
            seen,
            mode=Mode.RESTARTING,
            moved={},
            disabled={},
            mitigation={},
            **_NO_PLAN,
            restarted_for=prev.restarted_for | _known(job, conn, p.fabric, p.evidence),
        )
    elif prev.verdict == "keep":
        # The answer stands, whatever k it now rests on: a FlowCheck job checkpointing
        # every iteration gets one decision.
        return Reconciled(seen, None, conn, warnings)
    return Reconciled(
        seen,
        DecisionRecord(
            f"checkpoint:{cp.id}",
            Action.RESTART if restart else Action.NONE,
            reason,
            inputs=inputs_now(cp.at, job, options, k),
            costs_s={"restart": job.reload_s, "failover": (k - 1) * remaining},
            costs_gpu_s={},
            plan={"repair_in_s": remaining, "k": k},
        ),
        conn,
        warnings,
    )


# --- mitigations per communicator ---------------------------------------------------------------


def comms_of(job: JobState) -> tuple[CommSpec, ...]:
    return job.communicators or (CommSpec(IMPLICIT_COMM, IMPLICIT_CHANNELS),)


@dataclass(frozen=True, slots=True)
class CommPlan:
    comm_id: int
    ranks: tuple[int, ...]
    plan: coord.MitigationPlan
    disabled_channels: tuple[int, ...]
    # R²CCL balance: each channel's share of the traffic, and the allreduce hand-off.
    weights: tuple[float, ...] = ()
    split_ratio: float = 0.0
    # NVL: rank -> node-local transit GPU, for each rank off its primary.
    transit: Mapping[int, int] = field(default_factory=dict)


def channel_weights(channel_rnics: Sequence[str | None]) -> tuple[float, ...]:
    """R²CCL-Balance per channel: every RNIC still carrying traffic gets an equal share.

    Channel c leaves the node through ``channel_rnics[c]`` (None: nowhere). An RNIC's
    share is split evenly among its channels, so a backup RNIC that also carries a
    failed rail's channels gives each of them less, and the node's traffic is in
    proportion to the bandwidth left (each surviving RNIC has the same).
    """
    per_rnic = Counter(k for k in channel_rnics if k is not None)
    if not per_rnic:
        return ()
    return tuple(0.0 if k is None else 1.0 / (len(per_rnic) * per_rnic[k]) for k in channel_rnics)


def transit_gpus(
    moved: Sequence[RankRoute], fabric: FabricView
) -> tuple[dict[int, int], int] | None:
    """NVL: each moved rank's transit GPU, and the most ranks sharing one GPU.

    A rank sends over NVLink to the GPU whose primary RNIC is the rank's backup (the
    peer GPU beside that RNIC), when that GPU has NVLink and works. None when some
    moved rank has no such peer: NVL cannot carry the whole communicator.
    """
    out: dict[int, int] = {}
    for r in moved:
        topo = fabric.topologies[r.node]
        nvlink = {g.index for g in topo.gpus if g.nvlink}
        if r.gpu not in nvlink:
            return None
        peers = [
            g.gpu
            for g in fabric.plans[r.node].gpus
            if g.primary == r.backup
            and g.gpu != r.gpu
            and g.gpu in nvlink
            and (r.node, g.gpu) not in fabric.failed.gpus
        ]
        if not peers:
            return None
        out[r.rank] = min(peers)
    by_gpu = Counter((r.node, out[r.rank]) for r in moved)
    return out, max(by_gpu.values(), default=0)


def plan_mitigations(
    job: JobState, fabric: FabricView, conn: Connectivity, options: Options
) -> list[CommPlan]:
    """Per communicator with a rank off its primary: predicted k under each mitigation."""
    plans = []
    comms = comms_of(job)
    index = conn.index
    if index is not None and len(index.comms) != len(comms):
        index = None
    by_rank: dict[int, RankRoute] = {}
    share = job.comm_share if job.comm_share is not None else 0.3
    no_transit = {} if job.mode == Mode.RESTARTING else job.previous.no_transit
    no_balance = {} if job.mode == Mode.RESTARTING else job.previous.no_balance
    for k, comm in enumerate(comms):
        if index is not None and index.comms[k].unique and index.comms[k].comm_id == comm.comm_id:
            seen = _members_indexed(conn, index, index.comms[k])
        else:
            by_rank = by_rank or {r.rank: r for r in conn.routes}
            seen = _members(comm, by_rank)
        if seen is None:
            continue
        ranks, failed_by_node, worst, at_worst, moved, node_count = seen
        rails = sorted({r.rail for r in at_worst}, key=lambda x: (x is None, x))
        load = Counter(r.active for r in at_worst if r.active)
        crosses = any((fabric.plans[r.node].for_gpu(r.gpu).backup_cost or 0) >= 100 for r in moved)
        topo = fabric.topologies[worst]
        nvlink = any(g.nvlink for g in topo.gpus)
        transit = transit_gpus(moved, fabric) if moved and len(rails) < 2 else None
        offered = nvlink and len(rails) < 2 and transit is not None
        refused = no_transit.get(comm.comm_id)
        plan = coord.plan_mitigation(
            comm_share=share,
            rails_per_node=len(rails),
            failed_rails=len(failed_by_node[worst]),
            channels=comm.channels,
            nodes=node_count,
            backup_load=max(load.values(), default=1),
            backup_crosses_root_complex=crosses,
            nvl_available=offered and refused is None,
            nvl_mb_per_channel=options.nvl_mb_per_channel,
            nvl_cap_mb=job.nvl_cap_mb if job.nvl_cap_mb is not None else options.nvl_cap_mb,
            nvl_ranks_per_gpu=transit[1] if transit else 1,
        )
        if offered and refused is not None:
            plan = _transit_refused(plan, refused)
        failed_rails = {rail for rails_ in failed_by_node.values() for rail in rails_}
        # Channel c leaves each node through rail index c mod (rails used): the
        # channels of a failed rail are the ones DCR disables.
        disabled = (
            [c for c in range(comm.channels) if rails[c % len(rails)] in failed_rails]
            if plan.chosen.mitigation in (coord.Mitigation.DCR, coord.Mitigation.BALANCE)
            else []
        )
        if len(disabled) >= comm.channels:
            disabled = []
        chosen = plan.chosen.mitigation
        weights: tuple[float, ...] = ()
        split = 0.0
        if chosen == coord.Mitigation.BALANCE and comm.comm_id not in no_balance:
            # Where each rail of the worst node sends now: its primary, or its backup.
            out_of = {r.rail: r.active for r in at_worst}
            weights = channel_weights(
                [out_of.get(rails[c % len(rails)]) for c in range(comm.channels)]
            )
            split = float(plan.chosen.detail.get("allreduce_handoff", 0.0))  # type: ignore[arg-type]  # a float in the detail
        plans.append(
            CommPlan(
                comm.comm_id,
                ranks,
                plan,
                tuple(disabled),
                weights=weights,
                split_ratio=split,
                transit=transit[0] if transit and chosen == coord.Mitigation.NVL else {},
            )
        )
    return plans


def _transit_refused(plan: coord.MitigationPlan, why: str) -> coord.MitigationPlan:
    """The plan with NVL transit shown as the ranks' refusal, not as unavailable."""
    options = tuple(
        coord.Option(o.mitigation, False, None, f"refused by the ranks ({why}): s-Bond only")
        if o.mitigation == coord.Mitigation.NVL
        else o
        for o in plan.options
    )
    return replace(plan, options=options)


# What plan_mitigations reads of one communicator's members: their ranks, the rails
# failed per node, the worst node and its members, the members moved to their backup,
# and how many nodes the members are on.
_Members = tuple[
    tuple[int, ...], dict[str, set[int | None]], str, list[RankRoute], list[RankRoute], int
]


def _members(comm: CommSpec, by_rank: Mapping[int, RankRoute]) -> _Members | None:
    members = [by_rank[r] for r in (comm.ranks or sorted(by_rank)) if r in by_rank]
    nodes: set[str] = set()
    failed_by_node: dict[str, set[int | None]] = {}
    for r in members:
        nodes.add(r.node)
        if not r.primary_ok and r.primary is not None:
            failed_by_node.setdefault(r.node, set()).add(r.rail)
    if not failed_by_node:
        return None
    worst = max(failed_by_node, key=lambda n: (len(failed_by_node[n]), n))
    return (
        tuple(r.rank for r in members),
        failed_by_node,
        worst,
        [r for r in members if r.node == worst],
        [r for r in members if not r.primary_ok and r.backup_ok],
        len(nodes),
    )


def _members_indexed(
    conn: Connectivity, index: jobindex.JobIndex, comm: jobindex.CommIndex
) -> _Members | None:
    """_members from the routes that lack an endpoint: the others fail nothing and move nowhere."""
    order = comm.order
    odd = sorted(
        (r for r in jobindex.odd_routes(conn) if r.rank in order), key=lambda r: order[r.rank]
    )
    failed_by_node: dict[str, set[int | None]] = {}
    for r in odd:
        if not r.primary_ok and r.primary is not None:
            failed_by_node.setdefault(r.node, set()).add(r.rail)
    if not failed_by_node:
        return None
    worst = max(failed_by_node, key=lambda n: (len(failed_by_node[n]), n))
    at_worst = sorted(
        (conn.routes[i] for i in index.by_node.get(worst, ()) if conn.routes[i].rank in order),
        key=lambda r: order[r.rank],
    )
    moved = [r for r in odd if not r.primary_ok and r.backup_ok]
    return comm.ranks, failed_by_node, worst, at_worst, moved, comm.nodes


def _with_mitigations(
    job: JobState,
    fabric: FabricView,
    conn: Connectivity,
    base: Desired,
    moved: dict[int, str],
    *,
    options: Options,
) -> Desired:
    if job.nccl is not None:
        # Stock NCCL moves its traffic itself and takes no channel plan.
        return replace(base, moved=dict(moved), disabled={}, mitigation={}, **_NO_PLAN)
    plans = plan_mitigations(job, fabric, conn, options)
    # Only a job that registered its communicators can be told a switch point.
    disabled = {
        p.comm_id: p.disabled_channels
        for p in plans
        if p.disabled_channels and p.comm_id != IMPLICIT_COMM
    }
    mitigation = {p.comm_id: p.plan.chosen.mitigation.value for p in plans}
    told = [p for p in plans if p.comm_id != IMPLICIT_COMM]
    return replace(
        base,
        moved=dict(moved),
        disabled=disabled,
        mitigation=mitigation,
        weights={p.comm_id: p.weights for p in told if p.weights},
        split={p.comm_id: p.split_ratio for p in told if p.weights and p.split_ratio},
        transit={p.comm_id: dict(p.transit) for p in told if p.transit},
    )


def _describe(
    desired: Desired, fabric: FabricView, job: JobState, conn: Connectivity, options: Options
) -> dict[str, Any]:
    return {
        "communicators": [
            {
                "comm_id": p.comm_id,
                "mitigation": p.plan.chosen.mitigation.value,
                "predicted_k": p.plan.chosen.k,
                "why": p.plan.reason,
                # A communicator the job did not register is planned, but not told.
                "disabled_channels": list(p.disabled_channels),
                "channel_weights": list(p.weights),
                "allreduce_split": p.split_ratio if p.weights else None,
                "transit": [{"rank": r, "gpu": g} for r, g in sorted(p.transit.items())],
                "options": [
                    {
                        "mitigation": o.mitigation.value,
                        "applicable": o.applicable,
                        "k": o.k,
                        "why": o.why,
                        **o.detail,
                    }
                    for o in p.plan.options
                ],
            }
            for p in plan_mitigations(job, fabric, conn, options)
        ]
    }


# --- commands: the difference between desired and commanded -----------------------------------


class IntentKind(enum.StrEnum):
    FAILOVER = "failover"
    REBALANCE = "rebalance"
    FAILBACK = "failback"
    ABORT = "abort"
    BALANCE = "balance"
    NVL_TRANSIT = "nvl_transit"
    CHECKPOINT_NOW = "checkpoint_now"


@dataclass(frozen=True, slots=True)
class Intent:
    """One command to send: to these ranks of one communicator (a switch point when coordinated)."""

    kind: IntentKind
    comm_id: int
    ranks: tuple[int, ...]
    disabled_channels: tuple[int, ...] = ()
    # BALANCE: each channel's share and the allreduce hand-off (disabled_channels is the
    # DCR plan a CCL without weights runs instead).
    weights: tuple[float, ...] = ()
    split_ratio: float = 0.0
    # NVL_TRANSIT: (rank, transit GPU) for each of `ranks`.
    transit: tuple[tuple[int, int], ...] = ()
    iteration: int | None = None  # CHECKPOINT_NOW: the checkpoint must be newer than this
    # FAILBACK: the ranks it returns to their primary (`ranks` is every member it tells).
    returning: tuple[int, ...] = ()

    @property
    def coordinated(self) -> bool:
        return self.kind in (IntentKind.REBALANCE, IntentKind.FAILBACK, IntentKind.BALANCE)


def command_diff(
    commanded: Desired,
    desired: Desired,
    job: JobState,
    index: jobindex.JobIndex | None = None,
) -> list[Intent]:
    """What to tell the ranks so that what they were told becomes `desired`.

    Aborting covers everything; otherwise ranks newly off their primary are told to
    move at once (s-Bond needs no agreement), and each communicator whose channel plan
    changes, or that has ranks returning to their primary, gets one switch point for all
    its ranks, carrying the channels that stay disabled: a BALANCE with the channel
    weights and allreduce split when balance is the plan, else a REBALANCE. Ranks given
    a new transit GPU are told at once (NVL_TRANSIT: a rank's own path, no agreement).
    A checkpoint request that changed goes to every rank (comm 0: the process, not one
    communicator).

    With the job's `index` (built for this placement and these communicators) the
    members of each communicator are read from it, not gathered again.
    """
    if index is not None and not index.fits(job.ranks, comms_of(job)):
        index = None
    all_ranks = tuple(r for r, _, _ in job.ranks) if index is None else index.ranks_in_order
    comms = [(c.comm_id, c.ranks or all_ranks) for c in comms_of(job)]
    if desired.mode == Mode.RESTARTING:
        if commanded.mode == Mode.RESTARTING:
            return []
        return [Intent(IntentKind.ABORT, cid, tuple(ranks)) for cid, ranks in comms]
    intents: list[Intent] = []
    newly = {r for r, k in desired.moved.items() if commanded.moved.get(r) != k}
    back = {r for r in commanded.moved if r not in desired.moved}
    for k, (cid, ranks) in enumerate(comms):
        members: Set[int] = set(ranks) if index is None else index.comms[k].told
        moving = tuple(sorted(newly & members))
        if moving:
            intents.append(Intent(IntentKind.FAILOVER, cid, moving))
        was = tuple(commanded.disabled.get(cid, ()))
        now = tuple(desired.disabled.get(cid, ()))
        returning = back & members
        if cid == IMPLICIT_COMM and not job.communicators:
            # No registered communicator: no channel plan to agree on, so each rank is told
            # its own return; a rank whose primary is still failed is told nothing.
            if returning:
                back_ranks = tuple(sorted(returning))
                intents.append(
                    Intent(IntentKind.FAILBACK, cid, back_ranks, now, returning=back_ranks)
                )
            continue
        weights = tuple(desired.weights.get(cid, ()))
        split = desired.split.get(cid, 0.0)
        plan_changed = was != now or (
            weights,
            split,
        ) != (tuple(commanded.weights.get(cid, ())), commanded.split.get(cid, 0.0))
        if returning:
            intents.append(
                Intent(
                    IntentKind.FAILBACK,
                    cid,
                    _sorted(members, index, k),
                    now,
                    returning=tuple(sorted(returning)),
                )
            )
        elif plan_changed and weights:
            intents.append(
                Intent(
                    IntentKind.BALANCE,
                    cid,
                    _sorted(members, index, k),
                    now,
                    weights=weights,
                    split_ratio=split,
                )
            )
        elif plan_changed:
            intents.append(Intent(IntentKind.REBALANCE, cid, _sorted(members, index, k), now))
        transit = dict(desired.transit.get(cid, {}))
        told = dict(commanded.transit.get(cid, {}))
        changed = {r: g for r, g in transit.items() if r in members and told.get(r) != g}
        if changed:
            intents.append(
                Intent(
                    IntentKind.NVL_TRANSIT,
                    cid,
                    tuple(sorted(changed)),
                    transit=tuple(sorted(changed.items())),
                )
            )
    asked = desired.checkpoint_after
    if asked is not None and asked != commanded.checkpoint_after:
        intents.append(
            Intent(
                IntentKind.CHECKPOINT_NOW,
                0,
                tuple(sorted(all_ranks)) if index is None else index.sorted_ranks,
                iteration=asked,
            )
        )
    return intents


def _sorted(members: Set[int], index: jobindex.JobIndex | None, k: int) -> tuple[int, ...]:
    return tuple(sorted(members)) if index is None else index.comms[k].told_sorted


def transit_refused(commanded: Desired, comm_id: int, ranks: Iterable[int]) -> Desired:
    """What the ranks were told, less the transit GPUs these ranks of `comm_id` refused."""
    gone = set(ranks)
    told = {r: g for r, g in commanded.transit.get(comm_id, {}).items() if r not in gone}
    transit = {c: t for c, t in commanded.transit.items() if c != comm_id}
    if told:
        transit[comm_id] = told
    return replace(commanded, transit=transit)


def failback_refused(
    commanded: Desired, held: Desired, comm_id: int, ranks: Iterable[int]
) -> Desired:
    """What the ranks were told, once a fail-back of `comm_id` returning `ranks` was refused:
    those ranks on the backup `held` keeps them on, and the communicator's channel plan
    as `held` has it (what they still run, the refused switch point never applied)."""
    moved = dict(commanded.moved)
    moved.update({r: held.moved[r] for r in ranks if r in held.moved})

    def one(told: Mapping[int, Any], wanted: Mapping[int, Any]) -> dict[int, Any]:
        out = {c: v for c, v in told.items() if c != comm_id}
        if comm_id in wanted:
            out[comm_id] = wanted[comm_id]
        return out

    return replace(
        commanded,
        mode=held.mode,
        moved=moved,
        disabled=one(commanded.disabled, held.disabled),
        mitigation=one(commanded.mitigation, held.mitigation),
        weights=one(commanded.weights, held.weights),
        split=one(commanded.split, held.split),
        transit=one(commanded.transit, held.transit),
    )


# --- records --------------------------------------------------------------------------------------


def inputs_record(result: cost.Decision, concurrent: int) -> dict[str, Any]:
    """The stored (and returned) record of what a cost decision was based on."""
    i = result.inputs
    return {
        "t_elapsed_s": i.elapsed_s,
        "checkpoint_interval_s": i.checkpoint_interval_s,
        "k": i.k,
        "k_source": i.k_source,
        "detect_s": i.detect_s,
        "reload_s": i.reload_s,
        "timeout_s": i.timeout_s,
        "threshold_s": result.threshold_s,
        "gpus": i.gpus,
        "concurrent_faults": concurrent,
        "path_available": i.path_available,
        "dp_size": i.dp_size,
        "new_dp_size": i.new_dp_size,
        "allow_scaling": i.allow_scaling,
        "spare_nodes": i.spare_nodes,
        "node_replace_s": i.node_replace_s,
        "planned": i.planned,
    }


def inputs_now(
    at: datetime, job: JobState, options: Options, k_used: float | None
) -> dict[str, Any]:
    """The inputs record of a decision the cost model did not make (fail-back, checkpoint)."""
    k = job.measured_k if job.measured_k is not None else job.slowdown_k
    k = k if k is not None else k_used
    known = k is not None
    k = k if k is not None else options.default_k[0]
    return {
        "t_elapsed_s": max(0.0, (at - usable_checkpoint_at(job)).total_seconds()),
        "checkpoint_interval_s": job.checkpoint_interval_s,
        "k": k,
        "k_source": "measured" if known else "default",
        "detect_s": job.detect_s,
        "reload_s": job.reload_s,
        "timeout_s": job.timeout_s,
        "threshold_s": cost.failover_threshold_s(job.checkpoint_interval_s, job.detect_s, k),
        "gpus": len(job.ranks),
    }


def _moved_plan(conn: Connectivity) -> list[dict[str, Any]]:
    return [
        {"rank": r.rank, "node": r.node, "gpu": r.gpu, "from": r.primary, "to": r.backup}
        for r in jobindex.odd_routes(conn)
        if not r.primary_ok and r.backup_ok
    ]


def _nodes(job: JobState, conn: Connectivity) -> Set[str]:
    """The job's nodes (the index keeps them)."""
    if conn.index is not None:
        return conn.index.nodes
    return {n for _, n, _ in job.ranks}


def backups_of(conn: Connectivity, ranks: Sequence[int]) -> dict[int, str]:
    """The backup RNIC of each of `ranks` that has one."""
    wanted = set(ranks)
    routes = _routes_by_rank(conn, ranks)
    return {r: route.backup for r, route in routes.items() if r in wanted and route.backup}


def _primary_ok(conn: Connectivity, ranks: Sequence[int]) -> set[int]:
    """Those of `ranks` whose primary works now."""
    return {
        r for r, route in _routes_by_rank(conn, ranks).items() if r in ranks and route.primary_ok
    }


def _routes_by_rank(conn: Connectivity, ranks: Sequence[int]) -> dict[int, RankRoute]:
    """The routes of `ranks` that the job has: all of them without an index."""
    if conn.index is None:
        return {r.rank: r for r in conn.routes}
    found = {r: jobindex.route_of(conn, r) for r in ranks}
    return {r: route for r, route in found.items() if route is not None}


def _bandwidth_left(conn: Connectivity, fabric: FabricView) -> float:
    """paths.bandwidth_left; with an index, over the nodes where some rank lacks an endpoint.

    A rank on any other node uses its primary as every rank there does, and keeps all of
    its bandwidth (a ratio of exactly 1), so those nodes cannot lower the minimum.
    """
    index = conn.index
    if index is None or conn.odd is None:
        return bandwidth_left(conn.routes, fabric.topologies)
    nodes = {conn.routes[i].node for i in conn.odd}
    at = sorted(i for n in nodes for i in index.by_node.get(n, ()))
    return bandwidth_left([conn.routes[i] for i in at], fabric.topologies)


def _plan(
    conn: Connectivity,
    bw: float | None,
    k_detail: str,
    result: cost.Decision,
    *,
    evidence: Sequence[Unhealthy],
    warnings: tuple[str, ...],
) -> dict[str, Any]:
    return {
        "mitigation": "s-bond",
        "failed_over": _moved_plan(conn),
        "isolated_ranks": list(conn.isolated_ranks),
        "broken_pairs": conn.broken_pairs,
        "example_broken_pairs": [list(p) for p in conn.examples],
        "bandwidth_left": None if bw is None else round(bw, 4),
        "k_detail": k_detail,
        "failed_components": [
            {
                "node": u.node,
                "device": u.device,
                "port": u.port or None,
                "kind": u.kind,
                "component": u.label,
                "evidence": u.key,
            }
            for u in evidence
        ],
        "warnings": list(warnings),
        "notes": list(result.notes),
    }


def _uses(conn: Connectivity) -> set[tuple[str, str, int]]:
    used = set()
    for r in conn.routes:
        for key in (r.primary, r.backup):
            if key:
                dev, _, port = key.partition("/")
                used.add((r.node, dev, int(port)))
    return used


def _affects(u: Unhealthy, conn: Connectivity, fabric: FabricView) -> bool:
    """Whether the evidence takes out a port (or GPU) that some rank uses as primary or backup."""
    index = conn.index
    if index is not None:
        return _affects_indexed(u, index)
    if u.kind == "switch" or (u.node is None and u.switch is not None):
        return any(
            r.node in fabric.topologies
            and key is not None
            and _switch_of(fabric.topologies[r.node], key) == u.switch
            for r in conn.routes
            for key in (r.primary, r.backup)
        )
    if u.kind == "gpu_lost":
        return any(r.node == u.node and r.gpu == u.port for r in conn.routes)
    if u.kind == "unreachable":
        return any(r.node == u.node for r in conn.routes)
    return any(node == u.node and _takes_port(u, dev, port) for node, dev, port in _uses(conn))


def _affects_indexed(u: Unhealthy, index: jobindex.JobIndex) -> bool:
    """_affects from the ports, switches and GPUs the index says the job uses."""
    if u.kind == "switch" or (u.node is None and u.switch is not None):
        return u.switch in index.used_switches
    if u.kind == "gpu_lost":
        return (u.node, u.port) in index.used_gpus
    if u.kind == "unreachable":
        return u.node in index.nodes
    return any(_takes_port(u, dev, port) for dev, port in index.ports_by_node.get(u.node or "", ()))


def _takes_port(u: Unhealthy, device: str, port: int) -> bool:
    """Whether evidence on the node takes this port (or its whole RNIC, or the node's)."""
    return u.device in (device, None) and u.port in (0, port, None)


def _switch_of(topo: NodeTopology, key: str) -> str | None:
    try:
        return topo.rnic(key).switch
    except KeyError:
        return None


def _isolated_by(
    fabric: FabricView, conn: Connectivity, evidence: Sequence[Unhealthy], keys: Set[str]
) -> bool:
    """Whether some rank left without a path lost both its RNICs (or its GPU, or its node)
    to the evidence `keys`, which a restart was decided for: placed back there, the job
    has that rank without a path again, whatever else broke since, so restarting it once
    more on this placement cannot help."""
    if not conn.isolated_ranks or not keys:
        return False
    touched = [u for u in evidence if u.key in keys]
    isolated = set(conn.isolated_ranks)
    return any(
        _lost_to(fabric, r, touched) for r in jobindex.odd_routes(conn) if r.rank in isolated
    )


def _lost_to(fabric: FabricView, r: RankRoute, evidence: Sequence[Unhealthy]) -> bool:
    """Whether `evidence` alone takes the rank's node, its GPU, or both of its RNICs."""
    topo = fabric.topologies.get(r.node)
    if topo is None:
        return False
    for u in evidence:
        if u.node == r.node and (
            u.kind == FaultKind.UNREACHABLE or (u.kind == FaultKind.GPU_LOST and u.port == r.gpu)
        ):
            return True
    for end in (r.primary, r.backup):
        if end is None:
            continue
        try:
            rnic = topo.rnic(end)
        except KeyError:
            return False
        if not any(
            (u.switch is not None and u.node is None and u.switch == rnic.switch)
            or (u.node == r.node and _takes_port(u, rnic.name, rnic.port))
            for u in evidence
        ):
            return False
    return True


def _one_failure(restarted_for: frozenset[str], evidence: Sequence[Unhealthy]) -> frozenset[str]:
    """`restarted_for` with each switch inferred failed and its ports' faults as one: when
    the job was restarted for any of them, for all of them."""
    out = set(restarted_for)
    for sw in evidence:
        if sw.kind != "switch":
            continue
        one = {sw.key} | {u.key for u in evidence if u.node is not None and u.switch == sw.switch}
        if one & restarted_for:
            out |= one
    return frozenset(out)


def _known(
    job: JobState, conn: Connectivity, fabric: FabricView, evidence: Iterable[Unhealthy]
) -> frozenset[str]:
    """What a restart decided now is for: the evidence, and the maintenance windows
    announced on the job's parts (the fleet manager knows of them when it places the next
    incarnation)."""
    nodes = _nodes(job, conn)
    announced = [
        u
        for u in fabric.scheduled
        if (u.node is None or u.node in nodes) and _affects(u, conn, fabric)
    ]
    return frozenset(u.key for u in (*evidence, *announced))


def _evidence_for(conn: Connectivity, fabric: FabricView, nodes: Set[str]) -> list[Unhealthy]:
    return [
        u
        for u in fabric.unhealthy
        if (u.node is None or u.node in nodes) and _affects(u, conn, fabric)
    ]


def _note(first: Unhealthy | None, evidence: Sequence[Unhealthy]) -> str | None:
    if first is None:
        return None
    if first.kind == "switch":
        return (
            f"switch {first.label} inferred failed ({first.reason}); all its links count as failed"
        )
    if first.kind in ("gpu_lost", "rnic_lost"):
        what = "GPU" if first.kind == "gpu_lost" else "RNIC"
        return f"{what} {first.label} is gone from the node's registration ({first.kind})"
    if first.kind == "quarantine":
        return f"port {first.label} is quarantined ({first.reason})"
    if first.kind == "unreachable":
        return first.reason
    if first.kind == "maintenance":
        return f"{first.label}: {first.reason}"
    return None


def _node_failure_note(
    evidence: Sequence[Unhealthy], fabric: FabricView, nodes: Set[str]
) -> str | None:
    """A node whose every fabric port failed looks like a dead peer: say so in the reason."""
    dead = []
    for node in sorted({u.node for u in evidence if u.node} & nodes):
        fabric_ports = fabric.fabric_ports.get(node, frozenset())
        failed: set[tuple[str, int]] = set()
        for u in evidence:
            if u.node != node or u.device is None:
                continue
            if not u.port:
                failed |= {(d, p) for d, p in fabric_ports if d == u.device}
            else:
                failed.add((u.device, u.port))
        if coord.is_node_failure(failed, fabric_ports):
            dead.append(node)
    if not dead:
        return None
    return (
        f"node failure: every fabric RNIC of {', '.join(dead)} failed "
        "(a dead peer, not the network)"
    )
