"""Turning faults into decisions and commands for the jobs they touch.

The arithmetic is the engine's; this module gathers its inputs from the store,
stores what it returns, and issues the commands that follow from it.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from scheduler_svc import metrics
from scheduler_svc.config import Settings
from scheduler_svc.engine import decision as engine
from scheduler_svc.engine.paths import (
    Connectivity,
    FailedSet,
    Gpu,
    NodePlan,
    NodeTopology,
    Rnic,
    bandwidth_left,
    connectivity,
    plan_node,
    route_ranks,
)
from scheduler_svc.engine.slowdown import estimate_k
from scheduler_svc.fleet import emit_decision
from scheduler_svc.services import ccl, coordination
from scheduler_svc.store import models as m
from scheduler_svc.store.repositories import (
    CommandRepo,
    CoordinationRepo,
    DecisionRepo,
    FaultRepo,
    JobRepo,
    NodeRepo,
)

WHOLE_DEVICE = m.WHOLE_DEVICE_PORT


def node_topology(node: m.Node) -> NodeTopology:
    return NodeTopology(
        name=node.name,
        gpus=tuple(
            Gpu(g.index, g.pci, g.numa, g.pcie_switch, g.root_complex, g.nvlink) for g in node.gpus
        ),
        rnics=tuple(
            Rnic(
                r.name,
                r.port,
                r.pci,
                r.numa,
                r.pcie_switch,
                r.root_complex,
                r.rate_gbps,
                r.switch,
                r.rail,
                r.state,
            )
            for r in node.rnics
        ),
    )


def failed_set(
    faults: Iterable[m.Fault],
    switches: Iterable[str] = (),
    dead_nodes: Iterable[NodeTopology] = (),
) -> FailedSet:
    rnics, links = set(), set()
    for f in faults:
        if f.port == WHOLE_DEVICE:
            rnics.add((f.node, f.device))
        else:
            links.add((f.node, f.device, f.port))
    for topo in dead_nodes:
        rnics.update((topo.name, r.name) for r in topo.rnics)
    return FailedSet(rnics=frozenset(rnics), links=frozenset(links), switches=frozenset(switches))


@dataclass(frozen=True)
class JobView:
    """A job's paths under the faults open right now."""

    topologies: dict[str, NodeTopology]
    plans: dict[str, NodePlan]
    conn: Connectivity
    faults: list[m.Fault]
    switches: list[str]

    @property
    def warnings(self) -> list[str]:
        return [w for p in self.plans.values() for w in p.warnings]


class PlanCache:
    """Node topologies and s-Bond plans by (node, topology version, registration, cap).

    A plan is a pure function of the topology, and a topology never changes
    under a version number of one registration, so entries stay valid on every
    replica; a 1,024-GPU decision then reads 128 version numbers instead of
    2,048 GPU and RNIC rows.
    """

    def __init__(self, max_entries: int = 50_000) -> None:
        self._entries: OrderedDict[tuple[object, ...], tuple[NodeTopology, NodePlan]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()
        self._max = max_entries

    def get(
        self, session: Session, names: set[str], backup_cap: int | None
    ) -> tuple[dict[str, NodeTopology], dict[str, NodePlan]]:
        repo = NodeRepo(session)
        versions = repo.versions(names)
        missing_nodes = sorted(names - versions.keys())
        if missing_nodes:
            raise LookupError(f"nodes not registered: {', '.join(missing_nodes)}")
        keys = {name: (name, *stamp, backup_cap) for name, stamp in versions.items()}
        found: dict[str, tuple[NodeTopology, NodePlan]] = {}
        with self._lock:
            for name, key in keys.items():
                hit = self._entries.get(key)
                if hit is not None:
                    self._entries.move_to_end(key)
                    found[name] = hit
        misses = [n for n in versions if n not in found]
        if misses:
            for name, node in repo.get_many(misses).items():
                topo = node_topology(node)
                entry = (topo, plan_node(topo, backup_cap))
                found[name] = entry
                key = (name, node.topology_version, node.registered_at, backup_cap)
                with self._lock:
                    self._entries[key] = entry
                    while len(self._entries) > self._max:
                        self._entries.popitem(last=False)
        return {n: e[0] for n, e in found.items()}, {n: e[1] for n, e in found.items()}


PLANS = PlanCache()


def job_view(
    session: Session,
    job: m.Job,
    backup_cap: int | None,
    unreachable: frozenset[str] = frozenset(),
) -> JobView:
    """The job's routes under every open fault and inferred switch failure.

    `unreachable` nodes count as having lost every RNIC (commands to them
    went unacknowledged, so their ranks cannot be moved).
    """
    ranks = JobRepo(session).rank_tuples(job.job_id)
    names = {node for _, node, _ in ranks}
    topologies, plans = PLANS.get(session, names, backup_cap)
    faults = list(FaultRepo(session).open_on_nodes(names))
    switches = sorted({sf.switch for sf in CoordinationRepo(session).open_switch_faults()})
    failed = failed_set(faults, switches, (topologies[n] for n in sorted(unreachable & names)))
    routes = route_ranks(ranks, plans, topologies, failed)
    return JobView(topologies, plans, connectivity(routes), faults, switches)


def _faults_touching(view: JobView) -> list[m.Fault]:
    """Open faults on an RNIC port that some rank of the job uses as primary or backup."""
    used = {(r.node, key) for r in view.conn.routes for key in (r.primary, r.backup) if key}
    touching = []
    for f in view.faults:
        for node, key in used:
            dev, _, port = key.partition("/")
            if node == f.node and dev == f.device and f.port in (WHOLE_DEVICE, int(port)):
                touching.append(f)
                break
    return touching


def decide_for_job(
    session: Session,
    job: m.Job,
    *,
    trigger: str,
    fault: m.Fault | None,
    at: datetime,
    now: datetime,
    settings: Settings,
    note: str | None = None,
    unreachable: frozenset[str] = frozenset(),
) -> m.Decision | None:
    """Decide for one job over everything still failed; store it with its commands.

    `at` is when the triggering change happened (it sets t_elapsed); `now`
    stamps the decision; `note` says why a re-decision happened. Returns None
    when this trigger was already decided (by this or another replica).
    """
    decisions = DecisionRepo(session)
    if decisions.exists(job.job_id, trigger):
        return None
    view = job_view(session, job, settings.backup_cap_per_switch, unreachable)
    conn = view.conn
    # Port faults on a switch known to have failed are that one failure, not more.
    touching = [f for f in _faults_touching(view) if f.switch not in view.switches]
    concurrent = len(touching) + len(view.switches)
    affected = bool(conn.failed_over_ranks or conn.isolated_ranks or conn.broken_pairs)
    # Only the bandwidth model needs this, and it walks every rank.
    bw = bandwidth_left(conn.routes, view.topologies) if job.comm_share is not None else None
    estimate = estimate_k(
        measured_k=job.measured_k if job.measured_k is not None else job.slowdown_k,
        comm_share=job.comm_share,
        bandwidth_left=bw,
        concurrent_faults=max(1, concurrent),
        table=settings.default_k,
    )
    # ---- Stock NCCL (issue 16) -------------------------------------------------------------
    # A job that declared `ccl: nccl` fails over inside NCCL's virtual NICs by itself:
    # what NCCL survives replaces the s-Bond path check, and Railover sends it no
    # path commands (no failover, DCR or switch points; a restart goes through the
    # fleet manager). The lines below marked "stock NCCL" are the rest of this hook.
    nccl_domain = ccl.nccl_domain(job, view)
    path_available = conn.all_pairs_survive if nccl_domain is None else nccl_domain.path_available
    if nccl_domain is not None:
        affected = nccl_domain.affected
    # ---- end stock NCCL ---------------------------------------------------------------------
    elapsed = max(0.0, (at - job.last_checkpoint_at).total_seconds())
    inputs = engine.DecisionInputs(
        checkpoint_interval_s=job.checkpoint_interval_s,
        elapsed_s=elapsed,
        detect_s=job.detect_s,
        reload_s=job.reload_s,
        timeout_s=job.timeout_s,
        k=estimate.k,
        k_source=estimate.source.value,
        gpus=len(conn.routes),
        path_available=path_available,
        # The port came back before anyone decided (a flap reported with its recovery).
        healed=fault is not None and fault.cleared_at is not None and not affected,
        affected=affected,
        dp_size=job.dp_size,
        allow_scaling=job.allow_scaling,
        spare_nodes=job.spare_nodes,
        node_replace_s=job.node_replace_s,
    )
    result = engine.decide(inputs)
    reasons = [result.reason]
    if nccl_domain is None and not conn.all_pairs_survive:
        reasons.insert(
            0,
            f"{conn.broken_pairs} rank pair(s) across nodes have no path left "
            f"({len(conn.isolated_ranks)} rank(s) lost both RNICs)",
        )
    dead = coordination.node_failure_note(session, {r.node for r in conn.routes}, view)
    if dead:
        reasons.insert(0, dead)
    if note:
        reasons.insert(0, note)
    plan = _plan(view, bw, estimate.detail, result)
    if nccl_domain is not None:  # stock NCCL: NCCL's own failover is the plan
        reasons.insert(0, nccl_domain.reason)
        plan.update(mitigation="nccl", failed_over=[], nccl=nccl_domain.record())
    comm_plans: list[coordination.CommPlan] = []
    if result.action == engine.Action.FAILOVER and nccl_domain is None:  # stock NCCL: no DCR
        comm_plans = coordination.plan_mitigations(session, job, view, settings)
        plan.update(coordination.describe(comm_plans))
        if comm_plans:
            plan["mitigation"] = comm_plans[0].plan.chosen.mitigation.value
    row = record_decision(
        session,
        job,
        trigger=trigger,
        fault=fault,
        action=result.action.value,
        reason=": ".join(reasons),
        inputs=inputs_record(result, concurrent),
        costs_s=dict(result.costs_s),
        costs_gpu_s=dict(result.costs_gpu_s),
        plan=plan,
        now=now,
    )
    if row is None:
        return None
    if result.action == engine.Action.FAILOVER:
        if job.mode != "failed_over":
            job.failed_over_at = now
        job.mode = "failed_over"
    elif result.action in (engine.Action.RESTART, engine.Action.RESTART_SCALED):
        job.mode = "restarting"
    if nccl_domain is None:  # stock NCCL: no commands, NCCL takes none
        issue_commands(session, job, row, view, timedelta(seconds=settings.command_ack_timeout_s))
    rank_nodes = {r.rank: r.node for r in conn.routes}
    for cp in comm_plans:
        # A switch point needs the communicator's id and progress; a job that
        # registered none gets the plan on record, and s-Bond failover only.
        if cp.disabled_channels and cp.comm_id != coordination.IMPLICIT_COMM:
            coordination.issue_switch_point(
                session,
                job,
                comm_id=cp.comm_id,
                ranks=cp.ranks,
                rank_nodes=rank_nodes,
                kind="rebalance",
                disabled_channels=cp.disabled_channels,
                decision_id=row.decision_id,
                now=now,
                settings=settings,
            )
    return row


def record_decision(
    session: Session,
    job: m.Job,
    *,
    trigger: str,
    fault: m.Fault | None,
    action: str,
    reason: str,
    inputs: dict[str, Any],
    costs_s: dict[str, float | None],
    costs_gpu_s: dict[str, float | None],
    plan: dict[str, Any],
    now: datetime,
) -> m.Decision | None:
    """Store one entry of the job's decision history and announce it; None if a duplicate."""
    row = m.Decision(
        decision_id=str(uuid.uuid4()),
        job_id=job.job_id,
        seq=job.decision_count + 1,
        trigger=trigger,
        fault_id=None if fault is None else fault.id,
        action=action,
        reason=reason,
        inputs=inputs,
        costs_s=costs_s,
        costs_gpu_s=costs_gpu_s,
        plan=plan,
        created_at=now,
    )
    if DecisionRepo(session).add(row) is None:
        return None
    job.decision_count += 1
    metrics.DECISIONS.labels(action=action).inc()
    emit_decision(session, job, row)  # outbox row in this transaction
    return row


def inputs_now(session: Session, job: m.Job, now: datetime, settings: Settings) -> dict[str, Any]:
    """The inputs record of a decision the cost model did not make (fail-back, checkpoint)."""
    k = job.measured_k if job.measured_k is not None else job.slowdown_k
    return {
        "t_elapsed_s": max(0.0, (now - job.last_checkpoint_at).total_seconds()),
        "checkpoint_interval_s": job.checkpoint_interval_s,
        "k": k if k is not None else settings.default_k[0],
        "k_source": "measured" if k is not None else "default",
        "detect_s": job.detect_s,
        "reload_s": job.reload_s,
        "timeout_s": job.timeout_s,
        "threshold_s": engine.failover_threshold_s(
            job.checkpoint_interval_s, job.detect_s, k if k is not None else settings.default_k[0]
        ),
        "gpus": len(JobRepo(session).rank_tuples(job.job_id)),
    }


def inputs_record(result: engine.Decision, concurrent: int) -> dict[str, Any]:
    """The stored (and returned) record of what a decision was based on."""
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
        "allow_scaling": i.allow_scaling,
        "spare_nodes": i.spare_nodes,
        "node_replace_s": i.node_replace_s,
    }


def _plan(
    view: JobView, bw: float | None, k_detail: str, result: engine.Decision
) -> dict[str, Any]:
    conn = view.conn
    moved = [
        {"rank": r.rank, "node": r.node, "gpu": r.gpu, "from": r.primary, "to": r.backup}
        for r in conn.routes
        if not r.primary_ok and r.backup_ok
    ]
    return {
        "mitigation": "s-bond",
        "failed_over": moved,
        "isolated_ranks": list(conn.isolated_ranks),
        "broken_pairs": conn.broken_pairs,
        "example_broken_pairs": [list(p) for p in conn.examples],
        "bandwidth_left": None if bw is None else round(bw, 4),
        "k_detail": k_detail,
        "failed_components": [
            {"node": f.node, "device": f.device, "port": f.port or None, "kind": f.kind}
            for f in view.faults
        ],
        "warnings": view.warnings,
        "notes": list(result.notes),
    }


def issue_commands(
    session: Session, job: m.Job, decision: m.Decision, view: JobView, ack_timeout: timedelta
) -> None:
    """Tell the nodes: ranks that must move now, or every process to abort for a restart.

    Commands are addressed per communicator: rank numbers are the job's own, so
    on a node shared by two jobs only the comm_id tells whose processes they
    are. A job that registered no communicator gets comm_id 0, which every
    plugin client on the node receives.
    """
    commands = CommandRepo(session)
    if decision.action == engine.Action.FAILOVER:
        targets = [r for r in view.conn.routes if not r.primary_ok and r.backup_ok]
        kind = "failover"
    elif decision.action in (engine.Action.RESTART, engine.Action.RESTART_SCALED):
        targets = list(view.conn.routes)
        kind = "abort"
        commands.supersede_pending(job.job_id, ["failover", "rebalance", "failback"])
    else:
        return
    comms = CoordinationRepo(session).communicators(job.job_id)
    members = [(c.comm_id, set(c.ranks) if c.ranks else None) for c in comms] or [(0, None)]
    by_target: dict[tuple[str, int], list[int]] = {}
    for r in targets:
        for comm_id, ranks in members:
            if ranks is None or r.rank in ranks:
                by_target.setdefault((r.node, comm_id), []).append(r.rank)
    session.info.setdefault("notify_nodes", set()).update(node for node, _ in by_target)
    metrics.COMMANDS_ISSUED.labels(kind=kind).inc(len(by_target))
    commands.add_all(
        [
            m.Command(
                node=node,
                job_id=job.job_id,
                decision_id=decision.decision_id,
                kind=kind,
                epoch=decision.seq,
                comm_id=comm_id,
                ranks=sorted(ranks),
                disabled_channels=[],
                created_at=decision.created_at,
                ack_deadline_at=decision.created_at + ack_timeout,
            )
            for (node, comm_id), ranks in sorted(by_target.items())
        ]
    )
