"""Commands to agents, their streams and acknowledgements (/v1/nodes/{node}/commands,
/v1/commands/{id}/acks)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

from scheduler_svc.api.schemas.fields import Count, Name, RankNo, Strict, Text
from scheduler_svc.store.types import AckStatus, CommandKind, CommandState


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


StreamEndReason = Literal["max_age", "stopping", "unavailable", "replaced", "unauthorized"]


class StreamEnd(BaseModel):
    """The data of a command stream's last event, `end`."""

    reason: StreamEndReason = Field(
        description="max_age and stopping: open the next stream at once; unavailable (the "
        "store could not be read): after a backoff; replaced: a newer stream of the node "
        "took its slot (RAILOVER_COMMANDS_STREAMS_PER_NODE); unauthorized: the token was "
        "revoked or expired while the stream was open"
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
