"""Where each rank's traffic runs now, and the job's progress (/v1/jobs/{id}/paths)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


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
