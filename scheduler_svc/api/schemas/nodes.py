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


RnicKind = Literal["physical", "sf", "vf", "bond", "soft"]
# A counter as a port's counters/, counters_ext/ or hw_counters/ names it.
CounterName = Annotated[
    str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_]*$")
]
CounterAvailability = Annotated[
    str,
    Field(max_length=128, pattern=r"^(available|unavailable \([\x20-\x7e]{1,110}\))$"),
]


def _blank_is_null(value: object) -> object:
    # Agents before RNIC kinds sent "" for "no PCI function".
    return None if value == "" else value


class RnicIn(Strict):
    name: DeviceName
    port: Annotated[int, Field(strict=True, ge=1, le=255), BeforeValidator(whole_number)] = 1
    pci: Annotated[PciAddress | None, BeforeValidator(_blank_is_null)] = Field(
        default=None,
        description="The nearest PCI function (an SF's parent, a bond's first member); null "
        "for a soft device or one whose sysfs names none",
    )
    kind: RnicKind = Field(
        default="physical",
        description="physical; sf (a scalable function of `pci`); vf (an SR-IOV virtual "
        "function, `physfn` its physical one); bond (a RoCE LAG bond over `members`); soft "
        "(rxe, siw: never a primary or backup)",
    )
    physfn: PciAddress | None = Field(default=None, description="vf: its physical function")
    members: Annotated[list[PciAddress], Field(max_length=16)] = Field(
        default_factory=list, description="bond: its member PCI functions"
    )
    counters: Annotated[dict[CounterName, CounterAvailability], Field(max_length=64)] = Field(
        default_factory=dict,
        description='Each watched counter: "available", or "unavailable (why)" (e.g. '
        '"unavailable (N/A (no PMA))"): a rise there can never be reported',
    )
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

    @model_validator(mode="after")
    def _kind_fits(self) -> RnicIn:
        if self.kind == "soft" and self.pci is not None:
            raise ValueError("pci: a soft device (rxe, siw) has no PCI function; send null")
        if self.physfn is not None and self.kind != "vf":
            raise ValueError(f"physfn: only a vf has a physical function, not a {self.kind}")
        if self.members and self.kind != "bond":
            raise ValueError(f"members: only a bond has member functions, not a {self.kind}")
        return self


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
