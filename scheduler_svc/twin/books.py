"""The fleet twin's books: each job's progress and losses by cause, the invariants it
counts, and what one run returns (scheduler_svc.twin.loop keeps them)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from scheduler_svc.twin.cluster import GPUS, JobSpec

CAUSES = ("hang", "lost_work", "reload", "degraded", "waiting", "scaled")


@dataclass
class TwinJob:
    """One job as the twin runs it: where it is, how far it got, what it lost."""

    spec: JobSpec
    comm_id: int
    nodes: list[str]
    incarnation: int = 1
    mode: str = "normal"  # as the service last said
    # Its processes: "up", "hung" until hung_until (then "down" if aborted), "down"
    # (aborted, waiting for the fleet manager to place it again), "reloading" until
    # ready_at.
    state: str = "up"
    aborted: bool = False
    hung_until: float = 0.0
    ready_at: float = 0.0
    progress: float = 0.0  # work-seconds done
    accounted_to: float = 0.0
    checkpoint_progress: float = 0.0
    checkpoint_at: float = 0.0
    generation: int = 0  # bumped at each restart: stale checkpoint events are dropped
    lost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    on_backup: set[int] = field(default_factory=set)  # ranks the applied commands moved
    # restart_scaled: the nodes the service said the job restarts without, until the
    # fleet manager places it again.
    drop: tuple[str, ...] = ()
    full_nodes: int = 0  # its size unshrunk (0: as placed first)

    def __post_init__(self) -> None:
        self.full_nodes = self.full_nodes or len(self.nodes)

    @property
    def scale(self) -> float:
        """The share of its data-parallel replicas running (1 unless it was shrunk)."""
        return len(self.nodes) / self.full_nodes

    def rank_of(self, node: str, gpu: int) -> int:
        return self.nodes.index(node) * GPUS + gpu

    def accrue(self, t: float) -> None:
        """Progress and losses from `accounted_to` up to `t`, state by state."""
        while self.accounted_to < t:
            start = self.accounted_to
            if self.state == "hung":
                end = min(t, self.hung_until)
                self.lost["hang"] += end - start
                if end >= self.hung_until:
                    self.state = "down" if self.aborted else "up"
            elif self.state == "reloading":
                end = min(t, self.ready_at)
                self.lost["reload"] += end - start
                if end >= self.ready_at:
                    self.state = "up"
            elif self.state == "down":
                end = t
                self.lost["waiting"] += end - start
            else:
                end = t
                # Shrunk, a share (1 - scale) of the time is lost; failed over, what runs
                # runs k times slower.
                span, scale = end - start, self.scale
                k = self.spec.k if self.mode == "failed_over" else 1.0
                self.progress += span * scale / k
                self.lost["scaled"] += span * (1 - scale)
                self.lost["degraded"] += span * scale * (1 - 1 / k)
            self.accounted_to = end

    def checkpoint_now(self) -> None:
        if self.spec.checkpoint == "flowcheck":  # every iteration
            it = self.spec.interval_s
            self.checkpoint_progress = self.progress - self.progress % it
        else:
            self.checkpoint_progress = self.progress

    def roll_back(self) -> None:
        """A restart: the work since the checkpoint is lost."""
        if self.spec.checkpoint == "flowcheck":
            self.checkpoint_now()
        self.lost["lost_work"] += self.progress - self.checkpoint_progress
        self.progress = self.checkpoint_progress


@dataclass
class Invariants:
    counts: Counter[str] = field(default_factory=Counter)
    first: dict[str, str] = field(default_factory=dict)

    def broken(self, name: str, what: str) -> None:
        self.counts[name] += 1
        self.first.setdefault(name, what)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True, slots=True)
class Curve:
    """GPU-hours lost so far (`lost`) at each simulated day in `days` (--plot)."""

    days: list[float]
    lost: list[float]


@dataclass(frozen=True, slots=True)
class TwinResult:
    policy: str
    seed: int
    days: float
    wall_s: float
    faults: dict[str, int]
    decisions: dict[str, int]
    events: int
    gpu_hours_lost: dict[str, float]  # by cause, all jobs
    gpu_hours_total: float  # elapsed minus progress, all jobs
    gpu_hours: float  # the cluster's jobs' GPU-hours in the simulated time
    violations: dict[str, int]
    first_violation: dict[str, str]
    reports: dict[str, int]  # late, twice, held, overtaken (see Twin.report_counts)
    fleet_aborts: int  # jobs with a dead rank the fleet manager aborted, the service not

    def as_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "seed": self.seed,
            "days": self.days,
            "wall_s": round(self.wall_s, 3),
            "faults": self.faults,
            "decisions": self.decisions,
            "events": self.events,
            "gpu_hours_lost": self.gpu_hours_lost,
            "gpu_hours_lost_total": self.gpu_hours_total,
            "gpu_hours": self.gpu_hours,
            "violations": self.violations,
            "first_violation": self.first_violation,
            "reports": self.reports,
            "fleet_aborts": self.fleet_aborts,
        }


def gpu_hours(jobs: Iterable[TwinJob], horizon: float) -> tuple[dict[str, float], float, float]:
    """GPU-hours lost by cause, lost in all (elapsed minus progress, kept apart from the
    causes, which must sum to it) and run, over `horizon` seconds."""
    lost = dict.fromkeys(CAUSES, 0.0)
    total = gpu_s = 0.0
    for job in jobs:
        gpus = job.spec.gpus
        for cause, s in job.lost.items():
            lost[cause] += s * gpus
        total += (horizon - job.progress) * gpus
        gpu_s += horizon * gpus
    return {c: s / 3600 for c, s in lost.items()}, total / 3600, gpu_s / 3600
