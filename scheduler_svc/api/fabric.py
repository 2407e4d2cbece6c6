"""The fabric as the service sees it: open faults, inferred switch failures, flagged ports."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import Query

from scheduler_svc.api import routing
from scheduler_svc.deps import FleetAuth, Reader, SessionDep
from scheduler_svc.errors import Forbidden, NotFound, Unauthorized, responses
from scheduler_svc.fleet import EventType, emit
from scheduler_svc.schemas import FabricState, MaintenanceFlagOut, SwitchFaultOut
from scheduler_svc.services.status import fault_out
from scheduler_svc.store.repositories import CoordinationRepo, FaultRepo

router = routing.router(prefix="/v1", tags=["fabric"])


@router.get("/fabric", operation_id="get_fabric", responses=responses(Unauthorized))
def get_fabric(
    session: SessionDep,
    _: Reader,
    include_cleared: bool = Query(False, description="Also the last 500 cleared faults"),
) -> FabricState:
    """Open faults, switch failures inferred from correlated faults, and flagged ports."""
    repo = CoordinationRepo(session)
    return FabricState(
        faults=[fault_out(f) for f in FaultRepo(session).all(open_only=not include_cleared)],
        switch_faults=[
            SwitchFaultOut.model_validate(s, from_attributes=True)
            for s in repo.open_switch_faults()
        ],
        maintenance_flags=[
            MaintenanceFlagOut.model_validate(f, from_attributes=True) for f in repo.open_flags()
        ],
    )


@router.delete(
    "/maintenance-flags/{flag_id}",
    operation_id="clear_maintenance_flag",
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def clear_maintenance_flag(flag_id: int, session: SessionDep, _: FleetAuth) -> MaintenanceFlagOut:
    """The port was repaired: clear its flag so its jobs can fail back to it again."""
    row = CoordinationRepo(session).clear_flag(flag_id, datetime.now(UTC))
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
    return MaintenanceFlagOut.model_validate(row, from_attributes=True)
