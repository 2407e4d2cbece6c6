"""An operator's word on the fabric: resolve a fault, quarantine a port or lift a quarantine.

Each records its evidence (with the reason in the audit log's row of the
request) and reconciles the jobs on the node.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from scheduler_svc.api.schemas.fabric import FabricState, MaintenanceFlagOut, SwitchFaultOut
from scheduler_svc.api.schemas.faults import FaultList, FaultResolveOut
from scheduler_svc.config import Settings
from scheduler_svc.engine import fabric as health
from scheduler_svc.errors import Conflict, NotFound
from scheduler_svc.fleet import EventType, emit
from scheduler_svc.services import fabric, reconciler
from scheduler_svc.services.events import announce_flag
from scheduler_svc.services.status import fault_out
from scheduler_svc.store import models as m
from scheduler_svc.store.faults import FaultRepo
from scheduler_svc.store.jobs import JobRepo
from scheduler_svc.store.maintenance import MaintenanceRepo


def resolve_fault(
    session: Session,
    fault_id: int,
    *,
    reason: str,
    by: str | None,
    now: datetime,
    settings: Settings,
) -> tuple[m.Fault, list[m.Decision]]:
    """Close one fault at once (the part was repaired or replaced); its jobs fail back."""
    repo = FaultRepo(session)
    fault = repo.get(fault_id)
    if fault is None:
        raise NotFound(f"fault {fault_id} does not exist")
    if fault.resolved_at is not None:
        raise Conflict(f"fault {fault_id} was already closed at {fault.resolved_at.isoformat()}")
    repo.close(fault, now, f"resolved by an operator: {reason}", by)
    switches = fabric.clear_switches(session, [fault], now, settings.correlation_window_s)
    nodes = fabric.nodes_touched(session, [fault], switches)
    decisions = reconciler.reconcile_jobs(
        session, JobRepo(session).job_ids_on_nodes(nodes), now, settings
    )
    return fault, decisions


def flag_port(
    session: Session,
    node: str,
    device: str,
    port: int,
    *,
    reason: str,
    now: datetime,
    settings: Settings,
) -> m.MaintenanceFlag:
    """Quarantine a port: no traffic on it until the flag is cleared."""
    row = MaintenanceRepo(session).flag(
        m.MaintenanceFlag(
            node=node,
            device=device,
            port=port,
            flagged_at=now,
            reason=f"flagged by an operator: {reason}",
            source="operator",
        )
    )
    if row is None:
        raise Conflict(f"port {node}/{device}/{port} is already flagged")
    announce_flag(session, row)
    reconciler.reconcile_jobs(session, JobRepo(session).job_ids_on_node(node), now, settings)
    return row


def clear_flag(
    session: Session, flag_id: int, now: datetime, settings: Settings
) -> m.MaintenanceFlag:
    """The port was repaired: lift its quarantine; its jobs fail back if it is healthy."""
    row = MaintenanceRepo(session).clear_flag(flag_id, now)
    if row is None:
        raise NotFound(f"no open maintenance flag {flag_id}")
    # Kubernetes and Slurm take Railover's marks off the node (fleet.actions).
    emit(
        session,
        EventType.MAINTENANCE_CLEARED,
        job_id=None,
        subject=f"node/{row.node}/{row.device}/{row.port}",
        data={
            "node": row.node,
            "device": row.device,
            "port": row.port,
            "reason": f"maintenance flag {flag_id} on {row.device}/{row.port} cleared",
        },
    )
    reconciler.reconcile_jobs(session, JobRepo(session).job_ids_on_node(row.node), now, settings)
    return row


def list_faults(
    session: Session,
    *,
    open_only: bool | None,
    node: str | None,
    job_id: str | None,
    limit: int,
    now: datetime,
    settings: Settings,
) -> FaultList:
    """Faults with their evidence; open ones with their health and clearing time by now."""
    nodes = None
    if job_id is not None:
        if JobRepo(session).get(job_id) is None:
            raise NotFound(f"job {job_id!r} does not exist")
        nodes = JobRepo(session).nodes_of(job_id)
    repo = FaultRepo(session)
    rows = repo.listing(open_only=bool(open_only), node=node, nodes=nodes, limit=limit)
    if open_only is False:
        rows = [f for f in rows if f.resolved_at is not None]
    ev, _ = fabric.evidence(session, {f.node for f in rows if f.resolved_at is None})
    healths = health.assess(ev, now, fabric.rules(settings)).healths
    return FaultList(faults=[fault_out(f, healths.get(f.id)) for f in rows])


def resolve(
    session: Session,
    fault_id: int,
    *,
    reason: str,
    by: str | None,
    now: datetime,
    settings: Settings,
) -> FaultResolveOut:
    fault, decisions = resolve_fault(
        session, fault_id, reason=reason, by=by, now=now, settings=settings
    )
    return FaultResolveOut(fault=fault_out(fault), decisions=[d.decision_id for d in decisions])


def fabric_state(session: Session, *, include_cleared: bool) -> FabricState:
    return FabricState(
        faults=[fault_out(f) for f in FaultRepo(session).all(open_only=not include_cleared)],
        switch_faults=[
            SwitchFaultOut.model_validate(s, from_attributes=True)
            for s in FaultRepo(session).open_switch_faults()
        ],
        maintenance_flags=[
            MaintenanceFlagOut.model_validate(f, from_attributes=True)
            for f in MaintenanceRepo(session).open_flags()
        ],
    )
