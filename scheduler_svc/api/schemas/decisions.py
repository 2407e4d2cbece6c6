"""Decisions and the inputs they saw, iteration times, and what-if evaluation
(/v1/jobs/{id}/decisions, /v1/jobs/{id}/iterations, /v1/evaluate)."""

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

from scheduler_svc.api.schemas.fields import (
    DAY_S,
    Interval,
    Scale,
    Seconds,
    Share,
    Slowdown,
    Strict,
    whole_number,
)
from scheduler_svc.api.schemas.jobs import IB_PAIR


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
    spares_free: int | None = Field(
        default=None, description="Free spares, as the fleet manager last said; null: not said"
    )
    spare_reserve: int = Field(default=0, description="Spares kept back (RAILOVER_SPARE_RESERVE)")
    node_replace_s: float = 0.0
    spare_price_s: float = Field(
        default=0.0,
        description="Added to a restart that takes a spare: the wait it may leave a lost GPU "
        "or dead node (RAILOVER_HARD_FAILURES_PER_H); 0 when not priced",
    )
    planned: StrictBool = False


class DecisionOut(BaseModel):
    decision_id: str
    job_id: str
    action: Literal["failover", "restart", "restart_scaled", "none", "failback", "rebalance"]
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

    model_config = ConfigDict(json_schema_extra={"allOf": [IB_PAIR]})

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
