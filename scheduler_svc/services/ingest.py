"""Event ingestion: store each report once, open and clear faults, decide at once."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from scheduler_svc import metrics
from scheduler_svc.config import Settings
from scheduler_svc.schemas import EventIn, EventKind
from scheduler_svc.services import ccl, coordination
from scheduler_svc.services.decisions import WHOLE_DEVICE, decide_for_job
from scheduler_svc.store import models as m
from scheduler_svc.store.repositories import (
    CoordinationRepo,
    EventRepo,
    FaultRepo,
    JobRepo,
    NodeRepo,
)

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


@dataclass
class IngestResult:
    accepted: int = 0
    duplicates: int = 0
    faults_opened: list[m.Fault] = field(default_factory=list)
    decisions: list[m.Decision] = field(default_factory=list)


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


def _fault_kind(e: EventIn) -> tuple[str, int] | None:
    """(fault kind, port) when this event means a component broke; port 0 = whole RNIC."""
    port = e.port or 1
    if e.kind == EventKind.PORT_DOWN:
        return "link_down", port
    if e.kind == EventKind.DEVICE_FATAL:
        return "rnic_fatal", WHOLE_DEVICE
    if e.kind == EventKind.CQE_ERROR and e.wc_status in PATH_LOSS_WC_STATUS:
        return "retry_exceeded", port
    if e.kind == EventKind.PORT_EVENT:
        if e.event_type == IBV_EVENT_PORT_ERR:
            return "link_down", port
        if e.event_type == IBV_EVENT_DEVICE_FATAL:
            return "rnic_fatal", WHOLE_DEVICE
    return None


def _recovers(e: EventIn) -> bool:
    return e.kind == EventKind.PORT_UP or (
        e.kind == EventKind.PORT_EVENT and e.event_type == IBV_EVENT_PORT_ACTIVE
    )


def ingest(
    session: Session, events: list[EventIn], *, now: datetime, settings: Settings
) -> IngestResult:
    """Store new events, apply the new ones in order of observation, decide for touched jobs."""
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
    coordination.record_progress(session, new_events)
    faults = FaultRepo(session)
    nodes = NodeRepo(session)
    coord = CoordinationRepo(session)
    opened: list[m.Fault] = []
    new_switches: list[m.SwitchFault] = []
    for e in new_events:
        device = e.device or ""
        kind = _fault_kind(e)
        if kind is not None:
            fault_kind, port = kind
            fault = faults.open_if_new(
                m.Fault(
                    node=e.node,
                    device=device,
                    port=port,
                    kind=fault_kind,
                    opened_at=e.observed_at,
                    first_event_id=e.event_id,
                    detail={"wc_status": e.wc_status} if e.wc_status is not None else {},
                    switch=coord.switch_of(e.node, device, port),
                )
            )
            if fault is None:
                continue
            metrics.FAULTS_OPENED.labels(kind=fault_kind).inc()
            nodes.set_port_state(e.node, device, port or None, "DOWN")
            EventRepo(session).set_fault([e.event_id], fault.id)
            opened.append(fault)
            coordination.flag_if_flapping(session, fault, settings)
            switch_fault = coordination.infer_switch(session, fault, settings)
            if switch_fault is not None:
                new_switches.append(switch_fault)
        elif _recovers(e):
            port = e.port or 1
            for cleared in faults.clear(e.node, device, port, e.observed_at):
                nodes.set_port_state(cleared.node, cleared.device, port, "ACTIVE")
            # A link on the switch came back up: the switch itself works again.
            switch = coord.switch_of(e.node, device, port)
            if switch is not None:
                coord.clear_switch_fault(switch, e.observed_at)
    result.faults_opened = opened
    result.decisions = _decide_batch(session, opened, new_switches, now, settings)
    return result


def _decide_batch(
    session: Session,
    opened: list[m.Fault],
    new_switches: list[m.SwitchFault],
    now: datetime,
    settings: Settings,
) -> list[m.Decision]:
    """One decision per touched job for the whole batch, over everything then failed.

    A switch inferred failed in this batch touches every job on every node
    cabled to it, including nodes that have reported nothing yet. A fault on a
    switch already known to have failed changes nothing: its jobs were moved
    when the switch fault opened. Otherwise each job is decided once, triggered
    by its earliest new fault (which sets t_elapsed).
    """
    jobs = JobRepo(session)
    fresh = {sw.switch for sw in new_switches}
    failed_before = {sf.switch for sf in CoordinationRepo(session).open_switch_faults()} - fresh
    todo: dict[str, tuple[str, m.Fault, str | None]] = {}
    for sw in new_switches:
        first = next(f for f in opened if f.switch == sw.switch)
        why = f"switch {sw.switch} inferred failed ({sw.reason}); all its links count as failed"
        for node in coordination.nodes_on_switch(session, sw.switch):
            for job_id in jobs.job_ids_on_node(node):
                todo.setdefault(job_id, (f"switch:{sw.id}", first, why))
    for f in opened:
        if f.switch in failed_before:
            continue
        for job_id in jobs.job_ids_on_node(f.node):
            todo.setdefault(job_id, (f"fault:{f.id}", f, None))
    made = []
    for job_id in sorted(todo):  # sorted: one lock order everywhere
        trigger, fault, note = todo[job_id]
        job = jobs.lock(job_id)
        if job is None:
            continue
        d = decide_for_job(
            session,
            job,
            trigger=trigger,
            fault=fault,
            at=fault.opened_at,
            now=now,
            settings=settings,
            note=note,
        )
        if d is not None:
            made.append(d)
    return made
