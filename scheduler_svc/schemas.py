"""Wire models of the v1 API. Field names here are a contract with fleet managers and agents."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    HttpUrl,
    field_validator,
    model_validator,
)

from scheduler_svc.store.models import AckStatus, CommandKind, CommandState, JobMode

Name = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")]
PciAddress = Annotated[str, Field(max_length=32)]


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


UtcTime = Annotated[AwareDatetime, AfterValidator(_utc)]


class Strict(BaseModel):
    """Unknown fields are refused so a typo never silently means "use the default"."""

    model_config = ConfigDict(extra="forbid")


# --- nodes -----------------------------------------------------------------


class GpuIn(Strict):
    index: Annotated[int, Field(ge=0, le=1023)]
    pci: PciAddress
    numa: Annotated[int, Field(ge=-1)] | None = None
    pcie_switch: str | None = None
    root_complex: str | None = None
    nvlink: bool = False


class RnicIn(Strict):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    port: Annotated[int, Field(ge=1, le=255)] = 1
    pci: PciAddress = ""
    numa: Annotated[int, Field(ge=-1)] | None = None
    pcie_switch: str | None = None
    root_complex: str | None = None
    rate_gbps: Annotated[float, Field(ge=0)] = 0.0
    link_layer: str | None = None
    netdev: str | None = None
    switch: str | None = Field(
        default=None, description="Fabric switch this port is cabled to; null = not GPU fabric"
    )
    rail: Annotated[int, Field(ge=0)] | None = None
    state: str = "ACTIVE"


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
    backup_plan: list[GpuPathOut] = []
    warnings: list[str] = []


# --- jobs ------------------------------------------------------------------


class RankIn(Strict):
    rank: Annotated[int, Field(ge=0)]
    node: Name
    gpu: Annotated[int, Field(ge=0)]


class CommunicatorIn(Strict):
    comm_id: Annotated[int, Field(gt=0, lt=2**64, description="The CCL's 64-bit communicator id")]
    channels: Annotated[int, Field(ge=1, le=64)] = 8
    ranks: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list, description="Job ranks in this communicator; empty = all"
    )


DeviceName = Annotated[
    str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
]


class CclIn(Strict):
    """The CCL a job runs, when Railover is not the one failing it over (stock NCCL).

    With NCCL >= 2.29.7 and ``port_failover`` (NCCL_IB_RESILIENCY_PORT_FAILOVER=1),
    a device of a merged virtual NIC that fails is failed over by NCCL itself to
    its partners; a virtual NIC with no healthy device left is fatal to NCCL.
    """

    kind: Literal["nccl"]
    version: Annotated[
        str, Field(max_length=16, pattern=r"^[0-9]{1,3}\.[0-9]{1,3}(\.[0-9]{1,3})?$")
    ]
    port_failover: bool = Field(
        default=False, description="NCCL_IB_RESILIENCY_PORT_FAILOVER=1 is set for the job"
    )
    merge: Literal["explicit", "rail", "pcie_switch"] = Field(
        default="explicit",
        description=(
            "How NCCL merges devices into virtual NICs: explicit = merged_nics (same on every "
            "node); rail = a node's devices on one rail; pcie_switch = a node's devices behind "
            "one PCIe switch"
        ),
    )
    merged_nics: Annotated[
        list[Annotated[list[DeviceName], Field(min_length=1, max_length=16)]],
        Field(max_length=256),
    ] = Field(
        default_factory=list, description="Virtual NICs by device name, e.g. [[mlx5_0, mlx5_1]]"
    )

    @model_validator(mode="after")
    def _groups(self) -> CclIn:
        if self.merge != "explicit" and self.merged_nics:
            raise ValueError(
                f"merged_nics: give groups only with merge 'explicit', not {self.merge!r}"
            )
        seen: set[str] = set()
        for i, group in enumerate(self.merged_nics):
            for dev in group:
                if dev in seen:
                    raise ValueError(f"merged_nics[{i}]: device {dev!r} is in two virtual NICs")
                seen.add(dev)
        return self


class JobIn(Strict):
    job_id: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][\w.:-]*$")]
    ranks: Annotated[list[RankIn], Field(min_length=1, max_length=131072)]
    checkpoint_interval_s: Annotated[float, Field(gt=0)]
    reload_s: Annotated[float, Field(ge=0)]
    detect_s: Annotated[float, Field(ge=0)] = 0.0
    timeout_s: Annotated[float, Field(ge=0)] | None = Field(
        default=None, description="RNIC retransmission timeout; or give ib_timeout and ib_retry_cnt"
    )
    ib_timeout: Annotated[int, Field(ge=0, le=31)] | None = None
    ib_retry_cnt: Annotated[int, Field(ge=0, le=7)] | None = None
    last_checkpoint_at: UtcTime
    last_checkpoint_iteration: Annotated[int, Field(ge=0)] | None = None
    slowdown_k: Annotated[float, Field(ge=1)] | None = Field(
        default=None, description="k the job measured while failed over, if it has"
    )
    comm_share: Annotated[float, Field(ge=0, le=1)] | None = Field(
        default=None, description="Share of step time spent in communication (for modelled k)"
    )
    dp_size: Annotated[int, Field(ge=1)] = 1
    tp_size: Annotated[int, Field(ge=1)] = 1
    pp_size: Annotated[int, Field(ge=1)] = 1
    allow_scaling: bool = Field(
        default=False, description="The job can restart without a node, shrinking DP"
    )
    spare_nodes: bool = Field(default=True, description="A healthy spare node is ready for restart")
    node_replace_s: Annotated[float, Field(ge=0)] = 0.0
    notify_url: HttpUrl | None = None
    communicators: Annotated[list[CommunicatorIn], Field(max_length=1024)] = Field(
        default_factory=list,
        description="CCL communicators whose progress the agents report, for switch points",
    )
    repair_estimate_s: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="How long a failed RNIC/link takes to repair here"
    )
    ccl: CclIn | None = Field(
        default=None, description="The CCL the job runs when it is stock NCCL (not Railover's)"
    )

    @model_validator(mode="after")
    def _check(self) -> JobIn:
        ranks = [r.rank for r in self.ranks]
        if sorted(ranks) != list(range(len(ranks))):
            raise ValueError("ranks: rank numbers must be exactly 0..N-1, each once")
        placed = [(r.node, r.gpu) for r in self.ranks]
        if len(set(placed)) != len(placed):
            raise ValueError("ranks: two ranks are placed on the same node and GPU")
        if self.timeout_s is None and (self.ib_timeout is None or self.ib_retry_cnt is None):
            raise ValueError("timeout_s: give timeout_s, or both ib_timeout and ib_retry_cnt")
        comm_ids = [c.comm_id for c in self.communicators]
        if len(set(comm_ids)) != len(comm_ids):
            raise ValueError("communicators: every comm_id must appear once")
        n = len(self.ranks)
        for i, c in enumerate(self.communicators):
            if any(r >= n for r in c.ranks):
                raise ValueError(f"communicators[{i}].ranks: ranks must be below {n}")
        return self


class JobOut(BaseModel):
    job_id: str
    ranks: list[RankIn]
    checkpoint_interval_s: float
    reload_s: float
    detect_s: float
    timeout_s: float
    last_checkpoint_at: datetime
    last_checkpoint_iteration: int | None
    last_checkpoint_kind: str
    slowdown_k: float | None
    comm_share: float | None
    dp_size: int
    tp_size: int
    pp_size: int
    allow_scaling: bool
    spare_nodes: bool
    node_replace_s: float
    notify_url: str | None
    mode: JobMode
    created_at: datetime
    communicators: list[CommunicatorIn] = Field(default_factory=list)
    repair_estimate_s: float | None = None
    measured_k: float | None = Field(default=None, description="k measured from iteration times")
    failed_over_at: datetime | None = None
    ccl: CclIn | None = None


class CheckpointIn(Strict):
    at: UtcTime
    iteration: Annotated[int, Field(ge=0)] | None = None
    kind: Literal["full", "flowcheck"] = "full"


class CheckpointOut(BaseModel):
    job_id: str
    at: datetime
    iteration: int | None
    kind: str
    current: bool = Field(description="True when this is now the job's newest usable checkpoint")


# --- events ----------------------------------------------------------------


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


class EventIn(Strict):
    event_id: Annotated[str, Field(min_length=1, max_length=128)]
    node: Name
    kind: EventKind
    device: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    port: Annotated[int, Field(ge=1, le=255)] | None = None
    wc_status: Annotated[int, Field(ge=0, le=255)] | None = None
    vendor_err: Annotated[int, Field(ge=0)] | None = None
    event_type: Annotated[int, Field(ge=0)] | None = None
    counter: Annotated[str, Field(max_length=64)] | None = None
    delta: Annotated[int, Field(ge=0)] | None = None
    comm_id: Annotated[int, Field(ge=0, lt=2**64)] | None = None
    rank: Annotated[int, Field(ge=0)] | None = None
    ops_done: Annotated[int, Field(ge=0)] | None = None
    nranks: Annotated[int, Field(ge=1, lt=2**31)] | None = Field(
        default=None, description="communicator: ranks in the communicator"
    )
    job_id: (
        Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][\w.:-]*$")] | None
    ) = Field(default=None, description="communicator: the job the process says it is in")
    seq_number: Annotated[int, Field(ge=0, lt=2**64)] | None = Field(
        default=None, description="stall: the CCL's sequence number of the open collective"
    )
    observed_at: UtcTime
    detail: dict[str, Any] = Field(default_factory=dict)

    @field_validator("detail")
    @classmethod
    def _small(cls, value: dict[str, Any]) -> dict[str, Any]:
        if len(repr(value)) > 4096:
            raise ValueError("detail is larger than 4 KiB")
        return value

    @model_validator(mode="after")
    def _device_for_port_events(self) -> EventIn:
        needs_device = {
            EventKind.PORT_DOWN,
            EventKind.PORT_UP,
            EventKind.CQE_ERROR,
            EventKind.DEVICE_FATAL,
            EventKind.COUNTER,
        }
        if self.kind in needs_device and self.device is None:
            raise ValueError(f"device: required for {self.kind.value} events")
        if self.kind == EventKind.CQE_ERROR and self.wc_status is None:
            raise ValueError("wc_status: required for cqe_error events")
        if self.kind in (EventKind.COMMUNICATOR, EventKind.STALL):
            if not self.comm_id:
                raise ValueError(f"comm_id: required (non-zero) for {self.kind.value} events")
            if self.rank is not None and self.rank >= 2**31:
                raise ValueError(f"rank: must be below 2**31, got {self.rank}")
        if self.kind == EventKind.COMMUNICATOR:
            if self.rank is None or self.nranks is None:
                raise ValueError("rank, nranks: required for communicator events")
            if self.rank >= self.nranks:
                raise ValueError(f"rank: {self.rank} is not below nranks {self.nranks}")
        if self.kind == EventKind.STALL and self.seq_number is None:
            raise ValueError("seq_number: required for stall events")
        return self


class EventBatch(Strict):
    events: Annotated[list[EventIn], Field(min_length=1)]


class EventsAccepted(BaseModel):
    accepted: int
    duplicates: int
    faults_opened: int = 0
    decisions: list[str] = Field(default_factory=list, description="ids of decisions made")


# --- decisions --------------------------------------------------------------


class IterationsIn(Strict):
    iteration_time_s: Annotated[
        list[Annotated[float, Field(gt=0)]], Field(min_length=1, max_length=1000)
    ]


class IterationsOut(BaseModel):
    job_id: str
    samples: int
    degraded: bool = Field(description="True when these were taken while failed over")
    measured_k: float | None
    trustworthy: bool
    detail: str
    decision_id: str | None = Field(description="The re-decision this triggered, if any")


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


class DecisionInputsOut(BaseModel):
    t_elapsed_s: float
    checkpoint_interval_s: float
    k: float
    k_source: str
    detect_s: float
    reload_s: float
    timeout_s: float
    threshold_s: float
    gpus: int
    concurrent_faults: int = 0
    path_available: bool = True
    dp_size: int = 1
    allow_scaling: bool = False
    spare_nodes: bool = True
    node_replace_s: float = 0.0


class DecisionOut(BaseModel):
    decision_id: str
    job_id: str
    action: Literal["failover", "restart", "restart_scaled", "none", "failback"]
    reason: str
    inputs: DecisionInputsOut
    costs_s: dict[str, float | None]
    costs_gpu_s: dict[str, float | None]
    plan: dict[str, Any]
    trigger: str
    created_at: datetime


class DecisionList(BaseModel):
    decisions: list[DecisionOut]


class EvaluateIn(Strict):
    """A what-if question: the same decision the service would make, nothing stored."""

    checkpoint_interval_s: Annotated[float, Field(gt=0)]
    t_elapsed_s: Annotated[float, Field(ge=0)]
    reload_s: Annotated[float, Field(ge=0)]
    detect_s: Annotated[float, Field(ge=0)] = 0.0
    timeout_s: Annotated[float, Field(ge=0)] | None = None
    ib_timeout: Annotated[int, Field(ge=0, le=31)] | None = None
    ib_retry_cnt: Annotated[int, Field(ge=0, le=7)] | None = None
    k: Annotated[float, Field(ge=1)] | None = None
    comm_share: Annotated[float, Field(ge=0, le=1)] | None = None
    bandwidth_left: Annotated[float, Field(gt=0, le=1)] | None = None
    concurrent_faults: Annotated[int, Field(ge=1)] = 1
    gpus: Annotated[int, Field(ge=1)] = 1
    path_available: bool = True
    healed: bool = False
    dp_size: Annotated[int, Field(ge=1)] = 1
    allow_scaling: bool = False
    spare_nodes: bool = True
    node_replace_s: Annotated[float, Field(ge=0)] = 0.0

    @model_validator(mode="after")
    def _timeout(self) -> EvaluateIn:
        if self.timeout_s is None and (self.ib_timeout is None) != (self.ib_retry_cnt is None):
            raise ValueError("timeout_s: give both ib_timeout and ib_retry_cnt, or timeout_s")
        return self


class EvaluateOut(BaseModel):
    action: Literal["failover", "restart", "restart_scaled", "none"]
    reason: str
    inputs: DecisionInputsOut
    costs_s: dict[str, float | None]
    costs_gpu_s: dict[str, float | None]
    notes: list[str]


# --- paths -------------------------------------------------------------------


class RankPathOut(BaseModel):
    rank: int
    node: str
    gpu: int
    primary: str | None
    backup: str | None
    primary_switch: str | None
    backup_switch: str | None
    rail_disjoint: bool
    primary_ok: bool
    backup_ok: bool
    active: str | None


class CommunicatorOut(BaseModel):
    comm_id: int
    channels: int
    ranks: list[int] = Field(description="Job ranks in this communicator; empty = all")
    nranks: int | None = Field(description="As the CCL announced it; null = declared by the fleet")


class RankProgressOut(BaseModel):
    comm_id: int
    rank: int = Field(description="Rank within the communicator, as the CCL reports it")
    ops_done: int
    at: datetime
    rate_ops_per_s: float | None


class StallOut(BaseModel):
    node: str
    comm_id: int
    rank: int | None
    seq_number: int
    func: str
    open_s: float | None
    observed_at: datetime


class JobProgressOut(BaseModel):
    job_id: str
    communicators: list[CommunicatorOut]
    progress: list[RankProgressOut]
    stalls: list[StallOut] = Field(description="Newest first; evidence on nodes, not NIC faults")


class JobPathsOut(BaseModel):
    job_id: str
    ranks: list[RankPathOut]
    broken_pairs: int
    total_pairs: int
    isolated_ranks: list[int]
    failed_over_ranks: list[int]
    warnings: list[str]


# --- commands ----------------------------------------------------------------


class CommandOut(BaseModel):
    command_id: int
    node: str
    job_id: str
    decision_id: str | None
    kind: CommandKind
    epoch: int
    comm_id: int
    ops_done: int
    disabled_channels: list[int]
    ranks: list[int]
    state: CommandState
    created_at: datetime


class CommandList(BaseModel):
    commands: list[CommandOut]


class AckIn(Strict):
    node: Name
    rank: Annotated[int, Field(ge=0)] | None = None
    status: AckStatus = Field(
        description="delivered, applied, failed, or too_late: the rank was already past "
        "the switch point (give its ops_done); nothing was applied"
    )
    detail: Annotated[str, Field(max_length=2000)] = ""
    ops_done: Annotated[int, Field(ge=0, lt=2**63)] | None = Field(
        default=None, description="The rank's op count when it saw the command (too_late)"
    )


# --- tokens & health ------------------------------------------------------------


class Role(enum.StrEnum):
    AGENT = "agent"
    FLEET = "fleet"
    VIEWER = "viewer"


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    detail: dict[str, Any] = Field(default_factory=dict)


# --- status (the page at / and GET /v1/status) ---------------------------------


class RailCellOut(BaseModel):
    rail: int
    device: str
    port: int
    switch: str | None
    state: str = Field(description="Port state the agent last reported (ACTIVE, DOWN, ...)")
    health: Literal["ok", "fault", "down"] = Field(
        description="ok: ACTIVE and no open fault; fault: a fault is open; down: not ACTIVE"
    )
    fault_kind: str | None = None


class NodeStatusOut(BaseModel):
    name: str
    updated_at: datetime
    rails: list[RailCellOut] = Field(description="GPU-fabric RNIC ports by rail (no storage NICs)")


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


class FlagIn(Strict):
    node: Name
    device: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
    port: Annotated[int, Field(ge=1, le=255)] = 1
    reason: Annotated[str, Field(min_length=1, max_length=500)]


class DecisionBriefOut(BaseModel):
    decision_id: str
    action: Literal["failover", "restart", "restart_scaled", "none", "failback"]
    reason: str
    trigger: str
    created_at: datetime
    k: float | None
    k_source: str | None
    t_elapsed_s: float | None
    threshold_s: float | None
    costs_s: dict[str, float | None]
    costs_gpu_s: dict[str, float | None]


class JobStatusOut(BaseModel):
    job_id: str
    mode: JobMode
    ranks: int
    nodes: list[str]
    last_checkpoint_at: datetime
    slowdown_k: float | None = Field(description="k the job measured, if it reported one")
    failed_over_since: datetime | None
    latest_decision: DecisionBriefOut | None


class StatusOut(BaseModel):
    generated_at: datetime
    rails: list[int] = Field(description="Every rail number seen on a registered node")
    nodes: list[NodeStatusOut]
    open_faults: list[FaultOut]
    jobs: list[JobStatusOut]
    decisions_by_action: dict[str, int]
    saved_gpu_seconds: float = Field(
        description="Estimated GPU time the stored decisions saved against always restarting"
    )
    commands_unacknowledged: dict[str, int]
    oldest_unacknowledged_at: datetime | None


FabricState.model_rebuild()
