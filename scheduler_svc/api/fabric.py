"""The fabric as the service sees it: open faults, inferred switch failures, flagged ports,
and planned maintenance."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request

from scheduler_svc.api import routing
from scheduler_svc.api.deps import FleetAuth, NowDep, Reader, SessionDep, SettingsDep
from scheduler_svc.api.schemas.fabric import FabricState, FlagIn, MaintenanceFlagOut
from scheduler_svc.api.schemas.fields import RowId
from scheduler_svc.api.schemas.maintenance import MaintenanceIn, MaintenanceList, MaintenanceOut
from scheduler_svc.errors import VALIDATION, Conflict, Forbidden, NotFound, Unauthorized, responses
from scheduler_svc.services import maintenance, operator

router = routing.router(prefix="/v1", tags=["fabric"])


@router.get("/fabric", operation_id="get_fabric", responses=responses(Unauthorized, Forbidden))
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
    flag_id: RowId, session: SessionDep, _: FleetAuth, settings: SettingsDep, now: NowDep
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


@router.post(
    "/maintenance",
    status_code=201,
    operation_id="schedule_maintenance",
    responses=responses(Unauthorized, Forbidden) | VALIDATION,
)
def schedule_maintenance(
    *,
    body: MaintenanceIn,
    request: Request,
    session: SessionDep,
    who: FleetAuth,
    settings: SettingsDep,
    now: NowDep,
) -> MaintenanceOut:
    """Plan a window on a switch, an RNIC (or one port) or a node: its jobs move off first."""
    request.state.audit_detail = f"maintenance from {body.start_at.isoformat()}: {body.reason}"
    return maintenance.schedule(session, body, by=who.token_id, now=now, settings=settings)


@router.get(
    "/maintenance",
    operation_id="list_maintenance",
    responses=responses(Unauthorized, Forbidden) | VALIDATION,
)
def list_maintenance(
    session: SessionDep,
    _: Reader,
    settings: SettingsDep,
    now: NowDep,
    include_done: bool = Query(False, description="Also windows that are over and cleared"),
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> MaintenanceList:
    """Planned maintenance windows by start, each with its phase now."""
    return maintenance.listing(
        session, include_done=include_done, limit=limit, now=now, settings=settings
    )


@router.delete(
    "/maintenance/{window_id}",
    operation_id="cancel_maintenance",
    responses=responses(Unauthorized, Forbidden, NotFound, Conflict) | VALIDATION,
)
def cancel_maintenance(
    window_id: RowId, session: SessionDep, _: FleetAuth, settings: SettingsDep, now: NowDep
) -> MaintenanceOut:
    """End a window now (done early, or called off): its jobs fail back."""
    return maintenance.cancel(session, window_id, now, settings)
