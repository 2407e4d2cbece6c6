"""Wire models of the v1 API. Field names here are a contract with fleet managers and agents."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    HttpUrl,
    StrictBool,
    UrlConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict

from scheduler_svc.store.models import AckStatus, CommandKind, CommandState, JobMode


def whole_number(value: Any) -> Any:
    # JSON Schema's integers include 5.0; booleans and numeric text are not numbers here.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Every integer fits the store's signed 64-bit columns (comm ids, unsigned 64-bit on
# the wire, are mapped onto them by store.models.UInt64). Counts and ids stop at 2^53 - 1,
# the largest integer every JSON parser (and a float-typed JSON Schema bound) keeps exact.
INT64_MAX = 2**63 - 1
JSON_INT_MAX = 2**53 - 1
Count = Annotated[int, Field(strict=True, ge=0, le=JSON_INT_MAX), BeforeValidator(whole_number)]
# Path ids arrive as text: parsed, so not strict.
Id64 = Annotated[int, Field(ge=1, le=JSON_INT_MAX)]
# Ids of rows keyed by a 32-bit INTEGER (faults, flags, maintenance windows): a larger one
# names nothing, and PostgreSQL would refuse to compare it.
RowId = Annotated[int, Field(ge=1, le=2**31 - 1)]
RANK_MAX = 131071
RAIL_MAX = 1023
RankNo = Annotated[int, Field(strict=True, ge=0, le=RANK_MAX), BeforeValidator(whole_number)]
GpuNo = Annotated[int, Field(strict=True, ge=0, le=1023), BeforeValidator(whole_number)]
Numa = Annotated[int, Field(strict=True, ge=-1, le=1023), BeforeValidator(whole_number)]
Scale = Annotated[int, Field(strict=True, ge=1, le=2**20), BeforeValidator(whole_number)]
# A job's incarnation: 1 when first posted, one more at each restart the service decided.
Incarnation = Annotated[int, Field(strict=True, ge=1, le=2**31 - 1), BeforeValidator(whole_number)]
Name = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")]
JobId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][\w.:-]*$")]
# An RDMA device as the kernel names it (mlx5_0, rocep1s0f0, irdma1): no slashes, no dots first.
DeviceName = Annotated[
    str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
]
# A PCIe switch, root complex, fabric switch, netdev or state label.
Label = Annotated[
    str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
]
# domain:bus:device.function; Linux prints the domain as %04x, so VMD and Hyper-V's 32-bit
# domains come with 5 to 8 digits (10000:e1:00.0).
PciAddress = Annotated[
    str,
    Field(
        min_length=12,
        max_length=16,
        pattern=r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-1][0-9a-fA-F]\.[0-7]$",
    ),
]
Text = Annotated[str, Field(max_length=2000)]


def _fits_column(url: HttpUrl) -> HttpUrl:
    # Normalising (a trailing slash, punycode) can lengthen what was sent.
    if len(str(url)) > 2048:
        raise ValueError("URL longer than 2048 characters once normalised")
    return url


# Webhook targets: at most 2000 characters as sent, 2048 as stored.
WebUrl = Annotated[HttpUrl, UrlConstraints(max_length=2000), AfterValidator(_fits_column)]

# Durations: finite, and bounded where a bigger value can only be a typo.
DAY_S = 86400.0
Seconds = Annotated[float, Field(strict=True, ge=0, le=DAY_S)]
Interval = Annotated[float, Field(strict=True, gt=0, le=7 * DAY_S)]
LongSeconds = Annotated[float, Field(strict=True, gt=0, le=365 * DAY_S)]
Slowdown = Annotated[float, Field(strict=True, ge=1, le=100)]
Share = Annotated[float, Field(strict=True, ge=0, le=1)]


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


def _text_time(value: Any) -> Any:
    # A bare number would pass as a Unix time; the API takes RFC 3339 text only.
    if not isinstance(value, (str, datetime)):
        raise ValueError("give an RFC 3339 time with its offset, e.g. 2026-11-01T12:00:00Z")
    return value


UtcTime = Annotated[AwareDatetime, BeforeValidator(_text_time), AfterValidator(_utc)]


def _is_text_safe(value: str) -> bool:
    # Lone UTF-16 surrogates cannot be stored as UTF-8, and PostgreSQL refuses NUL.
    return "\x00" not in value and not any("\ud800" <= c <= "\udfff" for c in value)


def _check_text(value: Any) -> None:
    if isinstance(value, str):
        if not _is_text_safe(value):
            raise ValueError("text must be valid Unicode without NUL or lone surrogates")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_text(k)
            _check_text(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _check_text(v)


class Strict(BaseModel):
    """Unknown fields are refused so a typo never silently means "use the default";
    numbers are finite (JSON's Infinity and NaN are refused) and text is storable.
    Numbers, booleans and times are strict (false is not 0, 1 is not a time)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _storable_text(cls, value: Any) -> Any:
        _check_text(value)
        return value


# --- nodes -----------------------------------------------------------------


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
    backup_plan: list[GpuPathOut] = []
    warnings: list[str] = []


# --- jobs ------------------------------------------------------------------


class RankIn(Strict):
    rank: RankNo
    node: Name
    gpu: GpuNo


CommId = Annotated[
    int, Field(strict=True, ge=0, lt=2**64, description="The CCL's 64-bit communicator id")
]


# The retransmission timeout is timeout_s, or derived from both IB fields.
# A field "given" is present and not null; null counts as left out.
def _given(*names: str) -> JsonDict:
    return {
        "required": list(names),
        "properties": {n: {"not": {"type": "null"}} for n in names},
    }


_TIMEOUT_GIVEN: JsonDict = {"anyOf": [_given("timeout_s"), _given("ib_timeout", "ib_retry_cnt")]}
# ib_timeout and ib_retry_cnt come together or not at all.
_IB_PAIR: JsonDict = {
    "anyOf": [
        _given("ib_timeout", "ib_retry_cnt"),
        {"not": {"anyOf": [_given("ib_timeout"), _given("ib_retry_cnt")]}},
    ]
}


class CommunicatorIn(Strict):
    comm_id: Annotated[
        int, Field(strict=True, gt=0, lt=2**64, description="The CCL's 64-bit communicator id")
    ]
    channels: Annotated[int, Field(strict=True, ge=1, le=64), BeforeValidator(whole_number)] = 8
    ranks: Annotated[list[RankNo], Field(max_length=131072)] = Field(
        default_factory=list, description="Job ranks in this communicator; empty = all"
    )


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
    model_config = ConfigDict(json_schema_extra={"allOf": [_TIMEOUT_GIVEN, _IB_PAIR]})

    job_id: JobId
    ranks: Annotated[list[RankIn], Field(min_length=1, max_length=131072)]
    checkpoint_interval_s: Interval
    reload_s: Seconds
    detect_s: Seconds = 0.0
    # Give it, or give the IB pair instead (the document's allOf says so).
    timeout_s: Seconds | None = Field(
        default=None, description="RNIC retransmission timeout; or give ib_timeout and ib_retry_cnt"
    )
    ib_timeout: (
        Annotated[int, Field(strict=True, ge=0, le=31), BeforeValidator(whole_number)] | None
    ) = None
    ib_retry_cnt: (
        Annotated[int, Field(strict=True, ge=0, le=7), BeforeValidator(whole_number)] | None
    ) = None
    last_checkpoint_at: UtcTime
    last_checkpoint_iteration: Count | None = None
    slowdown_k: Slowdown | None = Field(
        default=None, description="k the job measured while failed over, if it has"
    )
    comm_share: Share | None = Field(
        default=None, description="Share of step time spent in communication (for modelled k)"
    )
    dp_size: Scale = Field(
        default=1,
        description="Data-parallel size. Ranks are numbered TP fastest, then DP, then PP "
        "(Megatron-LM's default): rank r is in DP replica (r // tp_size) % dp_size",
    )
    tp_size: Scale = 1
    pp_size: Scale = 1
    allow_scaling: StrictBool = Field(
        default=False,
        description="The job can restart without a node, shrinking DP by the replicas with a "
        "rank on it; needs dp_size x tp_size x pp_size = the number of ranks",
    )
    spare_nodes: StrictBool = Field(
        default=True, description="A healthy spare node is ready for restart"
    )
    node_replace_s: Seconds = 0.0
    nvl_cap_mb: Annotated[float, Field(strict=True, ge=0, le=1_048_576)] | None = Field(
        default=None,
        description="GPU memory the job gives NVL transit on one GPU, MB (30-40 MB per "
        "channel); omit for the service's nvl_cap_mb",
    )
    notify_url: WebUrl | None = None
    communicators: Annotated[list[CommunicatorIn], Field(max_length=1024)] = Field(
        default_factory=list,
        description="CCL communicators whose progress the agents report, for switch points",
    )
    repair_estimate_s: LongSeconds | None = Field(
        default=None, description="How long a failed RNIC/link takes to repair here"
    )
    ccl: CclIn | None = Field(
        default=None, description="The CCL the job runs when it is stock NCCL (not Railover's)"
    )
    incarnation: Incarnation | None = Field(
        default=None,
        description="The incarnation this post starts. First post: 1 unless given. Posting a "
        "job the service decided to restart starts the next one (the one after the ended "
        "incarnation, or this number if higher); a number not above the ended one is "
        "refused (409)",
    )
    replaces: JobId | None = Field(
        default=None,
        description="A running job this one takes the GPUs of: it is ended (deleted, as "
        "DELETE /v1/jobs/{id} does) when this one is registered. Without it, ranks on a "
        "GPU another running job holds are refused (409)",
    )

    @model_validator(mode="after")
    def _check(self) -> JobIn:
        ranks = [r.rank for r in self.ranks]
        if sorted(ranks) != list(range(len(ranks))):
            raise ValueError("ranks: rank numbers must be exactly 0..N-1, each once")
        placed = [(r.node, r.gpu) for r in self.ranks]
        if len(set(placed)) != len(placed):
            raise ValueError("ranks: two ranks are placed on the same node and GPU")
        if (self.ib_timeout is None) != (self.ib_retry_cnt is None):
            raise ValueError("ib_timeout: give both ib_timeout and ib_retry_cnt, or neither")
        if self.timeout_s is None and self.ib_timeout is None:
            raise ValueError("timeout_s: give timeout_s, or both ib_timeout and ib_retry_cnt")
        comm_ids = [c.comm_id for c in self.communicators]
        if len(set(comm_ids)) != len(comm_ids):
            raise ValueError("communicators: every comm_id must appear once")
        n = len(self.ranks)
        for i, c in enumerate(self.communicators):
            if any(r >= n for r in c.ranks):
                raise ValueError(f"communicators[{i}].ranks: ranks must be below {n}")
        return self

    @field_validator("replaces", mode="after")
    @classmethod
    def _not_itself(cls, replaces: str | None, info: ValidationInfo) -> str | None:
        if replaces is not None and replaces == info.data.get("job_id"):
            raise ValueError(
                "a job cannot replace itself: post it again once it restarts, or DELETE it first"
            )
        return replaces

    @field_validator("allow_scaling", mode="after")
    @classmethod
    def _layout_names_every_rank(cls, allow: bool, info: ValidationInfo) -> bool:
        # Dropping a node drops the DP replicas with a rank on it: every rank needs one.
        ranks = info.data.get("ranks")
        dp, tp, pp = (info.data.get(k) for k in ("dp_size", "tp_size", "pp_size"))
        if not allow or ranks is None or dp is None or tp is None or pp is None:
            return allow  # the other fields' own errors are reported
        if dp * tp * pp != len(ranks):
            raise ValueError(
                f"needs dp_size x tp_size x pp_size ({dp} x {tp} x {pp}) to equal the "
                f"{len(ranks)} ranks"
            )
        return allow


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
    nvl_cap_mb: float | None = None
    notify_url: str | None
    mode: JobMode
    incarnation: int = Field(
        default=1,
        description="The job's incarnation: commands name it, and reports of an older one "
        "change nothing of this one's state",
    )
    created_at: datetime
    communicators: list[CommunicatorIn] = Field(default_factory=list)
    repair_estimate_s: float | None = None
    measured_k: float | None = Field(default=None, description="k measured from iteration times")
    failed_over_at: datetime | None = None
    ccl: CclIn | None = None
    checkpoint_requested_after: int | None = Field(
        default=None,
        description="FlowCheck: a normal checkpoint newer than this iteration is wanted "
        "(a checkpoint node could not rebuild it); null when none is",
    )


class CheckpointIn(Strict):
    at: UtcTime
    iteration: Count | None = None
    kind: Literal["full", "flowcheck"] = "full"
    incarnation: Incarnation | None = Field(
        default=None,
        description="The incarnation that took it. An older one's is kept as history and "
        "changes nothing; while the job restarts, the next one's starts that incarnation on "
        "the same placement. Without it, a checkpoint of a restarting job taken before the "
        "restart decision is the ended incarnation's",
    )


class CheckpointOut(BaseModel):
    job_id: str
    at: datetime
    iteration: int | None
    kind: str
    current: StrictBool = Field(
        description="True when this is now the job's newest usable checkpoint"
    )
    checkpoint_requested_after: int | None = Field(
        default=None,
        description="A normal checkpoint newer than this iteration is still wanted "
        "(a mirror failure no checkpoint answers yet); null when none is",
    )


class MirrorFailureIn(Strict):
    """A checkpoint node could not rebuild this iteration from the mirrored traffic."""

    iteration: Count
    at: UtcTime


class MirrorFailureOut(BaseModel):
    id: int
    job_id: str
    iteration: int
    at: datetime
    received_at: datetime
    created: StrictBool = Field(
        description="False when this iteration's failure was already reported (a replay): "
        "nothing was applied again"
    )
    checkpoint_requested_after: int | None = Field(
        description="The iteration a normal checkpoint must now be newer than; null when a "
        "newer checkpoint was already reported"
    )


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
    | StallEvent,
    Field(discriminator="kind"),
]


class EventBatch(Strict):
    events: Annotated[list[AnyEvent], Field(min_length=1, max_length=1000)]


class EventsAccepted(BaseModel):
    accepted: int
    duplicates: int
    faults_opened: int = 0
    decisions: list[str] = Field(default_factory=list, description="ids of decisions made")


# --- decisions --------------------------------------------------------------


class IterationsIn(Strict):
    iteration_time_s: Annotated[
        list[Annotated[float, Field(strict=True, gt=0, le=DAY_S)]],
        Field(min_length=1, max_length=1000),
    ]


class IterationsOut(BaseModel):
    job_id: str
    samples: int
    degraded: StrictBool = Field(description="True when these were taken while failed over")
    measured_k: float | None
    trustworthy: bool
    detail: str
    decision_id: str | None = Field(description="The re-decision this triggered, if any")
    checkpoint_requested_after: int | None = Field(
        default=None,
        description="A normal checkpoint newer than this iteration is wanted (FlowCheck "
        "could not rebuild it); null when none is",
    )


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
    path_available: StrictBool = True
    dp_size: int = 1
    new_dp_size: int | None = Field(
        default=None,
        description="DP size once the nodes with the failed part are dropped; null: no "
        "restart_scaled option (scaling not allowed, or no replica would be left)",
    )
    allow_scaling: StrictBool = False
    spare_nodes: StrictBool = True
    node_replace_s: float = 0.0
    planned: StrictBool = False


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
    drop_nodes: list[str] = Field(
        default_factory=list,
        description="restart_scaled: the nodes the job restarts without (empty otherwise)",
    )
    new_dp_size: int | None = Field(
        default=None, description="restart_scaled: the data-parallel size it restarts at"
    )
    saved_gpu_s: float = Field(
        default=0.0,
        description="GPU-seconds this decision saved against the cheapest restart "
        "(failovers that moved ranks only; see the README's 'GPU-hours saved')",
    )


class DecisionList(BaseModel):
    decisions: list[DecisionOut]


class EvaluateIn(Strict):
    """A what-if question: the same decision the service would make, nothing stored."""

    model_config = ConfigDict(json_schema_extra={"allOf": [_IB_PAIR]})

    checkpoint_interval_s: Interval
    t_elapsed_s: Annotated[float, Field(strict=True, ge=0, le=365 * DAY_S)]
    reload_s: Seconds
    detect_s: Seconds = 0.0
    timeout_s: Seconds | None = None
    ib_timeout: (
        Annotated[int, Field(strict=True, ge=0, le=31), BeforeValidator(whole_number)] | None
    ) = None
    ib_retry_cnt: (
        Annotated[int, Field(strict=True, ge=0, le=7), BeforeValidator(whole_number)] | None
    ) = None
    k: Slowdown | None = None
    comm_share: Share | None = None
    bandwidth_left: Annotated[float, Field(strict=True, gt=0, le=1)] | None = None
    concurrent_faults: Annotated[
        int, Field(strict=True, ge=1, le=1024), BeforeValidator(whole_number)
    ] = 1
    gpus: Scale = 1
    path_available: StrictBool = True
    healed: StrictBool = False
    dp_size: Scale = 1
    new_dp_size: Scale | None = Field(
        default=None,
        description="DP size left after dropping the faulty node's replicas; default "
        "dp_size - 1 (one replica on the node)",
    )
    allow_scaling: StrictBool = False
    spare_nodes: StrictBool = True
    node_replace_s: Seconds = 0.0

    @model_validator(mode="after")
    def _timeout(self) -> EvaluateIn:
        if (self.ib_timeout is None) != (self.ib_retry_cnt is None):
            raise ValueError("ib_timeout: give both ib_timeout and ib_retry_cnt, or neither")
        return self

    @field_validator("new_dp_size", mode="after")
    @classmethod
    def _fewer_replicas(cls, new: int | None, info: ValidationInfo) -> int | None:
        dp = info.data.get("dp_size")
        if new is not None and dp is not None and new >= dp:
            raise ValueError(f"must be below dp_size ({dp}), got {new}")
        return new


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
    ranks: list[RankPathOut] = Field(description="This page's ranks, in rank order")
    next_after_rank: int | None = Field(
        description="Pass as after_rank for the next page; null on the last page"
    )
    broken_pairs: int
    total_pairs: int
    isolated_ranks: list[int]
    failed_over_ranks: list[int]
    warnings: list[str]


# --- commands ----------------------------------------------------------------


class CommandOut(BaseModel):
    command_id: int
    node: str
    job_id: str = Field(description="The job whose processes the command is for")
    incarnation: int = Field(
        default=1,
        description="The job's incarnation the command is for: a process of another "
        "incarnation of the job (one that named it) is not sent it",
    )
    decision_id: str | None
    kind: CommandKind
    epoch: int
    comm_id: int
    ops_done: int
    disabled_channels: list[int]
    channel_weights: list[float] = Field(
        default_factory=list,
        description="balance: each channel's share of the communicator's traffic (R²CCL); "
        "disabled_channels is then the DCR plan a CCL without weights runs instead",
    )
    split_ratio: float | None = Field(
        default=None,
        description="balance: share of each allreduce the degraded node hands to the others",
    )
    transit: list[list[int]] = Field(
        default_factory=list,
        description="nvl_transit: [rank, transit GPU] for the ranks of this node",
    )
    transit_mb_per_channel: int | None = Field(
        default=None, description="nvl_transit: GPU memory a transit GPU gives one channel, MB"
    )
    ranks: list[int]
    returning: list[int] | None = Field(
        default=None,
        description="failback: the ranks it returns to their primary; the others it names "
        "(every rank of the communicator at its switch point) keep their paths",
    )
    state: CommandState
    created_at: datetime
    iteration: int | None = Field(
        default=None, description="checkpoint_now: the checkpoint must be newer than this"
    )
    other_jobs_ranks: list[int] | None = Field(
        default=None,
        description="Only as delivered to the node's agent (poll and stream): the rank "
        "numbers other jobs hold on this node when the command was taken, empty when the "
        "job is alone there. A plugin client that named no job and says one of these "
        "ranks (or no rank) may be another job's process: the agent sends it nothing. "
        "Null in listings and ack answers",
    )


class CommandList(BaseModel):
    commands: list[CommandOut]


class StreamReady(BaseModel):
    """The data of a command stream's first event, `ready`."""

    heartbeat_s: float = Field(description="The longest silence before a keepalive line")
    ends_in_s: float = Field(description="When the service will end this stream (max_age)")


StreamEndReason = Literal["max_age", "stopping", "unavailable"]


class StreamEnd(BaseModel):
    """The data of a command stream's last event, `end`."""

    reason: StreamEndReason = Field(
        description="max_age and stopping: open the next stream at once; unavailable (the "
        "store could not be read): after a backoff"
    )


class AckIn(Strict):
    node: Name
    rank: RankNo | None = Field(
        default=None, description="The one rank answering; omit (with `ranks`) for several"
    )
    ranks: Annotated[list[RankNo], Field(min_length=1, max_length=1024)] | None = Field(
        default=None,
        description="Several ranks of the node answering alike: the agent's aggregate of "
        "their acks, one request per node rather than one per rank",
    )
    status: AckStatus = Field(
        description="delivered, applied, failed, or too_late: the rank was already past "
        "the switch point (give its ops_done); nothing was applied"
    )
    detail: Text = ""
    ops_done: Count | None = Field(
        default=None, description="The rank's op count when it saw the command (too_late)"
    )

    @model_validator(mode="after")
    def _one_way_to_name_ranks(self) -> AckIn:
        if self.rank is not None and self.ranks is not None:
            raise ValueError("ranks: give either rank or ranks, not both")
        if self.ranks is not None and len(set(self.ranks)) != len(self.ranks):
            raise ValueError("ranks: every rank must appear once")
        return self

    def answering(self) -> list[int | None]:
        """The ranks this ack speaks for; [None] when it speaks for the whole node."""
        if self.ranks is not None:
            return list(self.ranks)
        return [self.rank]


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


class PortCountsOut(BaseModel):
    ports: int = Field(description="GPU-fabric RNIC ports")
    ok: int
    down: int = Field(description="Not ACTIVE, no fault open")
    fault: int = Field(description="A fault is open")


class RailSummaryOut(PortCountsOut):
    rail: int
    switches: int = Field(description="Fabric switches with a port on this rail")


class SwitchSummaryOut(PortCountsOut):
    switch: str
    rails: list[int]
    nodes: int = Field(description="Nodes with a port cabled to this switch")


StatusHealth = Literal["all", "unhealthy"]


class StatusOut(BaseModel):
    generated_at: datetime
    rails: list[int] = Field(description="Every rail number seen on a registered node")
    by_rail: list[RailSummaryOut] = Field(description="Every rail's ports, counted by health")
    switches: list[SwitchSummaryOut] = Field(
        description="Switches with a port not ok, most such ports first (at most 1,000)"
    )
    switches_total: int = Field(description="Every switch a registered port is cabled to")
    nodes_registered: int
    nodes_total: int = Field(description="Nodes that match the query (rail, switch, health)")
    nodes: list[NodeStatusOut] = Field(
        description="A page of the matching nodes, by name, with the matching ports only"
    )
    next_after_node: str | None = Field(
        description="Pass as after_node for the next page; null on the last page"
    )
    open_faults: list[FaultOut]
    jobs: list[JobStatusOut]
    decisions_by_action: dict[str, int]
    saved_gpu_seconds: float = Field(
        description=(
            "GPU-seconds the stored decisions saved against always restarting: the sum of "
            "their saved_gpu_s (see the README's 'GPU-hours saved')"
        )
    )
    commands_unacknowledged: dict[str, int]
    oldest_unacknowledged_at: datetime | None


FabricState.model_rebuild()
