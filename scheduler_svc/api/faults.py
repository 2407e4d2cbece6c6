"""Faults with their evidence, and an operator's resolve (fleet role only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request

from scheduler_svc.api import routing
from scheduler_svc.api.deps import FleetAuth, NowDep, SessionDep, SettingsDep
from scheduler_svc.api.schemas.faults import FaultList, FaultResolveIn, FaultResolveOut
from scheduler_svc.api.schemas.fields import Name, RowId
from scheduler_svc.errors import (
    VALIDATION,
    Conflict,
    Forbidden,
    NotFound,
    Unauthorized,
    responses,
)
from scheduler_svc.services import operator

router = routing.router(prefix="/v1/faults", tags=["fabric"])


@router.get(
    "",
    operation_id="list_faults",
    responses=responses(Unauthorized, Forbidden, NotFound) | VALIDATION,
)
def list_faults(
    *,
    session: SessionDep,
    _: FleetAuth,
    settings: SettingsDep,
    now: NowDep,
    open: Annotated[
        bool | None, Query(description="true: only open ones; false: only closed ones")
    ] = None,
    node: Annotated[Name | None, Query(description="Only faults on this node")] = None,
    job_id: Annotated[
        str | None, Query(max_length=128, description="Only faults on this job's nodes")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> FaultList:
    """Faults, newest first, with their evidence, health and clearing time."""
    return operator.list_faults(
        session, open_only=open, node=node, job_id=job_id, limit=limit, now=now, settings=settings
    )


@router.post(
    "/{fault_id}/resolve",
    operation_id="resolve_fault",
    responses=responses(Unauthorized, Forbidden, NotFound, Conflict) | VALIDATION,
)
def resolve_fault(
    fault_id: RowId,
    *,
    body: FaultResolveIn,
    request: Request,
    session: SessionDep,
    who: FleetAuth,
    settings: SettingsDep,
    now: NowDep,
) -> FaultResolveOut:
    """Close a fault at once (repaired, replaced, a false alarm); its jobs fail back."""
    # The audit log row of this request carries the reason (fleet.service.AuditRequests).
    request.state.audit_detail = f"resolve fault {fault_id}: {body.reason}"
    return operator.resolve(
        session, fault_id, reason=body.reason, by=who.token_id, now=now, settings=settings
    )
