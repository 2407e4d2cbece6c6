"""What an event asks of the fleet manager's own tools: pure, so tests read as tables.

Two triggers act on nodes: a restart decision caused by a fault on a node, and a
maintenance flag (a port that keeps flapping, emitted by the coordination code).
A restart decision also asks Slurm to requeue the job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scheduler_svc.fleet.types import EventType

RESTART_ACTIONS = frozenset({"restart", "restart_scaled"})


@dataclass(frozen=True, slots=True)
class NodeFlag:
    """A node whose RNIC is degraded: what to mark and why."""

    node: str
    reason: str
    device: str | None = None
    port: int | None = None


def node_flags(event_type: str, data: dict[str, Any]) -> list[NodeFlag]:
    if event_type == EventType.MAINTENANCE_FLAG:
        node = data.get("node")
        if not isinstance(node, str) or not node:
            return []
        reason = str(data.get("reason") or "RNIC flagged for maintenance")
        return [NodeFlag(node, reason, data.get("device"), data.get("port"))]
    if event_type == EventType.DECISION_CREATED and data.get("action") in RESTART_ACTIONS:
        fault = data.get("fault") or {}
        node = fault.get("node")
        if not isinstance(node, str) or not node:
            return []
        where = fault.get("device") or "RNIC"
        if fault.get("port"):
            where = f"{where}/{fault['port']}"
        reason = f"job {data.get('job_id')} restarts: {where} {fault.get('kind', 'fault')}"
        return [NodeFlag(node, reason, fault.get("device"), fault.get("port"))]
    return []


def requeue_job(event_type: str, data: dict[str, Any]) -> str | None:
    """The job to requeue, for a restart decision."""
    if event_type == EventType.DECISION_CREATED and data.get("action") in RESTART_ACTIONS:
        job = data.get("job_id")
        return job if isinstance(job, str) else None
    return None


def wants_k8s(event_type: str, data: dict[str, Any]) -> bool:
    return bool(node_flags(event_type, data))


def wants_slurm(event_type: str, data: dict[str, Any]) -> bool:
    drains = event_type == EventType.MAINTENANCE_FLAG and bool(node_flags(event_type, data))
    return drains or requeue_job(event_type, data) is not None
