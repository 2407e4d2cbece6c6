"""Writing events into the outbox, and turning a stored event into a CloudEvent.

`emit` is the one entry point for every module that has something to tell the
fleet. It only adds rows to the caller's session: the event and its deliveries
commit, or roll back, with the change that caused them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cloudevents.conversion import to_structured
from cloudevents.http import CloudEvent
from sqlalchemy import inspect
from sqlalchemy.orm import Session

from scheduler_svc.fleet import actions
from scheduler_svc.fleet.repositories import OutboxRepo, SubscriptionRepo
from scheduler_svc.fleet.types import EventType, command_type
from scheduler_svc.store import models as m
from scheduler_svc.store.faults import FaultRepo

SOURCE = "/railover/scheduler"
# session.info keys: the app's fleet settings, and "this transaction wrote events".
CONFIG_KEY = "railover.fleet"
WROTE_KEY = "railover.outbox"

__all__ = ["EventType", "FleetTargets", "emit", "emit_command_change", "emit_decision"]


@dataclass(frozen=True, slots=True)
class FleetTargets:
    """Which targets exist beyond subscriptions; set on the app's sessions at startup."""

    notify_signed: bool = False
    k8s: bool = False
    slurm: bool = False


def emit(
    session: Session,
    type: str,
    *,
    job_id: str | None,
    subject: str,
    data: dict[str, Any],
    now: datetime | None = None,
) -> str:
    """Queue one event for every target that wants it, in the caller's transaction.

    `type` is an EventType value (or another io.railover.* type); `job_id` is
    the job the event concerns (None for cluster-wide events such as a switch
    fault: they go to subscriptions without a job filter) and orders its
    delivery: events of one job reach each target in the order they were
    emitted. `subject` names the thing inside the job or cluster (a decision
    id, "node/n7", "switch/rail0-a"). `data` must be JSON-serialisable.

    Targets: subscriptions matching type and job; the job's notify_url when a
    notify secret is configured; Kubernetes and Slurm when enabled and the event
    asks for a node or job action (see fleet.actions). Returns the event's id (the
    CloudEvent's `id`).
    """
    at = now or datetime.now(UTC)
    targets: FleetTargets = session.info.get(CONFIG_KEY, FleetTargets())
    job_key = job_id or ""
    rows: list[dict[str, Any]] = []

    def add(target: str, url: str) -> None:
        rows.append(
            {
                "target": target,
                "lane": f"{target}|{job_key}",
                "url": url,  # state "pending" and no attempts yet: the columns' defaults
                "next_attempt_at": at,
                "created_at": at,
            }
        )

    for sub in SubscriptionRepo(session).matching(type, job_id):
        add(f"sub:{sub.subscription_id}", sub.url)
    if targets.notify_signed and job_id is not None:
        job = session.get(m.Job, job_id)
        if job is not None and job.notify_url:
            add(f"job:{job_id}", job.notify_url)
    if targets.k8s and actions.wants_k8s(type, data):
        add("k8s", "")
    if targets.slurm and actions.wants_slurm(type, data):
        add("slurm", "")
    event_id = str(uuid.uuid4())
    event = {
        "event_id": event_id,
        "type": type,
        # A port's subject (node/<253-char name>/<device>/<port>) can outgrow the column;
        # `data` carries every name whole, the subject is for filtering and people.
        "subject": subject[:253],
        "job_id": job_id,
        "data": data,
        "created_at": at,
    }
    OutboxRepo(session).add(event, rows)
    if rows:
        session.info[WROTE_KEY] = True
    return event_id


def emit_decision(session: Session, job: m.Job, decision: m.Decision) -> str:
    """io.railover.decision.created for a stored decision.

    The commands it leads to are announced by their own io.railover.command.*
    events (data.decision_id links them), which follow this one in the job's order.
    """
    fault = None if decision.fault_id is None else FaultRepo(session).described(decision.fault_id)
    plan = decision.plan or {}
    data: dict[str, Any] = {
        "decision_id": decision.decision_id,
        "job_id": job.job_id,
        "seq": decision.seq,
        "action": decision.action,
        "reason": decision.reason,
        "trigger": decision.trigger,
        "inputs": decision.inputs,
        "costs_s": decision.costs_s,
        "plan": decision.plan,
        # restart_scaled: restart without these nodes at this DP size ([] and null otherwise).
        "drop_nodes": list(plan.get("drop_nodes") or []),
        "new_dp_size": plan.get("new_dp_size"),
        "saved_gpu_s": decision.saved_gpu_s,
        "created_at": decision.created_at.isoformat(),
        "fault": None
        if fault is None
        else dict(zip(("node", "device", "port", "kind"), fault, strict=True)),
    }
    return emit(
        session,
        EventType.DECISION_CREATED,
        job_id=job.job_id,
        subject=f"decision/{decision.decision_id}",
        data=data,
        now=decision.created_at,
    )


def emit_command_change(session: Session, command: m.Command) -> str | None:
    """io.railover.command.<state> if the command's state changed in this transaction.

    Reads the attribute history, so call it right after setting the state
    (before anything flushes the session).
    """
    if not inspect(command).attrs.state.history.added:
        return None
    return emit(
        session,
        command_type(command.state),
        job_id=command.job_id,
        subject=f"command/{command.command_id}",
        data=_command_data(command),
    )


def _command_data(c: m.Command) -> dict[str, Any]:
    return {
        "command_id": c.command_id,
        "node": c.node,
        "job_id": c.job_id,
        "decision_id": c.decision_id,
        "kind": c.kind,
        "epoch": c.epoch,
        "state": c.state or "issued",
        "ranks": list(c.ranks or []),
    }


def to_cloudevent(event: m.OutboxEvent) -> tuple[dict[str, str], bytes]:
    """Structured-mode HTTP headers and body; the same bytes on every retry."""
    attrs = {
        "id": event.event_id,
        "source": SOURCE,
        "type": event.type,
        "subject": event.subject,
        "time": event.created_at.isoformat(),
        "datacontenttype": "application/json",
        # Extensions: the CloudEvents partitioning and sequence extensions, so a
        # receiver can check per-job order without parsing data.
        "sequence": str(event.id),
    }
    if event.job_id is not None:
        attrs["partitionkey"] = event.job_id
    headers, body = to_structured(CloudEvent(attrs, event.data))
    return dict(headers), body if isinstance(body, bytes) else str(body).encode()
