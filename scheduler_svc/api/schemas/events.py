"""What agents report: one model per event kind, and the batch they post (/v1/events)."""

from __future__ import annotations

import enum
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field, model_validator

from scheduler_svc.api.schemas.fields import (
    JSON_INT_MAX,
    Count,
    DeviceName,
    GpuNo,
    Incarnation,
    JobId,
    Label,
    Name,
    Strict,
    UtcTime,
    whole_number,
)
from scheduler_svc.api.schemas.jobs import CommId


class EventKind(enum.StrEnum):
    PORT_DOWN = "port_down"
    PORT_UP = "port_up"
    CQE_ERROR = "cqe_error"
    DEVICE_FATAL = "device_fatal"
    PORT_EVENT = "port_event"
    COUNTER = "counter"
    PCIE_DEGRADED = "pcie_degraded"
    PATH_SWITCH = "path_switch"
    PROGRESS = "progress"
    COMMUNICATOR = "communicator"
    STALL = "stall"
    DEVICE_LOST = "device_lost"
    PORT_RATE = "port_rate"


class EventIn(Strict):
    """What every event kind may carry; each kind's own model (below) says what it needs."""

    event_id: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[\x21-\x7e]+$")]
    node: Name
    kind: EventKind
    device: DeviceName | None = None
    port: Annotated[int, Field(strict=True, ge=1, le=255), BeforeValidator(whole_number)] | None = (
        None
    )
    wc_status: (
        Annotated[int, Field(strict=True, ge=0, le=255), BeforeValidator(whole_number)] | None
    ) = None
    vendor_err: (
        Annotated[int, Field(strict=True, ge=0, le=2**32 - 1), BeforeValidator(whole_number)] | None
    ) = None
    event_type: (
        Annotated[int, Field(strict=True, ge=0, le=255), BeforeValidator(whole_number)] | None
    ) = None
    counter: Label | None = None
    delta: Count | None = None
    comm_id: CommId | None = None
    rank: (
        Annotated[int, Field(strict=True, ge=0, le=2**31 - 1), BeforeValidator(whole_number)] | None
    ) = None
    ops_done: Count | None = None
    nranks: (
        Annotated[int, Field(strict=True, ge=1, le=2**31 - 1), BeforeValidator(whole_number)] | None
    ) = Field(default=None, description="communicator: ranks in the communicator")
    job_id: JobId | None = Field(
        default=None,
        description="communicator, progress: the job the process says it is in (from its "
        "HELLO); a progress report naming it counts for that job alone",
    )
    incarnation: Incarnation | None = Field(
        default=None,
        description="progress: the job's incarnation the process says it runs. A report "
        "naming another than the job's current one is kept as history and moves no op "
        "count; one naming none counts for the current incarnation when observed after "
        "it started",
    )
    seq_number: CommId | None = Field(
        default=None, description="stall: the CCL's sequence number of the open collective"
    )
    gpu: GpuNo | None = Field(
        default=None, description="device_lost: the index of the GPU that is gone from sysfs"
    )
    rate_gbps: Annotated[float, Field(strict=True, ge=0, le=10000)] | None = Field(
        default=None,
        description="port_rate: the port's rate now (speed x width, Gb/s); below the rate it "
        "registered with, a degraded fault",
    )
    observed_at: UtcTime = Field(
        description="When the agent saw it; at most observed_at_future_skew_s ahead of the "
        "service's clock"
    )
    detail: Annotated[
        dict[
            Annotated[str, Field(min_length=1, max_length=64)],
            Annotated[str, Field(max_length=256)]
            | Annotated[
                int,
                Field(strict=True, ge=-JSON_INT_MAX, le=JSON_INT_MAX),
                BeforeValidator(whole_number),
            ]
            | Annotated[float, Field(strict=True, ge=-1e12, le=1e12)]
            | bool
            | None,
        ],
        Field(max_length=16),
    ] = Field(default_factory=dict, description="Up to 16 scalar facts for people and the log")


class _OnDevice(EventIn):
    device: DeviceName


class PortDownEvent(_OnDevice):
    kind: Literal[EventKind.PORT_DOWN]


class PortUpEvent(_OnDevice):
    kind: Literal[EventKind.PORT_UP]


class CqeErrorEvent(_OnDevice):
    kind: Literal[EventKind.CQE_ERROR]
    wc_status: Annotated[int, Field(strict=True, ge=0, le=255), BeforeValidator(whole_number)]


class DeviceFatalEvent(_OnDevice):
    kind: Literal[EventKind.DEVICE_FATAL]


class CounterEvent(_OnDevice):
    kind: Literal[EventKind.COUNTER]


class PortEventEvent(EventIn):
    kind: Literal[EventKind.PORT_EVENT]


class PcieDegradedEvent(EventIn):
    kind: Literal[EventKind.PCIE_DEGRADED]


class PathSwitchEvent(EventIn):
    kind: Literal[EventKind.PATH_SWITCH]


class ProgressEvent(EventIn):
    kind: Literal[EventKind.PROGRESS]


class CommunicatorEvent(EventIn):
    """A CCL communicator a process joined (the NCCL profiler plugin announces each)."""

    kind: Literal[EventKind.COMMUNICATOR]
    comm_id: Annotated[CommId, Field(ge=1)]
    rank: Annotated[int, Field(strict=True, ge=0, le=2**31 - 1), BeforeValidator(whole_number)]
    nranks: Annotated[int, Field(strict=True, ge=1, le=2**31 - 1), BeforeValidator(whole_number)]

    @model_validator(mode="after")
    def _rank_in_communicator(self) -> CommunicatorEvent:
        if self.rank >= self.nranks:
            raise ValueError(f"rank: {self.rank} is not below nranks {self.nranks}")
        return self


class StallEvent(EventIn):
    """A collective open far longer than expected: evidence on the node, not a NIC fault."""

    kind: Literal[EventKind.STALL]
    comm_id: Annotated[CommId, Field(ge=1)]
    seq_number: CommId


class DeviceLostEvent(EventIn):
    """A GPU (``gpu``) or an RNIC (``device``) the node had is gone from its sysfs: a
    topology-loss fault at once, before the node registers what is left."""

    kind: Literal[EventKind.DEVICE_LOST]

    @model_validator(mode="after")
    def _one_part(self) -> DeviceLostEvent:
        if (self.gpu is None) == (self.device is None):
            raise ValueError("device_lost names exactly one of device (an RNIC) or gpu")
        return self


class PortRateEvent(_OnDevice):
    """A port's rate changed (renegotiated): the newest report by observation time is the
    port's rate; one below the registered rate is a degradation, one back at it restores."""

    kind: Literal[EventKind.PORT_RATE]
    port: Annotated[int, Field(strict=True, ge=1, le=255), BeforeValidator(whole_number)]
    rate_gbps: Annotated[float, Field(strict=True, ge=0, le=10000)]


AnyEvent = Annotated[
    PortDownEvent
    | PortUpEvent
    | CqeErrorEvent
    | DeviceFatalEvent
    | CounterEvent
    | PortEventEvent
    | PcieDegradedEvent
    | PathSwitchEvent
    | ProgressEvent
    | CommunicatorEvent
    | StallEvent
    | DeviceLostEvent
    | PortRateEvent,
    Field(discriminator="kind"),
]


class EventBatch(Strict):
    events: Annotated[list[AnyEvent], Field(min_length=1, max_length=1000)]


class EventsAccepted(BaseModel):
    accepted: int
    duplicates: int
    faults_opened: int = 0
    decisions: list[str] = Field(default_factory=list, description="ids of decisions made")
