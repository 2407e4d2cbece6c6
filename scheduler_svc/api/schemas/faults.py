"""Open and closed faults, and an operator closing one (/v1/faults)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from scheduler_svc.api.schemas.fields import Strict


class FaultOut(BaseModel):
    id: int
    node: str
    device: str
    port: int | None = Field(description="null when the whole RNIC failed")
    kind: str
    opened_at: datetime
    switch: str | None = Field(default=None, description="Fabric switch the port is cabled to")
    cleared_at: datetime | None = Field(
        default=None, description="When the port was seen up again (or the fault closed)"
    )
    resolved_at: datetime | None = Field(
        default=None, description="When it closed: its clearing rule was met, or an operator"
    )
    resolved_reason: str | None = None
    resolved_by: str | None = Field(default=None, description="Token id of the operator")
    last_error_at: datetime | None = Field(default=None, description="The newest error seen")
    health: Literal["failed", "recovering", "healthy"] | None = Field(
        default=None, description="By its clearing rule, now (open faults only)"
    )
    clears_at: datetime | None = Field(
        default=None, description="When a recovering fault closes if nothing new happens"
    )
    evidence: dict[str, Any] = Field(
        default_factory=dict, description="What opened it: the first event's id and details"
    )


class FaultList(BaseModel):
    faults: list[FaultOut]


class FaultResolveIn(Strict):
    reason: Annotated[str, Field(min_length=1, max_length=500)] = Field(
        description="Why it is closed (repaired, replaced, a false alarm); kept with the fault"
    )


class FaultResolveOut(BaseModel):
    fault: FaultOut
    decisions: list[str] = Field(description="ids of the decisions it led to")
