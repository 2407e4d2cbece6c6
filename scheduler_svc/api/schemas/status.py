"""The cluster at a glance: rails, nodes, jobs and their last decisions (/ and /v1/status)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from scheduler_svc.api.schemas.faults import FaultOut
from scheduler_svc.store.types import JobMode


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


class DecisionBriefOut(BaseModel):
    decision_id: str
    action: Literal["failover", "restart", "restart_scaled", "none", "failback", "rebalance"]
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
