"""What an event asks of the fleet manager's own tools: pure, so tests read as tables.

A node whose RNIC is in trouble is *flagged*; a repaired one is *cleared*:

- restart decision: flagged; Kubernetes condition, taint, cordon and an Event; Slurm
  drains the node, then requeues the job.
- restart_scaled decision: every node in its `drop_nodes` is flagged; condition,
  taint, Event; Slurm comments the nodes and requeues the job excluding them (the job
  comes back at `new_dp_size`).
- failover decision: flagged; condition, taint, Event; Slurm comments the node (the
  comment shows in `sinfo -O NodeList,Comment`).
- maintenance.flagged (a port that keeps flapping): flagged; condition, taint,
  Event; Slurm drains the node.
- failback decision, maintenance.cleared (an operator cleared the flag): cleared;
  condition and taint removed, uncordoned if Railover cordoned it, an Event; Slurm
  resumes the node if Railover drained it and clears Railover's comment.

Cordon is for restart only: the job is leaving the node, so nothing should land on it
until it is repaired. After a failover the job keeps running there on its backup RNIC;
the taint keeps new work off without touching what runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from scheduler_svc.fleet.types import EventType


class SlurmMark(StrEnum):
    """How a flagged node is marked in Slurm."""

    DRAIN = "drain"  # State=DRAIN: nothing new is scheduled there
    COMMENT = "comment"  # Comment=railover: ...; running work stays, sinfo shows it


@dataclass(frozen=True, slots=True)
class NodeFlag:
    """A node whose RNIC is degraded: what to mark and why."""

    node: str
    reason: str
    device: str | None = None
    port: int | None = None
    decision_id: str | None = None
    # restart only (see the module docstring)
    cordon: bool = False
    slurm: SlurmMark = SlurmMark.COMMENT


@dataclass(frozen=True, slots=True)
class NodeClear:
    """A node whose RNIC was repaired: take Railover's marks off it again."""

    node: str
    reason: str
    decision_id: str | None = None


@dataclass(frozen=True, slots=True)
class Requeue:
    """A Slurm job to requeue; `exclude` keeps it off those nodes when it runs again."""

    job_id: str
    exclude: tuple[str, ...] = ()


NODE_ACTIONS = frozenset({"restart", "restart_scaled", "failover"})


def _where(fault: dict[str, Any]) -> str:
    where = str(fault.get("device") or "RNIC")
    if fault.get("port"):
        where = f"{where}/{fault['port']}"
    return f"{where} {fault.get('kind') or 'fault'}"


def _fault_node(data: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    fault = data.get("fault") or {}
    node = fault.get("node") if isinstance(fault, dict) else None
    if not isinstance(node, str) or not node:
        return None
    return node, fault


def _drop_nodes(data: dict[str, Any]) -> tuple[str, ...]:
    nodes = data.get("drop_nodes")
    if not isinstance(nodes, list):
        return ()
    return tuple(n for n in nodes if isinstance(n, str) and n)


def node_flags(event_type: str, data: dict[str, Any]) -> list[NodeFlag]:
    if event_type == EventType.MAINTENANCE_FLAG:
        node = data.get("node")
        if not isinstance(node, str) or not node:
            return []
        reason = str(data.get("reason") or "RNIC flagged for maintenance")
        return [NodeFlag(node, reason, data.get("device"), data.get("port"), slurm=SlurmMark.DRAIN)]
    if event_type != EventType.DECISION_CREATED or data.get("action") not in NODE_ACTIONS:
        return []
    decision = data.get("decision_id")
    dropped = _drop_nodes(data)
    if data["action"] == "restart_scaled" and dropped:
        # The job leaves every one of these nodes: taint them all, cordon none.
        why = f"restarts at DP {data.get('new_dp_size')} without {', '.join(dropped)}"
        raw = data.get("fault")
        fault: dict[str, Any] = raw if isinstance(raw, dict) else {}
        flags = []
        for node in dropped:
            # The device is named only where the fault was; the other nodes go with it.
            here = fault.get("node") == node
            flags.append(
                NodeFlag(
                    node,
                    f"decision {decision}: job {data.get('job_id')} {why}",
                    fault.get("device") if here else None,
                    fault.get("port") if here else None,
                    decision_id=decision if isinstance(decision, str) else None,
                )
            )
        return flags
    found = _fault_node(data)
    if found is None:
        return []
    node, fault = found
    action = data["action"]
    verb = {"restart": "restarts", "restart_scaled": "restarts without it"}.get(
        action, "failed over"
    )
    reason = f"decision {decision}: job {data.get('job_id')} {verb}: {_where(fault)}"
    return [
        NodeFlag(
            node,
            reason,
            fault.get("device"),
            fault.get("port"),
            decision_id=decision if isinstance(decision, str) else None,
            cordon=action == "restart",
            slurm=SlurmMark.DRAIN if action == "restart" else SlurmMark.COMMENT,
        )
    ]


def node_clears(event_type: str, data: dict[str, Any]) -> list[NodeClear]:
    if event_type == EventType.MAINTENANCE_CLEARED:
        node = data.get("node")
        if not isinstance(node, str) or not node:
            return []
        return [NodeClear(node, str(data.get("reason") or "maintenance flag cleared"))]
    if event_type != EventType.DECISION_CREATED or data.get("action") != "failback":
        return []
    found = _fault_node(data)
    if found is None:
        return []
    node, fault = found
    decision = data.get("decision_id")
    return [
        NodeClear(
            node,
            f"decision {decision}: job {data.get('job_id')} fails back: {_where(fault)} repaired",
            decision if isinstance(decision, str) else None,
        )
    ]


def requeue_job(event_type: str, data: dict[str, Any]) -> Requeue | None:
    """The job to requeue, for a restart decision (Railover's job id is Slurm's)."""
    if event_type != EventType.DECISION_CREATED:
        return None
    job = data.get("job_id")
    if not isinstance(job, str):
        return None
    if data.get("action") == "restart":
        return Requeue(job)
    if data.get("action") == "restart_scaled":
        dropped = _drop_nodes(data)
        if dropped:
            return Requeue(job, dropped)
        found = _fault_node(data)  # a decision stored before drop_nodes existed
        return Requeue(job, (found[0],) if found else ())
    return None


def wants_k8s(event_type: str, data: dict[str, Any]) -> bool:
    return bool(node_flags(event_type, data) or node_clears(event_type, data))


def wants_slurm(event_type: str, data: dict[str, Any]) -> bool:
    return wants_k8s(event_type, data) or requeue_job(event_type, data) is not None
