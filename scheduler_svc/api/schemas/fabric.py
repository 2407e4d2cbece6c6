"""The fabric as the service sees it: open faults, inferred switch faults and ports
flagged for maintenance (/v1/fabric, /v1/maintenance-flags)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from scheduler_svc.api.schemas.faults import FaultOut
from scheduler_svc.api.schemas.fields import Name, Strict


class SwitchFaultOut(BaseModel):
    id: int
    switch: str
    nodes: list[str]
    reason: str
    opened_at: datetime
    cleared_at: datetime | None


class MaintenanceFlagOut(BaseModel):
    id: int
    node: str
    device: str
    port: int
    reason: str
    flagged_at: datetime
    cleared_at: datetime | None
    source: Literal["flapping", "operator"] = "flapping"


class FabricState(BaseModel):
    faults: list[FaultOut]
    switch_faults: list[SwitchFaultOut]
    maintenance_flags: list[MaintenanceFlagOut]


class FlagIn(Strict):
    node: Name
    device: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
    port: Annotated[int, Field(ge=1, le=255)] = 1
    reason: Annotated[str, Field(min_length=1, max_length=500)]
