"""The fleet twin's closed loop: the real service, on a manual clock, driven through its
public API by a simulated cluster's agents, ranks and fleet manager.

The service is the whole product (`create_app`: store, reconciler, command delivery,
acks), in this process over loopback HTTP, on a store of its own; its coordinator thread
is off and the twin sweeps after each move of the clock instead, so a simulated month
runs in minutes. The twin decides nothing: it reports what happened
(scheduler_svc.twin.cluster), does what the service says, and keeps two books:

- GPU-seconds lost per job, by cause (hang: the collective's timeout and detection;
  lost work: progress rolled back to the checkpoint; reload; degraded: running failed
  over at the job's true k, (1 - 1/k) of the time; waiting: aborted, not yet placed
  again), and the total, elapsed minus progress, which the causes must sum to;
- the invariants, counted: no command moves a rank onto a port whose newest report is
  down; a command names its job, the job's current incarnation and ranks the job has on
  the node; (job, communicator, epoch) names one plan; a job restarts at most once per
  fault evidence per placement; every event is stored once.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from scheduler_svc.api.schemas.commands import CommandOut
from scheduler_svc.api.schemas.jobs import JobIn
from scheduler_svc.config import Settings
from scheduler_svc.engine.decision import Policy
from scheduler_svc.fleet.client import RailoverClient
from scheduler_svc.main import create_app
from scheduler_svc.planning.params import JobModel
from scheduler_svc.twin.cluster import (
    GPUS,
    RAILS,
    ClusterSpec,
    Fault,
    FaultKind,
    JobSpec,
    job_mix,
    leaf_names,
    leaf_of,
    node_name,
    trace,
)
from scheduler_svc.twin.hardware import hgx_node
from scheduler_svc.twin.inprocess import ManualClock, served_app

log = logging.getLogger(__name__)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
COMM_ID = 1000  # job j's communicator over all its ranks: COMM_ID + j
LEAF_SPREAD_S = 2.0  # the nodes on a failed leaf report within this long
CAUSES = ("hang", "lost_work", "reload", "degraded", "waiting")
# How often a FlowCheck job (a checkpoint every iteration) tells the service: the newest
# one is all the service reads, and a failover is followed by one an iteration later
# (the checkpoint at which the service may restart the job).
FLOWCHECK_POST_S = 1800.0


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
                if self.mode == "failed_over":
                    self.progress += (end - start) / self.spec.k
                    self.lost["degraded"] += (end - start) * (1 - 1 / self.spec.k)
                else:
                    self.progress += end - start
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
        }


def twin_settings(policy: Policy, db_url: str | None, tmp: Path) -> Settings:
    """The service's settings in the twin: its defaults, the policy under study, a store of
    its own (SQLite in `tmp`; `db_url` must name an empty one), and no coordinator thread
    (the twin sweeps after each move of its clock)."""
    return Settings(
        db_url=db_url or f"sqlite:///{tmp / 'twin.db'}",
        port=0,
        allow_anonymous_loopback=True,  # the twin's agents and driver call it without tokens
        policy=policy,
        coordinator=False,
        command_ack_timeout_s=10**6,  # the twin's agents answer at once
    )


@contextmanager
def service(settings: Settings) -> Iterator[tuple[FastAPI, str, ManualClock]]:
    """The real service on loopback, on a manual clock at T0."""
    clock = ManualClock(T0)
    app = create_app(settings, clock=clock)
    with served_app(app) as base_url:
        yield app, base_url, clock


class Twin:
    """One run: a cluster, a fault trace, one policy; `run()` returns the books."""

    def __init__(
        self,
        spec: ClusterSpec,
        *,
        days: float,
        seed: int,
        fault_scale: float,
        policy: Policy = Policy.RAILOVER,
        model: JobModel | None = None,
        faults: list[Fault] | None = None,
        db_url: str | None = None,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        self.spec = spec
        self.model = model or JobModel()
        self.days = days
        self.seed = seed
        self.policy = policy
        self.faults = (
            faults if faults is not None else trace(spec, self.model, days, seed, fault_scale)
        )
        self.db_url = db_url
        self.on_progress = progress
        self.jobs = {
            j.job_id: TwinJob(j, COMM_ID + i, list(j.nodes))
            for i, j in enumerate(job_mix(spec, self.model))
        }
        self.invariants = Invariants()
        self.down: Counter[tuple[str, int]] = Counter()  # (node, rail) -> reasons it is down
        self.decisions: Counter[str] = Counter()
        self.fault_counts: Counter[str] = Counter(f.kind.value for f in self.faults)
        self.events = 0
        self.plans: dict[tuple[str, int, int], tuple[Any, ...]] = {}
        self.restarts: set[tuple[str, frozenset[str], frozenset[str]]] = set()
        self.seen: set[str] = set()  # decision ids counted
        self.bursts: list[tuple[str, int, float]] = []  # CQE bursts: node, rail, when
        self.queue: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.now_s = 0.0

    # --- the loop ------------------------------------------------------------------------

    def run(self) -> TwinResult:
        started = time.perf_counter()
        horizon = self.days * 86400.0
        with (
            tempfile.TemporaryDirectory(prefix="railover-twin-") as tmp,
            service(twin_settings(self.policy, self.db_url, Path(tmp))) as (app, url, clock),
        ):
            self.app, self.clock, self.settings = app, clock, app.state.settings
            with RailoverClient(url, retries=0, timeout_s=120) as rv:
                self.rv = rv
                self.register()
                for f in self.faults:
                    self.at(f.at, partial(self.fault, f))
                for job in self.jobs.values():
                    self.schedule_checkpoint(job, job.spec.interval_s)
                while self.queue and self.queue[0][0] < horizon:
                    t, _, act = heapq.heappop(self.queue)
                    self.move_to(t)
                    act()
                    if self.on_progress is not None:
                        self.on_progress(t / horizon)
                self.move_to(horizon)
                for job in self.jobs.values():
                    job.accrue(horizon)
        return self.result(time.perf_counter() - started, horizon)

    def at(self, t: float, act: Callable[[], None]) -> None:
        heapq.heappush(self.queue, (t, next(self.seq), act))

    def move_to(self, t: float) -> None:
        """The clock to `t`, and what the service's deadlines make it do by then."""
        if t > self.now_s:
            self.clock.advance(t - self.now_s)
            self.now_s = t
            nodes = self.app.state.coordinator.sweep()
            if nodes:
                self.deliver([j for j in self.jobs.values() if nodes & set(j.nodes)])

    def deadlines(self) -> None:
        """Come back when what was just reported may clear (damping, quiet period): the
        service's sweep then fails back or closes faults on time, not at the next fault."""
        for after in (self.settings.failback_damping_s, self.settings.fault_quiet_s):
            self.at(self.now_s + after + 1, lambda: None)

    def when(self, t: float) -> str:
        return (T0 + timedelta(seconds=t)).isoformat()

    # --- the cluster and its jobs --------------------------------------------------------

    def register(self) -> None:
        for i in range(self.spec.nodes):
            body = hgx_node(switch_name=leaf_names(i, self.spec.nodes_per_leaf))
            self.rv.register_node(node_name(i), body)
        for job in self.jobs.values():
            self.post_job(job)

    def post_job(self, job: TwinJob) -> None:
        ranks = [
            {"rank": i * GPUS + g, "node": n, "gpu": g}
            for i, n in enumerate(job.nodes)
            for g in range(GPUS)
        ]
        body = JobIn.model_validate(
            {
                "job_id": job.spec.job_id,
                "ranks": ranks,
                "checkpoint_interval_s": job.spec.interval_s,
                "reload_s": job.spec.reload_s,
                "detect_s": job.spec.detect_s,
                "timeout_s": job.spec.timeout_s,
                "last_checkpoint_at": self.when(job.checkpoint_at),
                "slowdown_k": job.spec.k,
                "communicators": [{"comm_id": job.comm_id, "channels": 16}],
                "incarnation": job.incarnation,
            }
        )
        out = self.rv.register_job(body)
        job.mode = out.mode
        self.deliver([job])

    def schedule_checkpoint(self, job: TwinJob, after: float) -> None:
        gen = job.generation
        step = FLOWCHECK_POST_S if job.spec.checkpoint == "flowcheck" else job.spec.interval_s
        self.at(self.now_s + max(after, step), lambda: self.checkpoint(job, gen))

    def checkpoint(self, job: TwinJob, generation: int, *, again: bool = True) -> None:
        """The job checkpoints now (and, `again`, at its next time)."""
        if generation != job.generation:
            return  # the job restarted since: its own schedule runs
        job.accrue(self.now_s)
        if job.state == "up":
            job.checkpoint_now()
            job.checkpoint_at = self.now_s
            self.rv.report_checkpoint(job.spec.job_id, at=self.clock(), incarnation=job.incarnation)
            if job.mode == "failed_over":  # the service re-decides a failed-over job only
                self.deliver([job])
        if again:
            self.schedule_checkpoint(job, job.spec.interval_s)

    # --- faults ------------------------------------------------------------------------

    def fault(self, f: Fault) -> None:
        if f.kind == FaultKind.LEAF:
            assert f.leaf is not None
            nodes = [
                i
                for i in range(self.spec.nodes)
                if leaf_of(i, f.rail, self.spec.nodes_per_leaf) == f.leaf
            ]
            for k, i in enumerate(nodes):
                spread = LEAF_SPREAD_S * k / max(1, len(nodes))
                self.at(self.now_s + spread, partial(self.port, i, f.rail, False))
                self.at(self.now_s + f.repair_s + spread, partial(self.port, i, f.rail, True))
        elif f.kind == FaultKind.CQE:
            self.cqe(f.node, f.rail)
        else:
            self.port(f.node, f.rail, False, fatal=f.kind == FaultKind.RNIC)
            self.at(self.now_s + f.repair_s, lambda: self.port(f.node, f.rail, True))

    def port(self, i: int, rail: int, up: bool, *, fatal: bool = False) -> None:
        """One more (or one fewer) reason for node i's RNIC on `rail` to be down; its agent
        reports the change of level."""
        node, key = node_name(i), (node_name(i), rail)
        before = self.down[key]
        self.down[key] = before + (-1 if up else 1)
        if (up and self.down[key] > 0) or (not up and before > 0):
            return  # still down for another reason, or already down: no change of level
        kind = "port_up" if up else ("device_fatal" if fatal else "port_down")
        event: dict[str, Any] = {"kind": kind, "device": f"mlx5_{rail}"}
        if kind != "device_fatal":
            event["port"] = 1
        if not up:
            self.hit(node, rail)
        self.report(node, [event])

    def cqe(self, i: int, rail: int) -> None:
        node = node_name(i)
        self.bursts.append((node, rail, self.now_s))
        self.hit(node, rail)
        burst = {"kind": "cqe_error", "device": f"mlx5_{rail}", "port": 1, "wc_status": 12}
        self.report(node, [burst, dict(burst), dict(burst)])

    def hit(self, node: str, rail: int) -> None:
        """A job whose rank uses this port now hangs until its collective times out."""
        for job in self.jobs.values():
            if node not in job.nodes or job.state != "up":
                continue
            users = {job.rank_of(node, rail), job.rank_of(node, rail ^ 1)}
            on_it = {r for r in users if (r in job.on_backup) != (r % GPUS == rail)}
            if on_it:
                job.accrue(self.now_s)
                job.state, job.hung_until = "hung", self.now_s + job.spec.timeout_s

    def report(self, node: str, events: list[dict[str, Any]]) -> None:
        """The node's agent posts its events, each with an id of its own."""
        stamped = [
            {
                "event_id": f"twin-{next(self.seq)}",
                "node": node,
                "observed_at": self.when(self.now_s),
            }
            | e
            for e in events
        ]
        for job in self.jobs.values():  # FlowCheck jobs say their newest checkpoint first
            if node in job.nodes and job.spec.checkpoint == "flowcheck" and job.state == "up":
                job.accrue(self.now_s)
                self.rv.report_checkpoint(
                    job.spec.job_id, at=self.clock(), incarnation=job.incarnation
                )
        out = self.rv.report_events(stamped)
        self.events += len(stamped)
        if (out.accepted, out.duplicates) != (len(stamped), 0):
            self.invariants.broken(
                "event stored once",
                f"{node}: {len(stamped)} new events, {out.accepted} accepted, "
                f"{out.duplicates} duplicates",
            )
        self.deliver([j for j in self.jobs.values() if node in j.nodes])
        self.deadlines()

    # --- what the service says --------------------------------------------------------

    def deliver(self, jobs: list[TwinJob]) -> None:
        """Each job's agents take the commands waiting for them and the ranks apply them."""
        for job in jobs:
            waiting = {c.node for c in self.rv.job_commands(job.spec.job_id) if c.state == "issued"}
            for node in sorted(waiting):
                for c in self.rv.node_commands(node):
                    self.apply(c)
            self.refresh(job)

    def apply(self, c: CommandOut) -> None:
        job = self.jobs.get(c.job_id)
        if job is None or c.incarnation != job.incarnation:
            self.invariants.broken("command for its job", f"command {c.command_id}: {c}")
            return
        if any(r >= len(job.nodes) * GPUS or job.nodes[r // GPUS] != c.node for r in c.ranks):
            self.invariants.broken(
                "command for its job",
                f"command {c.command_id} to {c.node} names ranks {job.spec.job_id} has elsewhere",
            )
        plan = (c.kind, c.ops_done, tuple(c.disabled_channels), tuple(c.channel_weights))
        key = (job.spec.job_id, c.comm_id, c.epoch)
        if self.plans.setdefault(key, plan) != plan:
            self.invariants.broken("one plan per epoch", f"{key}: {self.plans[key]} and {plan}")
        if c.kind == "failover":
            for r in c.ranks:
                self.onto(job, c, r, backup=True)
            job.on_backup |= set(c.ranks)
        elif c.kind == "failback":
            back = set(c.returning if c.returning is not None else c.ranks)
            for r in back:
                self.onto(job, c, r, backup=False)
            job.on_backup -= back
        self.rv.ack_command(c.command_id, c.node, "applied")
        if c.kind == "abort" and not job.aborted:  # one ABORT to each node: the first
            self.aborted(job)

    def onto(self, job: TwinJob, c: CommandOut, rank: int, *, backup: bool) -> None:
        gpu = rank % GPUS
        rail = gpu ^ 1 if backup else gpu
        if self.down[(c.node, rail)] > 0:
            self.invariants.broken(
                "no rank onto a dead port",
                f"{c.kind} {c.command_id} of {job.spec.job_id} puts rank {rank} on "
                f"{c.node}/mlx5_{rail}, which is down",
            )

    def refresh(self, job: TwinJob) -> None:
        """The job's mode and new decisions, as the service has them."""
        out = self.rv.get_job(job.spec.job_id)
        job.accrue(self.now_s)
        if out.mode == "failed_over" != job.mode and job.spec.checkpoint == "flowcheck":
            once = partial(self.checkpoint, job, job.generation, again=False)
            self.at(self.now_s + job.spec.interval_s, once)
        job.mode = out.mode
        nodes = frozenset(job.nodes)
        for d in reversed(self.rv.decisions(job.spec.job_id, limit=20)):
            if d.decision_id in self.seen:
                continue
            self.seen.add(d.decision_id)
            self.decisions[d.action] += 1
            if d.action in ("restart", "restart_scaled"):
                key = (job.spec.job_id, self.evidence(job), nodes)
                if key in self.restarts:
                    self.invariants.broken(
                        "one restart per evidence and placement",
                        f"{job.spec.job_id} restarted again ({d.reason}) on the same nodes "
                        f"with nothing new broken since the last restart: {sorted(key[1])}",
                    )
                self.restarts.add(key)

    # --- the fleet manager ---------------------------------------------------------------

    def aborted(self, job: TwinJob) -> None:
        """The job's processes were aborted: it hangs until its timeout and detection, then
        the fleet manager requeues it from its checkpoint, a spare in place of each node
        with a part down where one is free."""
        job.accrue(self.now_s)
        job.roll_back()
        job.generation += 1
        # A restart at a checkpoint stops cleanly; after a fault the collective hangs
        # until its timeout, and the job's failure is detected.
        job.aborted = True
        if job.state == "hung":
            job.hung_until = max(
                job.hung_until, self.now_s + job.spec.timeout_s + job.spec.detect_s
            )
        else:
            job.state, job.hung_until = "down", self.now_s
        job.on_backup = set()
        self.at(job.hung_until, lambda: self.requeue(job))

    def requeue(self, job: TwinJob) -> None:
        job.accrue(self.now_s)
        taken = {n for j in self.jobs.values() for n in j.nodes}
        free = [
            node_name(i)
            for i in range(self.spec.nodes)
            if node_name(i) not in taken and not self.broken(node_name(i))
        ]
        job.nodes = [free.pop(0) if self.broken(n) and free else n for n in job.nodes]
        job.incarnation += 1
        job.aborted = False
        job.state, job.ready_at = "reloading", self.now_s + job.spec.reload_s
        self.post_job(job)
        self.schedule_checkpoint(job, job.spec.reload_s + job.spec.interval_s)

    def evidence(self, job: TwinJob) -> frozenset[str]:
        """What is broken on the job's nodes now, as the twin broke it: the ports down and
        the CQE bursts still within the service's quiet period."""
        quiet = self.now_s - self.settings.fault_quiet_s
        down = {f"{n}/mlx5_{r}" for (n, r), c in self.down.items() if c > 0 and n in job.nodes}
        cqe = {
            f"cqe {n}/mlx5_{r} at {t:.0f}"
            for n, r, t in self.bursts
            if t >= quiet and n in job.nodes
        }
        return frozenset(down | cqe)

    def broken(self, node: str) -> bool:
        return any(self.down[(node, r)] > 0 for r in range(RAILS))

    # --- the books ---------------------------------------------------------------------

    def result(self, wall_s: float, horizon: float) -> TwinResult:
        lost = dict.fromkeys(CAUSES, 0.0)
        total = 0.0
        gpu_s = 0.0
        for job in self.jobs.values():
            gpus = job.spec.gpus
            for cause, s in job.lost.items():
                lost[cause] += s * gpus
            total += (horizon - job.progress) * gpus
            gpu_s += horizon * gpus
        return TwinResult(
            policy=self.policy.value,
            seed=self.seed,
            days=self.days,
            wall_s=wall_s,
            faults=dict(self.fault_counts),
            decisions=dict(self.decisions),
            events=self.events,
            gpu_hours_lost={c: s / 3600 for c, s in lost.items()},
            gpu_hours_total=total / 3600,
            gpu_hours=gpu_s / 3600,
            violations=dict(self.invariants.counts),
            first_violation=dict(self.invariants.first),
        )
