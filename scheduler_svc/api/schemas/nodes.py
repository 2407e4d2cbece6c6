"""A node as its agent registers it: GPUs, RNICs and their topology (/v1/nodes)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field, StrictBool, model_validator

from scheduler_svc.api.schemas.fields import (
    RAIL_MAX,
    DeviceName,
    GpuNo,
    Label,
    Numa,
    PciAddress,
    Strict,
    whole_number,
)


class GpuIn(Strict):
    index: GpuNo
    pci: PciAddress
    numa: Numa | None = None
    pcie_switch: Label | None = None
    root_complex: Label | None = None
    nvlink: StrictBool = False


class RnicIn(Strict):
    name: DeviceName
    port: Annotated[int, Field(strict=True, ge=1, le=255), BeforeValidator(whole_number)] = 1
    pci: PciAddress | Literal[""] = ""
    numa: Numa | None = None
    pcie_switch: Label | None = None
    root_complex: Label | None = None
    rate_gbps: Annotated[float, Field(strict=True, ge=0, le=10000)] = 0.0
    link_layer: Annotated[Label, Field(max_length=32)] | None = None
    netdev: Label | None = None
    switch: Label | None = Field(
        default=None, description="Fabric switch this port is cabled to; null = not GPU fabric"
    )
    rail: (
        Annotated[int, Field(strict=True, ge=0, le=RAIL_MAX), BeforeValidator(whole_number)] | None
    ) = None
    state: Annotated[Label, Field(max_length=32)] = "ACTIVE"


class NodeIn(Strict):
    gpus: Annotated[list[GpuIn], Field(max_length=1024)]
    rnics: Annotated[list[RnicIn], Field(max_length=1024)]

    @model_validator(mode="after")
    def _unique(self) -> NodeIn:
        indexes = [g.index for g in self.gpus]
        if len(set(indexes)) != len(indexes):
            raise ValueError("gpus: every GPU index must appear once")
        ports = [(r.name, r.port) for r in self.rnics]
        if len(set(ports)) != len(ports):
            raise ValueError("rnics: every (name, port) must appear once")
        return self


class GpuPathOut(BaseModel):
    gpu: int
    primary: str | None
    backup: str | None
    primary_cost: int | None
    backup_cost: int | None
    primary_switch: str | None
    backup_switch: str | None
    rail_disjoint: bool


class NodeOut(NodeIn):
    name: str
    registered_at: datetime
    updated_at: datetime
    topology_version: int
    # Pydantic copies a field's default for each instance; ruff cannot see from here that
    # NodeIn is a pydantic model.
    backup_plan: list[GpuPathOut] = []  # noqa: RUF012
    warnings: list[str] = []  # noqa: RUF012
