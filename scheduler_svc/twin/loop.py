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
- the invariants, counted: no command moves a rank onto a port whose newest report
  (by its observation time, among those the service has received) is down; a command
  names its job, the job's current incarnation and ranks the job has on
  the node; (job, communicator, epoch) names one plan; a job restarts at most once per
  fault evidence per placement; every event is stored once, however often it is sent.

Reports may be late, sent twice and out of order, stamped by skewed node clocks
(`Reports`), and an agent may be cut off (a PARTITION fault): the service must decide
on the newest observation of each port, not on the order reports arrive in.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from scheduler_svc.api.schemas.commands import CommandOut
from scheduler_svc.api.schemas.jobs import JobIn
from scheduler_svc.engine.decision import Policy
from scheduler_svc.fleet.client import RailoverClient
from scheduler_svc.planning.params import JobModel
from scheduler_svc.twin.books import Invariants, TwinJob, TwinResult, gpu_hours
from scheduler_svc.twin.cluster import (
    GPUS,
    ClusterSpec,
    Fault,
    FaultKind,
    JobShape,
    Reports,
    job_mix,
    leaf_names,
    leaf_of,
    node_name,
    trace,
)
from scheduler_svc.twin.fleet import FleetManager
from scheduler_svc.twin.hardware import hgx_node
from scheduler_svc.twin.harness import service, twin_settings
from scheduler_svc.twin.network import Network

log = logging.getLogger(__name__)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
COMM_ID = 1000  # job j's communicator over all its ranks: COMM_ID + j
LEAF_SPREAD_S = 2.0  # the nodes on a failed leaf report within this long
# How often a FlowCheck job (a checkpoint every iteration) tells the service: the newest
# one is all the service reads, and a failover is followed by one an iteration later
# (the checkpoint at which the service may restart the job).
FLOWCHECK_POST_S = 1800.0


class Twin(FleetManager):
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
        reports: Reports | None = None,
        shapes: Sequence[JobShape] = (),
        spare_reserve: int = 0,
        hard_failures_per_h: float = 0.0,
    ) -> None:
        self.spec = spec
        self.net = Network(
            reports or Reports(), seed=seed, nodes=spec.nodes, at=self.at, deliver=self.post
        )
        self.model = model or JobModel()
        self.days = days
        self.seed = seed
        self.policy = policy
        self.spare_reserve = spare_reserve
        self.hard_failures_per_h = hard_failures_per_h
        self.faults = (
            faults if faults is not None else trace(spec, self.model, days, seed, fault_scale)
        )
        self.db_url = db_url
        self.on_progress = progress
        self.jobs = {
            j.job_id: TwinJob(j, COMM_ID + i, list(j.nodes))
            for i, j in enumerate(job_mix(spec, self.model, shapes))
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
        # (node, rail) -> (observed_at, down) of the newest port report the service has
        self.reported: dict[tuple[str, int], tuple[str, bool]] = {}
        self.stored: set[str] = set()  # event ids the service has accepted
        self.waiting: list[TwinJob] = []  # aborted, no spare free for a broken node
        self.dead_gpus: dict[tuple[str, int], float] = {}  # -> when it was lost
        self.dead_nodes: dict[str, float] = {}  # -> when it died
        self.fleet_aborts = 0  # jobs the fleet manager aborted itself (a rank died)
        self.queue: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.now_s = 0.0

    # --- the loop ------------------------------------------------------------------------

    def run(self) -> TwinResult:
        started = time.perf_counter()
        horizon = self.days * 86400.0
        with (
            tempfile.TemporaryDirectory(prefix="railover-twin-") as tmp,
            service(
                twin_settings(
                    self.policy,
                    self.db_url,
                    Path(tmp),
                    spare_reserve=self.spare_reserve,
                    hard_failures_per_h=self.hard_failures_per_h,
                ),
                T0,
            ) as (app, url, clock),
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
            self.rv.register_node(node_name(i), self.node_body(node_name(i)))
        for job in self.jobs.values():
            self.post_job(job)

    def node_body(self, node: str) -> dict[str, Any]:
        """The node's registration: every GPU and RNIC (the twin registers a node only when
        all of it works)."""
        return hgx_node(switch_name=leaf_names(int(node[1:]), self.spec.nodes_per_leaf))

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
                # What the fleet manager knows when it posts: how many healthy nodes are
                # free to replace a broken one, and else how long getting one takes.
                "spares_free": len(self.free_nodes()),
                "node_replace_s": self.model.node_replace_h * 3600,
            }
            # One DP replica per node (8-way TP inside it): the service may restart the
            # job without a broken node when no spare is free.
            | (
                {"dp_size": len(job.nodes), "tp_size": GPUS, "allow_scaling": True}
                if job.spec.allow_scaling and len(job.nodes) > 1
                else {}
            )
        )
        out = self.rv.register_job(body)
        job.mode = out.mode
        self.deliver([job])

    def schedule_checkpoint(self, job: TwinJob, after: float) -> None:
        gen = job.generation
        step = FLOWCHECK_POST_S if job.spec.checkpoint == "flowcheck" else job.spec.interval_s
        self.at(self.now_s + max(after, step), lambda: self.checkpoint(job, gen))

    def tell_checkpoint(self, job: TwinJob) -> None:
        """The job's newest checkpoint, as of now, told to the service, with the fleet
        manager's word on how many spare nodes are free."""
        self.rv.report_checkpoint(
            job.spec.job_id,
            at=self.clock(),
            incarnation=job.incarnation,
            spares_free=len(self.free_nodes()),
        )

    def checkpoint(self, job: TwinJob, generation: int, *, again: bool = True) -> None:
        """The job checkpoints now (and, `again`, at its next time)."""
        if generation != job.generation:
            return  # the job restarted since: its own schedule runs
        job.accrue(self.now_s)
        if job.state == "up":
            job.checkpoint_now()
            job.checkpoint_at = self.now_s
            self.tell_checkpoint(job)
            if job.mode == "failed_over":  # the service re-decides a failed-over job only
                self.deliver([job])
            self.grow(job)
        if again and generation == job.generation:  # a job grown back has its own schedule
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
        elif f.kind == FaultKind.PARTITION:
            self.partition(node_name(f.node), f.repair_s)
        elif f.kind == FaultKind.GPU:
            self.gpu_lost(node_name(f.node), f.rail, f.repair_s)
        elif f.kind == FaultKind.NODE:
            self.node_lost(node_name(f.node), f.repair_s)
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
        if up:
            self.retry_waiting()

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
        """The node's agent reports its events, each with an id of its own and the node's
        clock; the network (`Reports`) says when they arrive."""
        at = self.net.clock(node, self.clock()).isoformat()
        stamped = [
            {"event_id": f"twin-{next(self.seq)}", "node": node, "observed_at": at} | e
            for e in events
        ]
        self.net.send(node, stamped, self.now_s)

    def post(self, node: str, stamped: list[dict[str, Any]]) -> None:
        """One POST of the node's events; the service must store each id once."""
        for job in self.jobs.values():  # FlowCheck jobs say their newest checkpoint first
            if node in job.nodes and job.spec.checkpoint == "flowcheck" and job.state == "up":
                job.accrue(self.now_s)
                self.tell_checkpoint(job)
        out = self.rv.report_events(stamped)
        self.events += len(stamped)
        ids = [e["event_id"] for e in stamped]
        new = len(set(ids) - self.stored)
        self.stored.update(ids)
        if (out.accepted, out.duplicates) != (new, len(ids) - new):
            self.invariants.broken(
                "event stored once",
                f"{node}: {new} new events of {len(ids)}, {out.accepted} accepted, "
                f"{out.duplicates} duplicates",
            )
        for e in stamped:
            if e["kind"] in ("port_down", "port_up", "device_fatal"):
                key = (node, int(e["device"].removeprefix("mlx5_")))
                newest = self.reported.get(key)
                if newest is None or newest[0] < e["observed_at"]:
                    self.reported[key] = (e["observed_at"], e["kind"] != "port_up")
                elif newest[0] > e["observed_at"]:
                    self.net.counts["overtaken"] += 1
        self.deliver([j for j in self.jobs.values() if node in j.nodes])
        self.deadlines()

    def partition(self, node: str, seconds: float) -> None:
        """The node's agent is cut off for `seconds`: then it sends what it kept, in order,
        and takes its commands."""
        if not self.net.cut(node):
            return

        def back() -> None:
            if node not in self.dead_nodes:  # else it comes back with its repair
                self.reconnect(node)

        self.at(self.now_s + seconds, back)

    def reconnect(self, node: str) -> None:
        self.net.heal(node)
        self.deliver([j for j in self.jobs.values() if node in j.nodes])

    def gpu_lost(self, node: str, gpu: int, repair_s: float) -> None:
        """A GPU falls off the bus: its rank dies and the agent says so; the node registers
        it again after the repair."""
        if (node, gpu) in self.dead_gpus or node in self.dead_nodes:
            return
        self.dead_gpus[(node, gpu)] = self.now_s
        self.ranks_die(node, {gpu})
        self.report(node, [{"kind": "device_lost", "gpu": gpu}])

        def repaired() -> None:
            self.dead_gpus.pop((node, gpu), None)
            if node not in self.dead_nodes:
                self.rv.register_node(node, self.node_body(node))
            self.retry_waiting()

        self.at(self.now_s + repair_s, repaired)

    def node_lost(self, node: str, repair_s: float) -> None:
        """The node dies: its ranks with it, its agent silent (its spool on disk keeps what
        it saw). After the repair it registers again and its agent sends the spool."""
        if node in self.dead_nodes:
            return
        self.dead_nodes[node] = self.now_s
        self.net.cut(node)
        self.ranks_die(node, set(range(GPUS)))

        def repaired() -> None:
            self.dead_nodes.pop(node, None)
            self.rv.register_node(node, self.node_body(node))
            self.reconnect(node)
            self.retry_waiting()

        self.at(self.now_s + repair_s, repaired)

    def ranks_die(self, node: str, gpus: set[int]) -> None:
        """Jobs with a rank on these GPUs hang until their collective's timeout and the
        launcher's detection; the fleet manager then aborts the job itself, unless the
        service has had it aborted by then."""
        for job in self.jobs.values():
            if node not in job.nodes or job.state == "down" or job.aborted:
                continue
            job.accrue(self.now_s)
            until = self.now_s + job.spec.timeout_s + job.spec.detect_s
            job.state, job.hung_until = "hung", max(job.hung_until, until)
            self.at(job.hung_until, partial(self.fleet_abort, job, job.generation))

    # --- what the service says --------------------------------------------------------

    def deliver(self, jobs: list[TwinJob]) -> None:
        """Each job's agents take the commands waiting for them and the ranks apply them."""
        for job in jobs:
            waiting = {c.node for c in self.rv.job_commands(job.spec.job_id, ("issued",))}
            for node in sorted(n for n in waiting if not self.net.is_cut(n)):
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
        """Check the port `rank` moves onto. The rank may live on another node than the
        command's: a communicator's FAILBACK tells every member which ranks return."""
        node = job.nodes[rank // GPUS]
        gpu = rank % GPUS
        rail = gpu ^ 1 if backup else gpu
        newest = self.reported.get((node, rail))
        if newest is not None and newest[1]:
            self.invariants.broken(
                "no rank onto a dead port",
                f"{c.kind} {c.command_id} (to {c.node}) of {job.spec.job_id} puts rank {rank} "
                f"on {node}/mlx5_{rail}, whose newest report ({newest[0]}) says down",
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
            if d.action == "restart_scaled":  # the fleet manager leaves these nodes out
                job.drop = tuple(d.drop_nodes)
            if d.action in ("restart", "restart_scaled"):
                key = (job.spec.job_id, self.evidence(job), nodes)
                if key in self.restarts:
                    self.invariants.broken(
                        "one restart per evidence and placement",
                        f"{job.spec.job_id} restarted again ({d.reason}) on the same nodes "
                        f"with nothing new broken since the last restart: {sorted(key[1])}",
                    )
                self.restarts.add(key)

    def evidence(self, job: TwinJob) -> frozenset[str]:
        """What is broken on the job's nodes now, as the twin broke it: the ports down, the
        CQE bursts still within the service's quiet period, and the GPUs and nodes lost
        (each loss its own evidence: a GPU lost again after its repair is new)."""
        quiet = self.now_s - self.settings.fault_quiet_s
        down = {f"{n}/mlx5_{r}" for (n, r), c in self.down.items() if c > 0 and n in job.nodes}
        cqe = {
            f"cqe {n}/mlx5_{r} at {t:.0f}"
            for n, r, t in self.bursts
            if t >= quiet and n in job.nodes
        }
        nodes = set(job.nodes)
        lost = {f"{n}/gpu{g} lost at {t:.0f}" for (n, g), t in self.dead_gpus.items() if n in nodes}
        lost |= {f"{n} died at {t:.0f}" for n, t in self.dead_nodes.items() if n in nodes}
        return frozenset(down | cqe | lost)

    # --- the books ---------------------------------------------------------------------

    def result(self, wall_s: float, horizon: float) -> TwinResult:
        lost, total, gpu_h = gpu_hours(self.jobs.values(), horizon)
        return TwinResult(
            policy=self.policy.value,
            seed=self.seed,
            days=self.days,
            wall_s=wall_s,
            faults=dict(self.fault_counts),
            decisions=dict(self.decisions),
            events=self.events,
            gpu_hours_lost=lost,
            gpu_hours_total=total,
            gpu_hours=gpu_h,
            violations=dict(self.invariants.counts),
            first_violation=dict(self.invariants.first),
            reports=dict(self.net.counts),
            fleet_aborts=self.fleet_aborts,
        )
