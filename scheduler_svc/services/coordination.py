"""Cluster-wide coordination: switch points, fail-back, correlation, flaps and measured k.

Each function runs inside the caller's transaction (a request's, or one
sweep of the coordinator loop) and holds the job's row lock where it
decides, so replicas serialise on the store exactly as decisions do.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from scheduler_svc import metrics
from scheduler_svc.config import Settings
from scheduler_svc.engine import coordination as coord
from scheduler_svc.fleet import EventType, emit, emit_command_change
from scheduler_svc.schemas import EventIn, EventKind
from scheduler_svc.store import models as m
from scheduler_svc.store.repositories import CommandRepo, CoordinationRepo, JobRepo

if TYPE_CHECKING:
    from scheduler_svc.services.decisions import JobView

log = logging.getLogger(__name__)

REBALANCE_KINDS = ("rebalance", "failback")


# --- progress ----------------------------------------------------------------------------------


def record_progress(session: Session, events: list[EventIn]) -> int:
    """Store each rank's newest ops_done under its job; returns how many were placed."""
    repo = CoordinationRepo(session)
    progress = [e for e in events if e.kind == EventKind.PROGRESS and e.ops_done is not None]
    if not progress:
        return 0
    jobs_by_comm = repo.jobs_of_comm({e.comm_id for e in progress if e.comm_id is not None})
    placed = 0
    for e in progress:
        if e.rank is None:
            continue
        job_id = jobs_by_comm.get(e.comm_id) if e.comm_id is not None else None
        if job_id is None:
            # No communicator registered: the rank number on this node names the job.
            candidates = repo.job_of_rank_on_node(e.node, e.rank)
            if len(candidates) != 1:
                continue
            job_id = candidates[0]
        repo.record_progress(job_id, e.comm_id or 0, e.rank, e.ops_done or 0, e.observed_at)
        placed += 1
    return placed


# --- mitigation planning and switch points ----------------------------------------------------


@dataclass(frozen=True)
class CommPlan:
    comm_id: int
    ranks: list[int]
    plan: coord.MitigationPlan
    disabled_channels: list[int]


# The communicator a job that registered none is planned as: all its ranks, 8 channels.
IMPLICIT_COMM = 0


def _comms(session: Session, job: m.Job) -> list[m.Communicator]:
    comms = list(CoordinationRepo(session).communicators(job.job_id))
    if comms:
        return comms
    return [m.Communicator(job_id=job.job_id, comm_id=IMPLICIT_COMM, channels=8, ranks=[], epoch=0)]


def comms_containing(
    session: Session, job: m.Job, ranks: set[int], rank_nodes: dict[int, str]
) -> list[m.Communicator]:
    """The job's communicators with any of `ranks` (ranks filled in for implicit ones)."""
    found = []
    for comm in _comms(session, job):
        members = set(comm.ranks or rank_nodes)
        if members & ranks:
            found.append(comm)
    return found


def plan_mitigations(
    session: Session, job: m.Job, view: JobView, settings: Settings
) -> list[CommPlan]:
    """Per communicator: predicted k under each mitigation, and the one chosen."""
    plans = []
    by_rank = {r.rank: r for r in view.conn.routes}
    share = job.comm_share if job.comm_share is not None else 0.3
    for comm in _comms(session, job):
        members = [by_rank[r] for r in (comm.ranks or sorted(by_rank)) if r in by_rank]
        if not members:
            continue
        rails_by_node: dict[str, set[int | None]] = {}
        failed_by_node: dict[str, set[int | None]] = {}
        for r in members:
            rails_by_node.setdefault(r.node, set()).add(r.rail)
            if not r.primary_ok:
                failed_by_node.setdefault(r.node, set()).add(r.rail)
        if not failed_by_node:
            continue
        worst = max(failed_by_node, key=lambda n: (len(failed_by_node[n]), n))
        rails = sorted(rails_by_node[worst], key=lambda x: (x is None, x))
        load = Counter(r.active for r in members if r.node == worst and r.active)
        moved = [r for r in members if not r.primary_ok and r.backup_ok]
        crosses = any((view.plans[r.node].for_gpu(r.gpu).backup_cost or 0) >= 100 for r in moved)
        topo = view.topologies[worst]
        nvlink = any(g.nvlink for g in topo.gpus)
        plan = coord.plan_mitigation(
            comm_share=share,
            rails_per_node=len(rails),
            failed_rails=len(failed_by_node[worst]),
            channels=comm.channels,
            nodes=len(rails_by_node),
            backup_load=max(load.values(), default=1),
            backup_crosses_root_complex=crosses,
            nvl_available=nvlink and len(rails) < 2,
            nvl_mb_per_channel=settings.nvl_mb_per_channel,
            nvl_cap_mb=settings.nvl_cap_mb,
        )
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
        plans.append(CommPlan(comm.comm_id, [r.rank for r in members], plan, disabled))
    return plans


def describe(plans: list[CommPlan]) -> dict[str, Any]:
    """The `plan` entries of a decision for its communicators."""
    return {
        "communicators": [
            {
                "comm_id": p.comm_id,
                "mitigation": p.plan.chosen.mitigation.value,
                "predicted_k": p.plan.chosen.k,
                "why": p.plan.reason,
                "disabled_channels": p.disabled_channels,
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
            for p in plans
        ]
    }


def issue_switch_point(
    session: Session,
    job: m.Job,
    *,
    comm_id: int,
    ranks: list[int],
    rank_nodes: dict[int, str],
    kind: str,
    disabled_channels: list[int],
    decision_id: str | None,
    now: datetime,
    settings: Settings,
    passed_ops: int = 0,
) -> list[m.Command]:
    """One trigger for every rank of a communicator, under a new epoch, superseding older ones.

    `passed_ops` is an op count some rank is known to have passed (a trigger it
    reported too late for): the new trigger counts from it even when the stored
    progress, a poll or two old, is still below it.
    """
    repo = CoordinationRepo(session)
    comm = session.get(m.Communicator, (job.job_id, comm_id))
    epoch = (comm.epoch if comm is not None else _max_epoch(session, job, comm_id)) + 1
    if comm is not None:
        comm.epoch = epoch
    progress = [p for p in repo.progress(job.job_id, comm_id) if p.rank in set(ranks)]
    rates = sorted(p.rate_ops_per_s for p in progress if p.rate_ops_per_s)
    rate = rates[-1] if rates else None
    # A progress sample is an agent poll and a POST old by now: the ranks have
    # run on at their rate since, so count from where they are projected to be.
    projected = [
        p.ops_done + int((rate or 0.0) * max(0.0, (now - p.at).total_seconds())) for p in progress
    ]
    max_ops = max([passed_ops, *projected])
    latency = repo.delivery_latency_s() or settings.delivery_latency_default_s
    point = coord.switch_point(
        max_ops_done=max_ops,
        op_rate_per_s=rate,
        delivery_latency_s=latency,
        min_offset=settings.switch_min_offset_ops,
        safety=settings.switch_safety,
    )
    for old in repo.comm_commands(job.job_id, comm_id, REBALANCE_KINDS, ["issued", "delivered"]):
        old.state = "superseded"
        emit_command_change(session, old)
    by_node: dict[str, list[int]] = {}
    for r in ranks:
        by_node.setdefault(rank_nodes[r], []).append(r)
    cmds = [
        m.Command(
            node=node,
            job_id=job.job_id,
            decision_id=decision_id,
            kind=kind,
            epoch=epoch,
            comm_id=comm_id,
            ops_done=point.ops_done,
            disabled_channels=disabled_channels,
            ranks=sorted(rs),
            created_at=now,
            ack_deadline_at=now + timedelta(seconds=settings.command_ack_timeout_s),
        )
        for node, rs in sorted(by_node.items())
    ]
    CommandRepo(session).add_all(cmds)
    session.info.setdefault("notify_nodes", set()).update(by_node)
    metrics.COMMANDS_ISSUED.labels(kind=kind).inc(len(cmds))
    log.info(
        "%s for job %s comm %d at ops_done %d (epoch %d; %s)",
        kind,
        job.job_id,
        comm_id,
        point.ops_done,
        epoch,
        point.reason,
    )
    return cmds


def _max_epoch(session: Session, job: m.Job, comm_id: int) -> int:
    cmds = CoordinationRepo(session).comm_commands(
        job.job_id,
        comm_id,
        REBALANCE_KINDS,
        ["issued", "delivered", "applied", "superseded", "failed"],
    )
    return max((c.epoch for c in cmds), default=0)


# --- after a fault opens: flaps and correlation ------------------------------------------------


def flag_if_flapping(
    session: Session, fault: m.Fault, settings: Settings
) -> m.MaintenanceFlag | None:
    repo = CoordinationRepo(session)
    since = fault.opened_at - timedelta(seconds=settings.flap_window_s)
    transitions = repo.port_transitions(fault.node, fault.device, fault.port or 1, since)
    health = coord.port_health(
        transitions,
        fault.opened_at,
        damping_s=settings.failback_damping_s,
        max_flaps=settings.flap_max,
        window_s=settings.flap_window_s,
    )
    if health.state != coord.PortState.FLAPPING:
        return None
    flag = repo.flag(
        m.MaintenanceFlag(
            node=fault.node,
            device=fault.device,
            port=fault.port or 1,
            flagged_at=fault.opened_at,
            reason=health.reason,
        )
    )
    if flag is not None:
        metrics.MAINTENANCE_FLAGS.inc()
        emit(
            session,
            EventType.MAINTENANCE_FLAG,
            job_id=None,
            subject=f"node/{fault.node}/{fault.device}/{fault.port or 1}",
            data={
                "node": fault.node,
                "device": fault.device,
                "port": fault.port or 1,
                "reason": health.reason,
            },
        )
    return flag


def infer_switch(session: Session, fault: m.Fault, settings: Settings) -> m.SwitchFault | None:
    """Open a switch fault when this fault completes a correlated set on its switch."""
    if fault.switch is None:
        return None
    repo = CoordinationRepo(session)
    since = fault.opened_at - timedelta(seconds=settings.correlation_window_s)
    recent = [
        coord.PortFault(f.node, f.device, f.port, f.switch, f.opened_at)
        for f in repo.recent_switch_faults(fault.switch, since)
    ]
    found = coord.infer_switch_failures(
        recent, window_s=settings.correlation_window_s, min_nodes=settings.correlation_min_nodes
    )
    if not found:
        return None
    sw = found[0]
    row = repo.open_switch_fault(
        m.SwitchFault(
            switch=sw.switch, opened_at=fault.opened_at, nodes=list(sw.nodes), reason=sw.reason
        )
    )
    if row is not None:
        metrics.SWITCH_FAULTS.labels(switch=sw.switch).inc()
        emit(
            session,
            EventType.SWITCH_FAULT,
            job_id=None,
            subject=f"switch/{sw.switch}",
            data={
                "switch": sw.switch,
                "nodes": list(sw.nodes),
                "links": [
                    {"node": n, "device": d, "port": p}
                    for n, d, p in repo.ports_on_switch(sw.switch)
                ],
                "reason": sw.reason,
            },
        )
    return row


def nodes_on_switch(session: Session, switch: str) -> list[str]:
    return sorted({n for n, _, _ in CoordinationRepo(session).ports_on_switch(switch)})


def node_failure_note(session: Session, nodes: set[str], view: JobView) -> str | None:
    """A node whose every fabric port failed looks like a dead peer: say so in the reason."""
    repo = CoordinationRepo(session)
    dead = []
    for node in sorted({f.node for f in view.faults} & nodes):
        fabric = repo.fabric_ports(node)
        failed: set[tuple[str, int]] = set()
        for f in view.faults:
            if f.node != node:
                continue
            if f.port == m.WHOLE_DEVICE_PORT:
                failed |= {(d, p) for d, p in fabric if d == f.device}
            else:
                failed.add((f.device, f.port))
        if coord.is_node_failure(failed, fabric):
            dead.append(node)
    if not dead:
        return None
    return (
        f"node failure: every fabric RNIC of {', '.join(dead)} failed "
        "(a dead peer, not the network)"
    )


# --- acknowledgements ----------------------------------------------------------------------------


def on_failed_ack(
    session: Session, cmd: m.Command, detail: str, now: datetime, settings: Settings
) -> list[m.Command]:
    """A rank already past the switch point: issue a later one under a new epoch.

    Only the current epoch re-triggers, so many ranks reporting the same late
    trigger produce one new switch point, never a chain.
    """
    if cmd.kind not in REBALANCE_KINDS or "too_late" not in detail:
        return []
    job = JobRepo(session).lock(cmd.job_id)
    if job is None:
        return []
    comm = session.get(m.Communicator, (job.job_id, cmd.comm_id))
    current = comm.epoch if comm is not None else _max_epoch(session, job, cmd.comm_id)
    if cmd.epoch != current:
        return []
    siblings = CoordinationRepo(session).comm_commands(
        job.job_id, cmd.comm_id, [cmd.kind], ["issued", "delivered", "applied", "failed"]
    )
    ranks = sorted({r for c in siblings if c.epoch == cmd.epoch for r in c.ranks})
    rank_nodes = {r: c.node for c in siblings if c.epoch == cmd.epoch for r in c.ranks}
    metrics.RETRIGGERS.inc()
    return issue_switch_point(
        session,
        job,
        comm_id=cmd.comm_id,
        ranks=ranks,
        rank_nodes=rank_nodes,
        kind=cmd.kind,
        disabled_channels=list(cmd.disabled_channels),
        decision_id=cmd.decision_id,
        now=now,
        settings=settings,
        passed_ops=cmd.ops_done,
    )
