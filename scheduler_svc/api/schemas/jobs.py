"""A job as its launcher registers it: ranks, communicators, CCL, checkpoints and mirror
failures (/v1/jobs)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict

from scheduler_svc.api.schemas.fields import (
    Count,
    DeviceName,
    GpuNo,
    Incarnation,
    Interval,
    JobId,
    LongSeconds,
    Name,
    RankNo,
    Scale,
    Seconds,
    Share,
    Slowdown,
    Strict,
    UtcTime,
    WebUrl,
    storable_text,
    whole_number,
)
from scheduler_svc.store.types import JobMode


class RankIn(Strict):
    rank: RankNo
    node: Name
    gpu: GpuNo

    # Strict's check of every field, on the one that is text: a job has 65,536 ranks.
    @field_validator("node", mode="after")
    @classmethod
    def _storable_text(cls, value: Any) -> Any:
        return storable_text(value)


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
# ib_timeout and ib_retry_cnt come together or not at all (in EvaluateIn too).
IB_PAIR: JsonDict = {
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


SparesFree = Annotated[int, Field(strict=True, ge=0, le=65536)]
SPARES_FREE_DOC = (
    "How many healthy spare nodes are free now, as the fleet manager knows it. With "
    "RAILOVER_SPARE_RESERVE the service keeps that many for faults only a replacement "
    "fixes (a lost GPU, a dead node): it restarts the job to escape a fault it could fail "
    "over from only while more than the reserve are free."
)


class JobIn(Strict):
    model_config = ConfigDict(json_schema_extra={"allOf": [_TIMEOUT_GIVEN, IB_PAIR]})

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
    spares_free: SparesFree | None = Field(
        default=None,
        description=SPARES_FREE_DOC + " Given, it decides spare_nodes: whether it is above 0",
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
    spares_free: int | None = None
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
    spare_nodes: StrictBool | None = Field(
        default=None,
        description="Whether a healthy spare node is free now, as the fleet manager knows "
        "it at this checkpoint (the job's spare_nodes until it says otherwise; the "
        "restart the checkpoint may decide needs one). Left out: as last said",
    )
    spares_free: SparesFree | None = Field(
        default=None,
        description=SPARES_FREE_DOC + " Left out: as last said (spare_nodes alone, when only "
        "that is given, forgets the count)",
    )

    @model_validator(mode="after")
    def _check(self) -> CheckpointIn:
        free, said = self.spares_free, self.spare_nodes
        if free is not None and said is not None and said != (free > 0):
            raise ValueError(
                f"spares_free: {free} free spares, yet spare_nodes is {said}; give one, "
                "or both in agreement"
            )
        return self


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
