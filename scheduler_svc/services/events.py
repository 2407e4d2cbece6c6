"""Agents' reports: store each once, record the evidence it carries, name the jobs it touches.

Port reports set the port's level: its newest observed state, ordered by
observation time, so a report observed before the newest one known for that
port (late, reordered) is stored as history and changes nothing else. An event
opens a fault (a link down, an RNIC fatal error, a CQE error that means the path
is gone), refreshes one (a new error on a component already failed), or starts
clearing one (a port up that is the port's newest report). Flapping ports are quarantined
and correlated port faults become a switch failure here too. None of this
decides anything: the jobs on the touched nodes (and, for a switch, on every
node cabled to it) are marked due and returned; once the evidence has committed,
the caller has them reconciled (services.passes, which shares one pass among the
reports of a storm).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from scheduler_svc import metrics
from scheduler_svc.api.schemas.events import EventIn, EventKind
from scheduler_svc.config import Settings
from scheduler_svc.engine import coordination as coord
from scheduler_svc.engine.fabric import WHOLE_DEVICE, FaultKind
from scheduler_svc.fleet import EventType, emit
from scheduler_svc.services import ccl, degradation, fabric, losses
from scheduler_svc.store import models as m
from scheduler_svc.store.coordination import CoordinationRepo, ProgressSample
from scheduler_svc.store.faults import EventRepo, FaultRepo
from scheduler_svc.store.jobs import JobRepo
from scheduler_svc.store.maintenance import MaintenanceRepo
from scheduler_svc.store.nodes import ACTIVE, DOWN, NodeRepo

# ibv_wc_status values that mean the path itself is gone (the RNIC gave up
# retransmitting), as opposed to WR_FLUSH_ERR (5) and friends, which follow
# from a QP already in error and say nothing new about the fabric.
PATH_LOSS_WC_STATUS = {
    12: "IBV_WC_RETRY_EXC_ERR",
    13: "IBV_WC_RNR_RETRY_EXC_ERR",
}
# ibv_event_type values of async events.
IBV_EVENT_DEVICE_FATAL = 8
IBV_EVENT_PORT_ACTIVE = 9
IBV_EVENT_PORT_ERR = 10
# A report's jobs are reconciled by a pass right after its commit; if that never
# happens (the process died between the two), the coordinator does it this much later.
REPORT_PASS_GRACE = timedelta(seconds=10)
# Faults a port_up starts clearing; the others clear by quiet, registration or operator.
CLEARED_BY_PORT_UP = (FaultKind.LINK_DOWN.value, FaultKind.RNIC_FATAL.value)


@dataclass
class IngestResult:
    accepted: int = 0
    duplicates: int = 0
    faults_opened: list[m.Fault] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)  # to reconcile once this commits


def _row(e: EventIn, now: datetime) -> dict[str, Any]:
    return {
        "event_id": e.event_id,
        "node": e.node,
        "kind": e.kind.value,
        "device": e.device,
        "port": e.port,
        "observed_at": e.observed_at,
        "received_at": now,
        "payload": e.model_dump(mode="json", exclude={"event_id", "node", "kind"}),
    }


def _fault_kind(e: EventIn) -> tuple[FaultKind, int] | None:
    """(fault kind, port) when this event means a component broke; port 0 = whole RNIC."""
    port = e.port or 1
    if e.kind == EventKind.PORT_DOWN:
        return FaultKind.LINK_DOWN, port
    if e.kind == EventKind.DEVICE_FATAL:
        return FaultKind.RNIC_FATAL, WHOLE_DEVICE
    if e.kind == EventKind.CQE_ERROR and e.wc_status in PATH_LOSS_WC_STATUS:
        return FaultKind.RETRY_EXCEEDED, port
    if e.kind == EventKind.PORT_EVENT:
        if e.event_type == IBV_EVENT_PORT_ERR:
            return FaultKind.LINK_DOWN, port
        if e.event_type == IBV_EVENT_DEVICE_FATAL:
            return FaultKind.RNIC_FATAL, WHOLE_DEVICE
    return None


def _recovers(e: EventIn) -> bool:
    return e.kind == EventKind.PORT_UP or (
        e.kind == EventKind.PORT_EVENT and e.event_type == IBV_EVENT_PORT_ACTIVE
    )


def ingest(
    session: Session, events: list[EventIn], *, now: datetime, settings: Settings
) -> IngestResult:
    """Store new events and record their evidence in order of observation; the jobs it
    touched are marked due (the coordinator's fallback) and returned, to reconcile."""
    result = IngestResult()
    # A batch may carry one id twice; the first copy counts, the rest are duplicates.
    first: dict[str, EventIn] = {}
    for e in events:
        first.setdefault(e.event_id, e)
    inserted = EventRepo(session).insert_new([_row(e, now) for e in first.values()])
    result.accepted = len(inserted)
    result.duplicates = len(events) - result.accepted
    for e in events:
        fresh = e.event_id in inserted and first[e.event_id] is e
        metrics.EVENTS.labels(kind=e.kind.value, result="accepted" if fresh else "duplicate").inc()
    new_events = sorted(
        (e for e in first.values() if e.event_id in inserted), key=lambda e: e.observed_at
    )
    # Announced communicators first: progress in the same batch then finds its job.
    ccl.register_announced(session, new_events)
    ccl.record_stalls(session, new_events)
    record_progress(session, new_events)
    touched: set[str] = set()
    for e in new_events:
        touched |= _record(session, e, result, settings)
    if touched:
        closed = fabric.close_cleared(
            session, now, settings, {n for n in touched if not n.startswith("@")}
        )
        touched |= {
            f"@{sw}"
            for sw in fabric.clear_switches(session, closed, now, settings.correlation_window_s)
        }
        nodes = {n for n in touched if not n.startswith("@")}
        for sw in (n[1:] for n in touched if n.startswith("@")):
            nodes |= {n for n, _, _ in NodeRepo(session).ports_on_switch(sw)}
        result.jobs = JobRepo(session).mark_due_on_nodes(nodes, now + REPORT_PASS_GRACE)
    return result


def _record(session: Session, e: EventIn, result: IngestResult, settings: Settings) -> set[str]:
    """Record one event's evidence; the nodes (and "@switch"es) whose jobs it touches."""
    if e.kind == EventKind.DEVICE_LOST:
        return _record_lost(session, e, result)
    faults = FaultRepo(session)
    device = e.device or ""
    kind = _fault_kind(e)
    if kind is not None:
        fault_kind, port = kind
        if fault_kind in (FaultKind.LINK_DOWN, FaultKind.RNIC_FATAL):
            levels = NodeRepo(session).observe_port(
                e.node, device, port or None, DOWN, e.observed_at
            )
            if not levels:
                # Observed before the port's newest report (a late or reordered one): it is
                # history, and the level that came after it stands.
                return set()
            # A whole RNIC's fault is cabled where its lowest port that went down is.
            switch = levels[0][1]
        else:
            switch = NodeRepo(session).switch_of(e.node, device, port)
        degradation.make_room(session, e.node, device, port, e.observed_at)
        fault = faults.open_if_new(
            m.Fault(
                node=e.node,
                device=device,
                port=port,
                kind=fault_kind.value,
                opened_at=e.observed_at,
                last_error_at=e.observed_at,
                first_event_id=e.event_id,
                detail={"wc_status": e.wc_status} if e.wc_status is not None else {},
                switch=switch,
            )
        )
        if fault is None:
            # Already failed: a newer error restarts its quiet period.
            open_ = faults.open_on_component(e.node, device, port)
            if open_ is not None and (
                open_.last_error_at is None or e.observed_at > open_.last_error_at
            ):
                open_.last_error_at = e.observed_at
            return {e.node}
        metrics.FAULTS_OPENED.labels(kind=fault_kind.value).inc()
        EventRepo(session).set_fault([e.event_id], fault.id)
        result.faults_opened.append(fault)
        touched = {e.node}
        flag_if_flapping(session, fault, settings)
        switch_fault = infer_switch(session, fault, settings)
        if switch_fault is not None:
            touched.add(f"@{switch_fault.switch}")
        return touched
    if e.kind in degradation.KINDS:
        touched, opened = degradation.record(session, e, settings)
        if opened is not None:
            result.faults_opened.append(opened)
        return touched
    if _recovers(e):
        port = e.port or 1
        if not NodeRepo(session).observe_port(e.node, device, port, ACTIVE, e.observed_at):
            return set()  # older than the port's newest report: history only
        faults.clear(e.node, device, port, e.observed_at, CLEARED_BY_PORT_UP)
        # A switch inferred failed clears once its port faults have (clear_switches).
        return {e.node}
    return set()


def _record_lost(session: Session, e: EventIn, result: IngestResult) -> set[str]:
    """A GPU or RNIC gone from the node's sysfs: its topology-loss fault, opened once."""
    fault = losses.reported_lost(
        session,
        e.node,
        device=e.device,
        gpu=e.gpu,
        at=e.observed_at,
        event_id=e.event_id,
        pci=e.detail.get("pci"),
    )
    if fault is None:
        return set()
    EventRepo(session).set_fault([e.event_id], fault.id)
    result.faults_opened.append(fault)
    return {e.node}


def record_progress(session: Session, events: list[EventIn]) -> int:
    """Store each rank's newest ops_done under its job; returns how many were placed.

    A report names its job by its registered communicator, else by the job its process
    named, else by its rank number on the node where one job alone has it. It counts for
    the job's current incarnation only: one naming another incarnation, or naming none
    and observed before the current one started, is an ended incarnation's (its processes
    counted from another start) and stays history.
    """
    repo = CoordinationRepo(session)
    progress = [
        e
        for e in events
        if e.kind == EventKind.PROGRESS and e.ops_done is not None and e.rank is not None
    ]
    if not progress:
        return 0
    jobs_by_comm = repo.jobs_of_comm({e.comm_id for e in progress if e.comm_id is not None})
    placed: list[tuple[str, EventIn]] = []
    for e in progress:
        assert e.rank is not None
        job_id = jobs_by_comm.get(e.comm_id) if e.comm_id is not None else None
        if job_id is None:
            # No communicator registered: the rank number on this node names the job.
            candidates = JobRepo(session).job_of_rank_on_node(e.node, e.rank)
            if e.job_id is not None:
                candidates = [j for j in candidates if j == e.job_id]
            if len(candidates) != 1:
                continue
            job_id = candidates[0]
        if e.job_id is None or e.job_id == job_id:
            placed.append((job_id, e))
    if not placed:
        return 0
    current = JobRepo(session).incarnations(j for j, _ in placed)
    samples = [
        ProgressSample(job_id, e.comm_id or 0, e.rank or 0, e.ops_done or 0, e.observed_at)
        for job_id, e in placed
        if job_id in current and _this_incarnation(e, *current[job_id])
    ]
    repo.record_progress(samples)
    return len(samples)


def _this_incarnation(e: EventIn, incarnation: int, started_at: datetime | None) -> bool:
    if e.incarnation is not None:
        return e.incarnation == incarnation
    return started_at is None or e.observed_at >= started_at


def flag_if_flapping(
    session: Session, fault: m.Fault, settings: Settings
) -> m.MaintenanceFlag | None:
    """A port that went down too often in the window is quarantined until an operator clears it."""
    since = fault.opened_at - timedelta(seconds=settings.flap_window_s)
    transitions = EventRepo(session).port_transitions(
        fault.node, fault.device, fault.port or 1, since
    )
    health = coord.port_health(
        transitions,
        fault.opened_at,
        damping_s=settings.failback_damping_s,
        max_flaps=settings.flap_max,
        window_s=settings.flap_window_s,
    )
    if health.state != coord.PortState.FLAPPING:
        return None
    flag = MaintenanceRepo(session).flag(
        m.MaintenanceFlag(
            node=fault.node,
            device=fault.device,
            port=fault.port or 1,
            flagged_at=fault.opened_at,
            reason=health.reason,
            source="flapping",
        )
    )
    if flag is not None:
        announce_flag(session, flag)
    return flag


def announce_flag(session: Session, flag: m.MaintenanceFlag) -> None:
    metrics.MAINTENANCE_FLAGS.inc()
    emit(
        session,
        EventType.MAINTENANCE_FLAG,
        job_id=None,
        subject=f"node/{flag.node}/{flag.device}/{flag.port}",
        data={"node": flag.node, "device": flag.device, "port": flag.port, "reason": flag.reason},
    )


def infer_switch(session: Session, fault: m.Fault, settings: Settings) -> m.SwitchFault | None:
    """Open a switch fault when this fault completes a correlated set on its switch."""
    if fault.switch is None:
        return None
    repo = FaultRepo(session)
    repo.lock_switch(fault.switch)  # the fault is in: count with the others' committed
    since = fault.opened_at - timedelta(seconds=settings.correlation_window_s)
    recent = [coord.PortFault(*f) for f in repo.recent_switch_faults(fault.switch, since)]
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
                    for n, d, p in NodeRepo(session).ports_on_switch(sw.switch)
                ],
                "reason": sw.reason,
            },
        )
    return row
