"""Planned maintenance windows of a switch, a node, an RNIC or a port (/v1/maintenance)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

from scheduler_svc.api.schemas.fields import DAY_S, DeviceName, Label, Name, Strict, UtcTime


class MaintenanceTarget(Strict):
    """What goes down: a fabric switch, or a node, one RNIC of it or one port of that RNIC."""

    switch: Label | None = Field(default=None, description="A fabric switch (rail map name)")
    node: Name | None = None
    device: DeviceName | None = Field(default=None, description="An RNIC of `node`")
    port: Annotated[int, Field(strict=True, ge=1, le=255)] | None = Field(
        default=None, description="One port of `device`; unset: the whole RNIC"
    )

    @model_validator(mode="after")
    def _one_target(self) -> MaintenanceTarget:
        if (self.switch is None) == (self.node is None):
            raise ValueError("name either a switch, or a node (with its device and port)")
        if self.switch is not None and (self.device is not None or self.port is not None):
            raise ValueError("a switch target takes no device or port")
        if self.port is not None and self.device is None:
            raise ValueError("a port needs its device")
        return self


MAINTENANCE_MAX_S = 7 * DAY_S


class MaintenanceIn(Strict):
    target: MaintenanceTarget
    start_at: UtcTime = Field(description="When the target goes down (RFC 3339)")
    duration_s: Annotated[float, Field(strict=True, gt=0, le=MAINTENANCE_MAX_S)] = Field(
        description="How long it stays down, seconds (at most 7 days)"
    )
    reason: Annotated[str, Field(min_length=1, max_length=500)]


class MaintenanceOut(BaseModel):
    id: int
    target: MaintenanceTarget
    start_at: datetime
    end_at: datetime
    moves_at: datetime = Field(description="When jobs on the target start moving to backups")
    reason: str
    phase: Literal["scheduled", "moving", "active", "ended", "done"]
    created_at: datetime
    cancelled_at: datetime | None
    would_restart: list[str] = Field(
        description="Jobs left without a path for some GPU by this window (when scheduled): "
        "they restart rather than fail over"
    )
    decisions: list[str] = Field(
        default_factory=list, description="Decisions this request made (ids)"
    )


class MaintenanceList(BaseModel):
    maintenance: list[MaintenanceOut]
