"""Load a job's state, call engine.reconcile, store the decision, send the difference.

Every trigger ends here: it has recorded its evidence and names the jobs it
touched. Each job is reconciled under its row lock (the one decisions serialise
on, in sorted order everywhere), so two replicas handling one job's triggers run
one after the other and the second finds nothing left to do.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from sqlalchemy.orm import Session

from scheduler_svc import metrics
from scheduler_svc.api.schemas.paths import JobPathsOut, RankPathOut
from scheduler_svc.config import Settings
from scheduler_svc.engine import reconcile as engine
from scheduler_svc.engine.intents import Intent, IntentKind, command_diff
from scheduler_svc.engine.job_routes import backups_of, index_fits, index_for
from scheduler_svc.engine.nccl import NcclSpec
from scheduler_svc.engine.paths import NodePlan, NodeTopology
from scheduler_svc.engine.reconcile import recheck_at
from scheduler_svc.engine.routes import JobIndex
from scheduler_svc.engine.state import (
    CheckpointSeen,
    CommSpec,
    DecisionRecord,
    Desired,
    FabricView,
    JobState,
    MirrorFailureSeen,
    Mode,
    Options,
    Reconciled,
    open_mirror_failures,
    usable_checkpoint_at,
)
from scheduler_svc.errors import NotFound
from scheduler_svc.fleet import EventType, emit, emit_decision
from scheduler_svc.services import ccl, commands, fabric, gcpause
from scheduler_svc.store import models as m
from scheduler_svc.store.coordination import CoordinationRepo
from scheduler_svc.store.faults import OpenFault
from scheduler_svc.store.jobs import DecisionRepo, JobRepo
from scheduler_svc.store.nodes import NodeRepo
from scheduler_svc.store.types import CommandKind
from scheduler_svc.store.uow import after_answer, hold, release

log = logging.getLogger(__name__)

# The kind of checkpoint a job takes itself (not rebuilt by FlowCheck).
FULL = "full"


def options(settings: Settings) -> Options:
    return Options(
        default_k=settings.default_k,
        default_repair_s=settings.default_repair_s,
        measured_k_tolerance=settings.measured_k_tolerance,
        nvl_mb_per_channel=settings.nvl_mb_per_channel,
        nvl_cap_mb=settings.nvl_cap_mb,
        failback_retry_s=settings.failback_damping_s,
        policy=settings.policy,
        spare_reserve=settings.spare_reserve,
        hard_failures_per_h=settings.hard_failures_per_h,
    )


def mirror_failures(session: Session, job_id: str) -> tuple[int | None, list[MirrorFailureSeen]]:
    """The highest iteration of a normal checkpoint, and the rebuild failures from it on.

    A job that never had one costs one indexed lookup per pass.
    """
    repo = JobRepo(session)
    if not repo.has_mirror_failures(job_id):
        return None, []
    top = repo.highest_checkpoint_iteration(job_id, FULL)
    seen = []
    for f in repo.mirror_failures_from(job_id, top):
        below = repo.checkpoint_below(job_id, f.iteration)
        seen.append(MirrorFailureSeen(f.id, f.iteration, f.at, None if below is None else below.at))
    return top, seen


def job_state(
    session: Session, job: m.Job, ranks: tuple[tuple[int, str, int], ...] | None = None
) -> JobState:
    """The job as the engine reads it; `ranks`: its placement, when already known."""
    cp = JobRepo(session).newest_checkpoint(job.job_id, job.incarnation)
    top, failures = mirror_failures(session, job.job_id)
    comms = CoordinationRepo(session).communicators(job.job_id)
    hold(session, comms)  # the pass's switch points take their next epoch from these rows
    return JobState(
        job_id=job.job_id,
        mode=Mode(job.mode),
        ranks=tuple(JobRepo(session).rank_tuples(job.job_id)) if ranks is None else ranks,
        checkpoint_interval_s=job.checkpoint_interval_s,
        reload_s=job.reload_s,
        detect_s=job.detect_s,
        timeout_s=job.timeout_s,
        last_checkpoint_at=job.last_checkpoint_at,
        communicators=tuple(CommSpec(c.comm_id, c.channels, tuple(c.ranks)) for c in comms),
        slowdown_k=job.slowdown_k,
        measured_k=job.measured_k,
        comm_share=job.comm_share,
        dp_size=job.dp_size,
        tp_size=job.tp_size,
        pp_size=job.pp_size,
        allow_scaling=job.allow_scaling,
        spare_nodes=job.spare_nodes,
        spares_free=job.spares_free,
        node_replace_s=job.node_replace_s,
        nvl_cap_mb=job.nvl_cap_mb,
        repair_estimate_s=job.repair_estimate_s,
        failed_over_at=job.failed_over_at,
        restart_decided_at=job.restart_decided_at,
        registering=job.desired is None,
        newest_checkpoint=None
        if cp is None
        else CheckpointSeen(cp.id, cp.at, cp.received_at, cp.kind, cp.iteration),
        previous=Desired.from_json(job.desired),
        nccl=NcclSpec.from_declaration(job.ccl)
        if job.ccl is not None and ccl.is_stock_nccl(job)
        else None,
        mirror_failures=tuple(failures),
        full_checkpoint_iteration=top,
        full_checkpoint_unnumbered_at=JobRepo(session).newest_unnumbered_checkpoint_at(
            job.job_id, FULL
        )
        if failures
        else None,
    )


@dataclass(frozen=True, eq=False)
class _Placed:
    """One job's placement on its nodes: what a decision would otherwise read and route again."""

    fleet: int  # NodeRepo.fleet_stamp when the plans were last checked
    topologies: Mapping[str, NodeTopology]
    plans: Mapping[str, NodePlan]
    ports: Mapping[str, frozenset[tuple[str, int]]]
    index: JobIndex | None = None


@dataclass(eq=False)
class _Job:
    ranks: tuple[tuple[int, str, int], ...]
    nodes: set[str]
    placed: dict[tuple[object, ...], _Placed]  # by (lost parts, backup cap)


class JobIndexCache:
    """Per job: its ranks, its nodes' plans and its engine index (issue 12).

    Keyed by (store, job, creation time, placement id): the ranks never change under
    one key. The plans and the index are kept per set of lost parts and are
    trusted while the fleet's registration stamp is unchanged; when it changes (some
    node registered anew), the job's nodes are checked against the plan cache one by
    one, and the index is rebuilt only if one of their plans changed. So every replica
    decides on the same index, built once per placement and plans.
    """

    def __init__(self, max_jobs: int = 32) -> None:
        self._jobs: OrderedDict[tuple[object, ...], _Job] = OrderedDict()
        self._lock = threading.Lock()
        self._max = max_jobs

    def clear(self) -> None:
        with self._lock:
            self._jobs.clear()

    @staticmethod
    def _key(session: Session, job: m.Job) -> tuple[object, ...]:
        store = session.get_bind().engine.url.render_as_string(hide_password=True)
        return (store, job.job_id, job.created_at, job.placement_id)

    def job(self, session: Session, job: m.Job) -> tuple[tuple[object, ...], _Job]:
        key = self._key(session, job)
        with self._lock:
            hit = self._jobs.get(key)
            if hit is not None:
                self._jobs.move_to_end(key)
                return key, hit
        return key, self._put(session, key, tuple(JobRepo(session).rank_tuples(job.job_id)))

    def seed(self, session: Session, job: m.Job, ranks: Iterable[tuple[int, str, int]]) -> None:
        """A placement being stored in this transaction, with its (rank, node, gpu) as
        posted, so its first pass need not read 65,536 rows back. Its placement id is
        new, so if the transaction rolls back no other placement can find this entry."""
        self._put(session, self._key(session, job), tuple(sorted(ranks)))

    def _put(
        self, session: Session, key: tuple[object, ...], ranks: tuple[tuple[int, str, int], ...]
    ) -> _Job:
        """Keep the job's entry for this placement, and only it: a job placed anew (its
        next incarnation, a re-post) is never read under its old placement again, and
        each entry of a 65,536-rank job holds megabytes of index."""
        entry = _Job(ranks, {n for _, n, _ in ranks}, {})
        job = key[:2]  # (store, job id)
        evicted = []
        with self._lock:
            for old in [k for k in self._jobs if k[:2] == job and k != key]:
                evicted.append(self._jobs.pop(old))
            self._jobs[key] = entry
            while len(self._jobs) > self._max:
                evicted.append(self._jobs.popitem(last=False)[1])
        if evicted:  # freeing a 65,536-rank job's index takes a tenth of a second
            after_answer(session, evicted.clear)
        return entry

    def placed(
        self,
        session: Session,
        entry: _Job,
        settings: Settings,
        lost: dict[str, list[OpenFault]],
    ) -> _Placed:
        """The job's nodes' plans for these lost parts: kept while no node registered anew."""
        which = (
            tuple(sorted((n, tuple(f.id for f in fs)) for n, fs in lost.items())),
            settings.backup_cap_per_switch,
        )
        fleet = NodeRepo(session).fleet_stamp()
        with self._lock:
            was = entry.placed.get(which)
        if was is not None and was.fleet == fleet:
            return was
        topologies, plans, ports = fabric.placement(session, entry.nodes, settings, lost)
        if was is not None and was.index is not None and was.index.built_on(plans, topologies):
            now = replace(was, fleet=fleet)  # nothing of this job changed: keep its index
        else:
            now = _Placed(fleet, topologies, plans, ports)
        with self._lock:
            entry.placed[which] = now
            while len(entry.placed) > 2:
                entry.placed.pop(next(iter(entry.placed)))
        return now

    def index(
        self, entry: _Job, placed: _Placed, state: JobState, view: FabricView
    ) -> JobIndex | None:
        """The engine index for this placement and the job's communicators, built once."""
        if placed.index is not None and index_fits(placed.index, state, view):
            return placed.index
        try:
            with gcpause.paused():
                built = index_for(state, view)
        except ValueError:
            return None  # a rank placed twice: the engine reads such a job whole
        with self._lock:
            for which, p in entry.placed.items():
                if p is placed:
                    entry.placed[which] = replace(placed, index=built)
        return built


INDEXES = JobIndexCache()


def lookups_after_answer(session: Session, index: JobIndex | None) -> None:
    """Have an index's fault lookups made after the request's answer, unless they are:
    neither the registration that built it nor the first fault then waits for them."""
    if index is not None and not index.lookups.made:
        after_answer(session, index.warm)


def current(
    session: Session, job: m.Job, now: datetime, settings: Settings
) -> tuple[JobState, FabricView, Reconciled]:
    """What reconcile says about the job right now, without storing anything (for reads)."""
    if job.placement_id is None:  # placed before placement ids: read and route it whole
        state = job_state(session, job)
        view, _ = fabric.view_for(session, {n for _, n, _ in state.ranks}, now, settings)
        return state, view, engine.reconcile(now, state, view, options(settings))
    _, entry = INDEXES.job(session, job)
    state = job_state(session, job, entry.ranks)
    chosen: list[_Placed] = []

    def placed(lost: dict[str, list[OpenFault]]) -> fabric.Placement:
        p = INDEXES.placed(session, entry, settings, lost)
        chosen.append(p)
        return p.topologies, p.plans, p.ports

    view, _ = fabric.view_for(session, entry.nodes, now, settings, placed)
    index = INDEXES.index(entry, chosen[0], state, view)
    lookups_after_answer(session, index)
    return state, view, engine.reconcile(now, state, view, options(settings), index)


def reconcile_jobs(
    session: Session, job_ids: Iterable[str], now: datetime, settings: Settings
) -> list[m.Decision]:
    """Reconcile each job (sorted: one lock order everywhere); the decisions it made.

    Each job in a savepoint of its own: one job that cannot be reconciled must not
    refuse the evidence (an agent would resend the batch forever) nor hold up the
    other jobs. It is marked, logged, and the coordinator's sweep tries it again. A
    job reconciled is due again only when its desired state says so (`reconcile_job`).
    """
    made = []
    jobs = JobRepo(session)
    for job_id in sorted(set(job_ids)):
        job = jobs.lock(job_id)
        if job is None:
            continue
        try:
            with session.begin_nested():
                row = reconcile_job(session, job, now, settings)
        except Exception:
            log.exception("reconciling job %s failed; the coordinator retries it", job_id)
            job = jobs.lock(job_id)  # the savepoint's rollback expired it
            if job is not None:
                job.reconcile_due_at = now
            continue
        finally:
            release(session)  # the rows this job's pass held (uow.hold)
        if row is not None:
            made.append(row)
    return made


def reconcile_job(
    session: Session, job: m.Job, now: datetime, settings: Settings
) -> m.Decision | None:
    """One pass for a locked job: store the decision if the outcome changed, send the diff."""
    state, _, out = current(session, job, now, settings)
    overtaken = _overtake_returns(session, job, out, now, rank_by_rank=not state.communicators)
    if overtaken:
        state, _, out = current(session, job, now, settings)  # from where the ranks really are
    row = None
    if out.decision is not None:
        row = record_decision(session, job, out.decision, now)
    desired = out.desired
    _enter_mode(session, job, desired.mode, now)
    commanded = Desired.from_json(job.commanded)
    index = out.conn.index
    intents = command_diff(commanded, desired, state, index)
    overrides = replacing_overtaken(overtaken, intents, desired, state)
    # A restarting job is asked nothing: its next incarnation is, if still wanted then.
    asked = desired.checkpoint_after if desired.mode != Mode.RESTARTING else None
    if asked is not None and asked != commanded.checkpoint_after:
        # Told to the fleet even where no rank takes commands (stock NCCL); the
        # checkpoint_now commands are among the intents.
        request_checkpoint(session, job, asked, state, now)
        job.commanded = replace(commanded, checkpoint_after=asked).to_json()
    elif desired.checkpoint_after is None and commanded.checkpoint_after is not None:
        # A checkpoint newer than the failed iteration came: nothing left to ask for.
        commands.withdraw(session, job, CommandKind.CHECKPOINT_NOW, now)
        job.commanded = replace(commanded, checkpoint_after=None).to_json()
    if state.nccl is not None:
        intents = []  # stock NCCL reads no commands: its own failover does the moving
        job.commanded = desired.to_json()
    # The overrides first: newer than the fail-back they overtake (epochs only grow), so a
    # rank that armed it drops it.
    intents = [*overrides, *intents]
    if intents:
        commands.issue(
            session,
            job,
            intents,
            {r: n for r, n, _ in state.ranks} if index is None else index.rank_node,
            decision_id=None if row is None else row.decision_id,
            now=now,
            settings=settings,
        )
        job.commanded = desired.to_json()
    new_json = desired.to_json()
    if job.desired != new_json:
        job.desired = new_json
    # Done for now, unless time alone changes the outcome (a refused fail-back is tried
    # again then): the coordinator's sweep reconciles the job at that moment.
    due = recheck_at(desired, options(settings))
    if job.reconcile_due_at != due:
        job.reconcile_due_at = due
    return row


def _enter_mode(session: Session, job: m.Job, mode: Mode, now: datetime) -> None:
    """Move the locked job into the pass's mode, stamping when it failed over or was
    decided to restart, and forgetting what its ended incarnation was told."""
    was = Mode(job.mode)
    if was == Mode.RESTARTING and job.restart_decided_at is None:
        # The next incarnation started: its processes have been told nothing yet, and it
        # runs from the start (a restart decided for it now aborts it, not the last one).
        job.commanded = Desired().to_json()
        job.failed_over_at = None
        job.measured_k = None
        was = Mode.NORMAL
    if mode == Mode.FAILED_OVER and was != Mode.FAILED_OVER:
        job.failed_over_at = now
    elif mode == Mode.RESTARTING and was != Mode.RESTARTING:
        job.restart_decided_at = now
    elif mode == Mode.NORMAL and was == Mode.FAILED_OVER:
        job.failed_over_at, job.measured_k = None, None
        CoordinationRepo(session).clear_samples(job.job_id, degraded=True)
    job.mode = mode.value


def _overtake_returns(
    session: Session, job: m.Job, out: Reconciled, now: datetime, *, rank_by_rank: bool
) -> list[commands.Overtaken]:
    """A failover overtaking a fail-back on its way (issue 28, case 4): supersede it, and
    take up the job from where its ranks really are.

    The ranks that fail-back was returning never left their backups, so the stored
    desired and commanded states get them back as moved (those the new pass keeps moved
    are its news to decide; the others return, or wait, by the usual rules); except
    those whose FAILOVER the fail-back withdrew on its way: they never left their primary.
    """
    desired = out.desired
    if desired.mode != Mode.FAILED_OVER:
        return []  # a restart's ABORT supersedes everything already
    commanded = Desired.from_json(job.commanded)
    if all(commanded.moved.get(r) == k for r, k in desired.moved.items()):
        return []  # nobody newly on a backup: nothing to overtake
    overtaken = commands.overtake_returns(
        session, job, set(desired.moved), now, rank_by_rank=rank_by_rank
    )
    if not overtaken:
        return []
    returning = {r for o in overtaken for r in o.returning}
    backups = backups_of(out.conn, sorted(commands.left_their_primary(session, job, returning)))
    prev = Desired.from_json(job.desired)
    kept = {r: k for r, k in backups.items() if r not in desired.moved and r not in prev.moved}
    if kept:
        job.desired = replace(prev, mode=Mode.FAILED_OVER, moved={**kept, **prev.moved}).to_json()
    job.commanded = replace(commanded, moved={**backups, **commanded.moved}).to_json()
    return overtaken


def replacing_overtaken(
    overtaken: list[commands.Overtaken],
    intents: list[Intent],
    desired: Desired,
    state: JobState,
) -> list[Intent]:
    """What replaces, at the ranks, each fail-back that a failover overtook.

    A registered communicator gets a switch point of its plan now (a REBALANCE, unless
    the pass already sends it one), whose newer epoch replaces the armed fail-back on
    every rank. Without communicators each rank kept on its backup is told so again.
    """
    if not overtaken:  # every pass but a failover's over an armed fail-back: no rank read
        return []
    switched = {i.comm_id for i in intents if i.coordinated}
    members = {c.comm_id: c.ranks for c in state.communicators}
    sent = {r for i in intents if i.kind == IntentKind.FAILOVER for r in i.ranks}
    out = []
    for o in overtaken:
        if not state.communicators:
            # Told again, unless the pass moves it anyway (a FAILOVER the fail-back had
            # withdrawn never reached it: commands.left_their_primary).
            stay = tuple(r for r in o.ranks if r in desired.moved and r not in sent)
            if stay:
                out.append(Intent(IntentKind.FAILOVER, o.comm_id, stay))
        elif o.comm_id not in switched:
            ranks = tuple(sorted(members.get(o.comm_id) or (r for r, _, _ in state.ranks)))
            disabled = tuple(desired.disabled.get(o.comm_id, ()))
            out.append(Intent(IntentKind.REBALANCE, o.comm_id, ranks, disabled))
    return out


def request_checkpoint(
    session: Session, job: m.Job, iteration: int, state: JobState, now: datetime
) -> None:
    """io.railover.job.checkpoint_requested: the job should checkpoint at its next iteration."""
    metrics.CHECKPOINT_REQUESTS.inc()
    failures = open_mirror_failures(state)
    emit(
        session,
        EventType.JOB_CHECKPOINT_REQUESTED,
        job_id=job.job_id,
        subject=f"job/{job.job_id}",
        data={
            "job_id": job.job_id,
            "after_iteration": iteration,
            "failed_iterations": [f.iteration for f in failures],
            "usable_checkpoint_at": usable_checkpoint_at(state).isoformat(),
            "ranks": [r for r, _, _ in state.ranks],
            "reason": f"a checkpoint node could not rebuild iteration {iteration}: take a "
            "normal checkpoint at the next iteration",
        },
        now=now,
    )
    log.info("job %s: checkpoint requested after iteration %d", job.job_id, iteration)


def record_decision(session: Session, job: m.Job, d: DecisionRecord, now: datetime) -> m.Decision:
    """Store one entry of the job's decision history and announce it."""
    fault_id = None
    if d.fault_key is not None and d.fault_key.startswith("fault:"):
        fault_id = int(d.fault_key.split(":", 1)[1])
    row = m.Decision(
        decision_id=str(uuid.uuid4()),
        job_id=job.job_id,
        seq=job.decision_count + 1,
        trigger=d.trigger[:128],
        fault_id=fault_id,
        action=d.action.value,
        reason=d.reason,
        inputs=d.inputs,
        costs_s=d.costs_s,
        costs_gpu_s=d.costs_gpu_s,
        plan=d.plan,
        created_at=now,
        saved_gpu_s=d.saved_gpu_s,
    )
    if DecisionRepo(session).add(row) is None:
        # The same evidence changed the outcome again (it came back, say): one history.
        row.trigger = f"{d.trigger}#{job.decision_count + 1}"[:128]
        session.add(row)
        session.flush()
    job.decision_count += 1
    metrics.DECISIONS.labels(action=d.action.value).inc()
    emit_decision(session, job, row)  # outbox row in this transaction
    return row


@dataclass(frozen=True)
class RankPage:
    """Which ranks of a job one answer shows: those after `after_rank`, at most `limit`."""

    after_rank: int = -1
    limit: int = 1 << 30
    node: str | None = None


def job_paths(
    session: Session, job_id: str, now: datetime, settings: Settings, page: RankPage = RankPage()
) -> JobPathsOut:
    """A page of the ranks' primary and backup, whether each works now, and the one in use."""
    job = JobRepo(session).get(job_id)
    if job is None:
        raise NotFound(f"job {job_id!r} does not exist")
    if page.node is not None and NodeRepo(session).get(page.node) is None:
        raise NotFound(f"node {page.node!r} is not registered")
    _, view, out = current(session, job, now, settings)
    moved = dict(out.desired.moved)
    chosen = sorted(
        (
            r
            for r in out.conn.routes
            if r.rank > page.after_rank and (page.node is None or r.node == page.node)
        ),
        key=lambda r: r.rank,
    )
    more = len(chosen) > page.limit
    chosen = chosen[: page.limit]
    ranks = []
    for r in chosen:
        plan = view.plans.get(r.node)
        g = None
        if plan is not None and plan.has_gpu(r.gpu):
            g = plan.for_gpu(r.gpu)
        # The path it is on, where that works: none for a rank whose every path failed.
        active = moved[r.rank] if r.rank in moved and r.backup_ok else None
        if r.rank not in moved and r.primary_ok:
            active = r.primary
        if job.mode == Mode.RESTARTING.value:
            active = None
        ranks.append(
            RankPathOut(
                rank=r.rank,
                node=r.node,
                gpu=r.gpu,
                primary=r.primary,
                backup=r.backup,
                primary_switch=None if g is None else g.primary_switch,
                backup_switch=None if g is None else g.backup_switch,
                rail_disjoint=False if g is None else g.rail_disjoint,
                primary_ok=r.primary_ok,
                backup_ok=r.backup_ok,
                active=active,
            )
        )
    return JobPathsOut(
        job_id=job_id,
        ranks=ranks,
        next_after_rank=chosen[-1].rank if more else None,
        broken_pairs=out.conn.broken_pairs,
        total_pairs=out.conn.total_pairs,
        isolated_ranks=list(out.conn.isolated_ranks),
        failed_over_ranks=sorted(moved),
        warnings=list(out.warnings),
    )
