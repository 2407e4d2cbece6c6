"""The fabric as the service sees it: open faults, inferred switch failures, flagged ports."""

from __future__ import annotations

from fastapi import Query

from scheduler_svc.api import routing
from scheduler_svc.deps import FleetAuth, NowDep, Reader, SessionDep, SettingsDep
from scheduler_svc.errors import VALIDATION, Conflict, Forbidden, NotFound, Unauthorized, responses
from scheduler_svc.schemas import FabricState, FlagIn, MaintenanceFlagOut
from scheduler_svc.services import operator

router = routing.router(prefix="/v1", tags=["fabric"])


@router.get("/fabric", operation_id="get_fabric", responses=responses(Unauthorized))
def get_fabric(
    session: SessionDep,
    _: Reader,
    include_cleared: bool = Query(False, description="Also the last 500 cleared faults"),
) -> FabricState:
    """Open faults, switch failures inferred from correlated faults, and flagged ports."""
    return operator.fabric_state(session, include_cleared=include_cleared)


@router.delete(
    "/maintenance-flags/{flag_id}",
    operation_id="clear_maintenance_flag",
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def clear_maintenance_flag(
    flag_id: int, session: SessionDep, _: FleetAuth, settings: SettingsDep, now: NowDep
) -> MaintenanceFlagOut:
    """The port was repaired: clear its flag; its jobs fail back to it if it is healthy."""
    row = operator.clear_flag(session, flag_id, now, settings)
    return MaintenanceFlagOut.model_validate(row, from_attributes=True)


@router.post(
    "/maintenance-flags",
    status_code=201,
    operation_id="flag_port",
    responses=responses(Unauthorized, Forbidden, Conflict) | VALIDATION,
)
def flag_port(
    body: FlagIn, session: SessionDep, _: FleetAuth, settings: SettingsDep, now: NowDep
) -> MaintenanceFlagOut:
    """Quarantine a port: no rank's traffic uses it until the flag is cleared."""
    row = operator.flag_port(
        session, body.node, body.device, body.port, reason=body.reason, now=now, settings=settings
    )
    return MaintenanceFlagOut.model_validate(row, from_attributes=True)
