"""SQLAlchemy models. Alembic migrations in store/migrations create exactly these tables.

The values their columns take (job modes, fault kinds, command kinds and states, ack
statuses) and the column types (UInt64, UtcDateTime) are in store/types.py.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from scheduler_svc.engine.fabric import WHOLE_DEVICE
from scheduler_svc.store.types import BIG_ID, UInt64, UtcDateTime

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {datetime: UtcDateTime(), dict[str, Any]: JSON()}  # noqa: RUF012


class ApiToken(Base):
    __tablename__ = "api_tokens"

    token_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    # sha256 of the secret: tokens are 256 random bits, so a fast hash is enough
    # and lets every request look its token up by index.
    secret_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    node: Mapped[str | None] = mapped_column(String(253))
    description: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]
    # Unset: valid until revoked.
    expires_at: Mapped[datetime | None]


class FleetStamp(Base):
    """One row (id 1): given a new value whenever a node is registered anew or changes
    topology, in that registration's transaction (NodeRepo.bump_fleet). Cached plans and
    job indexes hold while it is unchanged."""

    __tablename__ = "fleet_stamp"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    version: Mapped[int] = mapped_column(BigInteger)


class EvidenceStamp(Base):
    """One row (id 1): one more at every commit that wrote the fabric's evidence (faults,
    port levels, quarantine flags, switch failures, maintenance windows), in that
    commit's transaction (store/evidence_view.py). A replica's evidence held in memory
    holds while it is unchanged."""

    __tablename__ = "evidence_stamp"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    version: Mapped[int] = mapped_column(BigInteger)


class Node(Base):
    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    registered_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    topology_version: Mapped[int] = mapped_column(Integer, default=1)
    # The backup plan computed at registration (services/node_plans.py), what node reads
    # serve; null until the node registers after migration 0016.
    plan: Mapped[dict[str, Any] | None]

    gpus: Mapped[list[Gpu]] = relationship(
        cascade="all, delete-orphan", order_by="Gpu.index", lazy="selectin"
    )
    rnics: Mapped[list[Rnic]] = relationship(
        cascade="all, delete-orphan", order_by="(Rnic.name, Rnic.port)", lazy="selectin"
    )


class Gpu(Base):
    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("node", "index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(ForeignKey("nodes.name", ondelete="CASCADE"))
    index: Mapped[int]
    pci: Mapped[str] = mapped_column(String(32))
    numa: Mapped[int | None]
    pcie_switch: Mapped[str | None] = mapped_column(String(64))
    root_complex: Mapped[str | None] = mapped_column(String(64))
    nvlink: Mapped[bool] = mapped_column(Boolean, default=False)


class Rnic(Base):
    __tablename__ = "rnics"
    __table_args__ = (UniqueConstraint("node", "name", "port"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(ForeignKey("nodes.name", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    port: Mapped[int]
    pci: Mapped[str | None] = mapped_column(String(32))  # null: none (a soft device)
    numa: Mapped[int | None]
    pcie_switch: Mapped[str | None] = mapped_column(String(64))
    root_complex: Mapped[str | None] = mapped_column(String(64))
    rate_gbps: Mapped[float] = mapped_column(Float, default=0.0)
    link_layer: Mapped[str | None] = mapped_column(String(32))
    netdev: Mapped[str | None] = mapped_column(String(64))
    switch: Mapped[str | None] = mapped_column(String(128), index=True)
    rail: Mapped[int | None]
    state: Mapped[str] = mapped_column(String(32), default="ACTIVE")
    # When `state` was observed (the agent's clock): the port's level. A report observed
    # before it changes nothing but the history. Null: as registered, never reported.
    observed_at: Mapped[datetime | None]
    # engine.paths' kind, a VF's PF, a bond's members; each watched counter's availability.
    kind: Mapped[str] = mapped_column(String(16), default="physical", server_default="physical")
    physfn: Mapped[str | None] = mapped_column(String(32))
    members: Mapped[list[str]] = mapped_column(JSON, default=list, server_default="[]")
    counters: Mapped[dict[str, str]] = mapped_column(JSON, default=dict, server_default="{}")


class Job(Base):
    __tablename__ = "jobs"

    job_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    created_at: Mapped[datetime]
    checkpoint_interval_s: Mapped[float]
    reload_s: Mapped[float]
    detect_s: Mapped[float]
    timeout_s: Mapped[float]
    last_checkpoint_at: Mapped[datetime]
    last_checkpoint_iteration: Mapped[int | None] = mapped_column(BigInteger)
    last_checkpoint_kind: Mapped[str] = mapped_column(String(16), default="full")
    slowdown_k: Mapped[float | None]
    comm_share: Mapped[float | None]
    dp_size: Mapped[int] = mapped_column(Integer, default=1)
    tp_size: Mapped[int] = mapped_column(Integer, default=1)
    pp_size: Mapped[int] = mapped_column(Integer, default=1)
    allow_scaling: Mapped[bool] = mapped_column(Boolean, default=False)
    spare_nodes: Mapped[bool] = mapped_column(Boolean, default=True)
    # How many healthy spares are free, as last said (null: never said, only spare_nodes).
    spares_free: Mapped[int | None] = mapped_column(Integer)
    node_replace_s: Mapped[float] = mapped_column(Float, default=0.0)
    # GPU memory the job gives NVL transit on one GPU, MB; null: the service's setting.
    nvl_cap_mb: Mapped[float | None] = mapped_column(Float)
    notify_url: Mapped[str | None] = mapped_column(String(2048))
    mode: Mapped[str] = mapped_column(String(16), default="normal")
    decision_count: Mapped[int] = mapped_column(Integer, default=0)
    # The job's incarnation: 1 when first posted, one more each time the fleet manager
    # posts it again after a restart decision. Commands name it; old ones' reports
    # never change the new one's state.
    incarnation: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # A new id whenever the ranks are placed (the job posted, or posted again while
    # restarting): what a cached placement and job index (services.reconciler) are
    # keyed by. Null for jobs placed before it existed (their ranks are read each time).
    placement_id: Mapped[str | None] = mapped_column(String(32))
    # k the service measured from reported iteration times (trustworthy ones only).
    measured_k: Mapped[float | None]
    repair_estimate_s: Mapped[float | None]
    failed_over_at: Mapped[datetime | None]
    # The CCL the job runs, when it declared one (api.schemas.jobs.CclIn as JSON), e.g.
    # stock NCCL with port failover: the planner then models NCCL's own failover.
    ccl: Mapped[dict[str, Any] | None]
    restart_decided_at: Mapped[datetime | None]
    # When the current incarnation started (the service's clock): a progress report that
    # names no incarnation and was observed before it is the ended incarnation's. Null for
    # a job in its first incarnation and for jobs restarted before it existed.
    incarnation_started_at: Mapped[datetime | None]
    # The desired state of the last reconcile pass, and the one commands were sent for
    # (engine.state.Desired as JSON).
    desired: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    commanded: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Set when a reconcile of the job failed: the coordinator's sweep tries it again.
    reconcile_due_at: Mapped[datetime | None]

    # Loaded only when asked for: the decision path reads rank tuples instead. Deleting
    # the job leaves its ranks to the foreign key's ON DELETE CASCADE (one statement),
    # not to the ORM, which would load a 65,536-rank job's rows to delete them one by one.
    ranks: Mapped[list[JobRank]] = relationship(
        cascade="all, delete-orphan", order_by="JobRank.rank", lazy="select", passive_deletes=True
    )


class JobRank(Base):
    __tablename__ = "job_ranks"
    __table_args__ = (Index("ix_job_ranks_node", "node"),)

    job_id: Mapped[str] = mapped_column(
        ForeignKey("jobs.job_id", ondelete="CASCADE"), primary_key=True
    )
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    node: Mapped[str] = mapped_column(String(253))
    gpu: Mapped[int]


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    # FlowCheck: the newest normal checkpoint's iteration, read on every reconcile pass of
    # a job with a rebuild failure, among one checkpoint per iteration.
    __table_args__ = (Index("ix_checkpoints_job_kind_iteration", "job_id", "kind", "iteration"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime]
    iteration: Mapped[int | None] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(16))
    received_at: Mapped[datetime]
    # The incarnation that reported it; null when the report did not say.
    incarnation: Mapped[int | None] = mapped_column(Integer)


class Event(Base):
    """Every report an agent sent, once: the event id is the idempotency key."""

    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_node_observed", "node", "observed_at"),
        # Kept RAILOVER_EVENTS_RETENTION_S by this (services/retention.py).
        Index("ix_events_received_at", "received_at"),
    )

    event_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    node: Mapped[str] = mapped_column(String(253))
    kind: Mapped[str] = mapped_column(String(32))
    device: Mapped[str | None] = mapped_column(String(64))
    port: Mapped[int | None]
    observed_at: Mapped[datetime]
    received_at: Mapped[datetime]
    payload: Mapped[dict[str, Any]]
    fault_id: Mapped[int | None]


class Fault(Base):
    """A broken component. At most one open fault per (node, device, port)."""

    __tablename__ = "faults"
    __table_args__ = (
        Index(
            "uq_faults_open_component",
            "node",
            "device",
            "port",
            unique=True,
            sqlite_where=text("cleared_at IS NULL"),
            postgresql_where=text("cleared_at IS NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(253))
    device: Mapped[str] = mapped_column(String(64))
    port: Mapped[int]
    kind: Mapped[str] = mapped_column(String(32))
    opened_at: Mapped[datetime]
    cleared_at: Mapped[datetime | None]
    first_event_id: Mapped[str] = mapped_column(String(128))
    detail: Mapped[dict[str, Any]]
    # The fabric switch the port is cabled to, when known (for correlation).
    switch: Mapped[str | None] = mapped_column(String(128), index=True)
    # Set once its clearing rule is met (engine/fabric.py) or an operator resolved it:
    # from then on it is no evidence. cleared_at is when the port was seen up again.
    resolved_at: Mapped[datetime | None]
    # The newest error on the component (quiet-period faults count from it).
    last_error_at: Mapped[datetime | None]
    resolved_reason: Mapped[str | None] = mapped_column(Text)
    # The token that resolved it; None when its clearing rule did.
    resolved_by: Mapped[str | None] = mapped_column(String(32))


class Decision(Base):
    __tablename__ = "decisions"
    # One decision per (job, trigger): a replayed event or a second replica
    # hitting the same fault collides here instead of deciding twice.
    __table_args__ = (
        UniqueConstraint("job_id", "trigger"),
        Index("ix_decisions_job_created", "job_id", "created_at"),
    )

    decision_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id", ondelete="CASCADE"))
    seq: Mapped[int]
    trigger: Mapped[str] = mapped_column(String(128))
    fault_id: Mapped[int | None]
    action: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text)
    inputs: Mapped[dict[str, Any]]
    costs_s: Mapped[dict[str, Any]]
    costs_gpu_s: Mapped[dict[str, Any]]
    plan: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    # GPU-seconds this decision saved against restarting (engine.decision.saved_gpu_s).
    saved_gpu_s: Mapped[float] = mapped_column(Float, default=0.0)


class Command(Base):
    """An instruction for the CCL processes on one node, fetched by that node's agent."""

    __tablename__ = "commands"
    # AUTOINCREMENT: agents de-duplicate by command id, so an id must never be
    # handed out twice, even after a deleted job's commands freed the highest.
    __table_args__ = (
        Index("ix_commands_node_state", "node", "state"),
        # A job's history of commands (a row per node per switch point) is never scanned
        # to find its few live ones: its communicator's newest epoch (CommandRepo.max_epoch)
        # and a switch point's rows; its commands in some states (job_commands,
        # comm_commands); the coordinator's overdue sweep and the gauges, fleet-wide.
        Index("ix_commands_job_comm_epoch", "job_id", "comm_id", "epoch"),
        Index("ix_commands_job_state", "job_id", "state", "comm_id"),
        Index("ix_commands_state_deadline", "state", "ack_deadline_at"),
        {"sqlite_autoincrement": True},
    )

    command_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    node: Mapped[str] = mapped_column(String(253))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id", ondelete="CASCADE"), index=True)
    decision_id: Mapped[str | None] = mapped_column(String(36))
    kind: Mapped[str] = mapped_column(String(16))
    epoch: Mapped[int] = mapped_column(Integer, default=1)
    comm_id: Mapped[int] = mapped_column(UInt64, default=0)
    ops_done: Mapped[int] = mapped_column(BigInteger, default=0)
    disabled_channels: Mapped[list[int]] = mapped_column(JSON, default=list)
    # BALANCE: each channel's share of the traffic, and the allreduce hand-off.
    channel_weights: Mapped[list[float]] = mapped_column(JSON, default=list)
    split_ratio: Mapped[float | None] = mapped_column(Float)
    # NVL_TRANSIT: [rank, transit GPU] for this node's ranks, and the MB per channel.
    transit: Mapped[list[list[int]]] = mapped_column(JSON, default=list)
    transit_mb_per_channel: Mapped[int | None] = mapped_column(Integer)
    ranks: Mapped[list[int]] = mapped_column(JSON, default=list)
    # FAILBACK: the ranks it returns to their primary (a switch point names every rank of
    # its communicator, most of which were never off it). Null on rows older than 0012.
    returning: Mapped[list[int] | None] = mapped_column("returning_ranks", JSON)
    state: Mapped[str] = mapped_column(String(16), default="issued")
    created_at: Mapped[datetime]
    delivered_at: Mapped[datetime | None]
    completed_at: Mapped[datetime | None]
    # Retries are new commands (the agent de-duplicates by id); this counts them.
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    ack_deadline_at: Mapped[datetime | None]
    # CHECKPOINT_NOW: the iteration the requested checkpoint must be newer than.
    iteration: Mapped[int | None] = mapped_column(BigInteger)
    # The incarnation of the job whose processes this command is for.
    incarnation: Mapped[int] = mapped_column(Integer, default=1, server_default="1")


class CommandAck(Base):
    __tablename__ = "command_acks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    command_id: Mapped[int] = mapped_column(
        ForeignKey("commands.command_id", ondelete="CASCADE"), index=True
    )
    node: Mapped[str] = mapped_column(String(253))
    rank: Mapped[int | None]
    status: Mapped[str] = mapped_column(String(16))
    detail: Mapped[str] = mapped_column(Text, default="")
    at: Mapped[datetime]
    # A too-late rank's count: the next switch point goes past it.
    ops_done: Mapped[int | None] = mapped_column(BigInteger)


# --- Fleet notification (issue 6): subscriptions, outbox, deliveries, audit ---


class Subscription(Base):
    """A fleet-wide webhook: events matching its filters go to its URL, signed with its secret."""

    __tablename__ = "subscriptions"

    subscription_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    url: Mapped[str] = mapped_column(String(2048))
    # Kept in the clear: the service must sign with it. Returned once, at creation.
    secret: Mapped[str] = mapped_column(String(128))
    event_types: Mapped[list[str]] = mapped_column(JSON, default=list)
    job_id: Mapped[str | None] = mapped_column(String(128))
    description: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime]
    created_by: Mapped[str | None] = mapped_column(String(32))


class OutboxEvent(Base):
    """One CloudEvent, written in the transaction that caused it; `id` orders events."""

    __tablename__ = "outbox_events"
    __table_args__ = (Index("ix_outbox_events_job", "job_id", "id"),)

    id: Mapped[int] = mapped_column(BIG_ID, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(String(36), unique=True)
    type: Mapped[str] = mapped_column(String(96))
    subject: Mapped[str] = mapped_column(String(253))
    job_id: Mapped[str | None] = mapped_column(String(128))
    data: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]


class Delivery(Base):
    """One event for one target. A lane (target + job) delivers strictly in `id` order."""

    __tablename__ = "deliveries"
    __table_args__ = (
        Index("ix_deliveries_state_due", "state", "next_attempt_at"),
        Index("ix_deliveries_lane", "lane", "state", "id"),
    )

    id: Mapped[int] = mapped_column(BIG_ID, primary_key=True, autoincrement=True)
    outbox_id: Mapped[int] = mapped_column(
        BIG_ID, ForeignKey("outbox_events.id", ondelete="CASCADE"), index=True
    )
    # "sub:<subscription_id>" or "job:<job_id>" (the job's own notify_url).
    target: Mapped[str] = mapped_column(String(160))
    lane: Mapped[str] = mapped_column(String(300))
    url: Mapped[str] = mapped_column(String(2048))
    state: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime]
    claimed_by: Mapped[str | None] = mapped_column(String(64))
    claimed_until: Mapped[datetime | None]
    last_status: Mapped[int | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    delivered_at: Mapped[datetime | None]
    dead_at: Mapped[datetime | None]


class AuditEntry(Base):
    """Who changed what, and when: one row per state-changing request."""

    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_at", "at"),)

    id: Mapped[int] = mapped_column(BIG_ID, primary_key=True, autoincrement=True)
    at: Mapped[datetime]
    token_id: Mapped[str | None] = mapped_column(String(32))
    role: Mapped[str | None] = mapped_column(String(16))
    method: Mapped[str] = mapped_column(String(8))
    path: Mapped[str] = mapped_column(String(512))
    operation: Mapped[str | None] = mapped_column(String(96))
    status: Mapped[int]
    client: Mapped[str | None] = mapped_column(String(64))
    # What the operator said (a fault's resolve reason), when the route records one.
    detail: Mapped[str | None] = mapped_column(Text)
    # Requests this entry stands for: refused ones that never got past authentication are
    # one entry per peer, status and minute (fleet/service.py RefusedTally).
    count: Mapped[int] = mapped_column(Integer, default=1, server_default="1")


# --- Cluster-wide coordination (issue 5): communicators, progress, flags, switches ---


class Communicator(Base):
    """A CCL communicator of a job: its 64-bit id as the plugin reports it, and its channels."""

    __tablename__ = "communicators"
    __table_args__ = (Index("ix_communicators_comm_id", "comm_id"),)

    job_id: Mapped[str] = mapped_column(
        ForeignKey("jobs.job_id", ondelete="CASCADE"), primary_key=True
    )
    comm_id: Mapped[int] = mapped_column(UInt64, primary_key=True, autoincrement=False)
    channels: Mapped[int] = mapped_column(Integer, default=8)
    # Ranks of the job in this communicator; empty = all of them.
    ranks: Mapped[list[int]] = mapped_column(JSON, default=list)
    # The DCR/fail-back epoch: bumped each time a new switch point is issued.
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    # Channels disabled by the plan in force (after its switch point was applied).
    disabled_channels: Mapped[list[int]] = mapped_column(JSON, default=list)
    # Ranks in the communicator as the CCL announced it (NCCL profiler plugin);
    # null for one the fleet manager declared.
    nranks: Mapped[int | None]


class RankProgress(Base):
    """Newest ops_done per (job, communicator, rank), and where its rate was last measured."""

    __tablename__ = "rank_progress"

    job_id: Mapped[str] = mapped_column(
        ForeignKey("jobs.job_id", ondelete="CASCADE"), primary_key=True
    )
    comm_id: Mapped[int] = mapped_column(UInt64, primary_key=True, autoincrement=False)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    ops_done: Mapped[int] = mapped_column(BigInteger)
    at: Mapped[datetime]
    rate_ops_per_s: Mapped[float | None]


class IterationSample(Base):
    """Iteration times a job reports; `degraded` when it ran failed over."""

    __tablename__ = "iteration_samples"
    __table_args__ = (Index("ix_iteration_samples_job", "job_id", "degraded", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id", ondelete="CASCADE"))
    at: Mapped[datetime]
    seconds: Mapped[float]
    degraded: Mapped[bool] = mapped_column(Boolean)


class SwitchFault(Base):
    """A fabric switch inferred failed from correlated port faults on several nodes."""

    __tablename__ = "switch_faults"
    __table_args__ = (
        Index(
            "uq_switch_faults_open",
            "switch",
            unique=True,
            sqlite_where=text("cleared_at IS NULL"),
            postgresql_where=text("cleared_at IS NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    switch: Mapped[str] = mapped_column(String(128))
    opened_at: Mapped[datetime]
    cleared_at: Mapped[datetime | None]
    nodes: Mapped[list[str]] = mapped_column(JSON, default=list)
    reason: Mapped[str] = mapped_column(Text)


class MaintenanceFlag(Base):
    """A port that flapped too often: kept on its backup until an operator clears it."""

    __tablename__ = "maintenance_flags"
    __table_args__ = (
        Index(
            "uq_maintenance_flags_open",
            "node",
            "device",
            "port",
            unique=True,
            sqlite_where=text("cleared_at IS NULL"),
            postgresql_where=text("cleared_at IS NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(253))
    device: Mapped[str] = mapped_column(String(64))
    port: Mapped[int]
    flagged_at: Mapped[datetime]
    cleared_at: Mapped[datetime | None]
    reason: Mapped[str] = mapped_column(Text)
    # "flapping" (the service flagged it) or "operator".
    source: Mapped[str] = mapped_column(String(16), default="flapping")


class MaintenanceWindow(Base):
    """Planned maintenance on a switch, an RNIC or one port of it, or a whole node.

    `phase` and `due_at` are what the coordinator last acted on and when it looks
    again; the health the engine derives comes from the times alone.
    """

    __tablename__ = "maintenance_windows"
    __table_args__ = (Index("ix_maintenance_windows_due", "phase", "due_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    switch: Mapped[str | None] = mapped_column(String(128))
    node: Mapped[str | None] = mapped_column(String(253))
    device: Mapped[str | None] = mapped_column(String(64))
    port: Mapped[int] = mapped_column(Integer, default=WHOLE_DEVICE)
    start_at: Mapped[datetime]
    end_at: Mapped[datetime]
    moves_at: Mapped[datetime]
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
    created_by: Mapped[str | None] = mapped_column(String(64))
    cancelled_at: Mapped[datetime | None]
    phase: Mapped[str] = mapped_column(String(16), default="scheduled")
    due_at: Mapped[datetime | None]
    # Jobs that had no path left without the target when it was scheduled.
    would_restart: Mapped[list[str]] = mapped_column(JSON, default=list)


# --- Railover beside stock NCCL (issue 16): stalls the profiler plugin saw ---


class CclStall(Base):
    """A collective open far longer than expected: evidence on the node, not a NIC fault."""

    __tablename__ = "ccl_stalls"
    __table_args__ = (
        # The plugin reports a collective once; a replayed report is the same stall.
        UniqueConstraint("node", "comm_id", "rank", "seq_number"),
        Index("ix_ccl_stalls_comm", "comm_id", "observed_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(String(128))
    node: Mapped[str] = mapped_column(String(253))
    comm_id: Mapped[int] = mapped_column(UInt64)
    rank: Mapped[int | None]
    seq_number: Mapped[int] = mapped_column(UInt64)
    func: Mapped[str] = mapped_column(String(64), default="")
    open_s: Mapped[float | None]
    job_id: Mapped[str | None] = mapped_column(String(128))
    observed_at: Mapped[datetime]


# --- FlowCheck (issue 15): iterations a checkpoint node could not rebuild ---


class MirrorFailure(Base):
    """A checkpoint node's report that it could not rebuild one iteration of a job.

    One row per (job, iteration): a replayed report, or the same loss reported by a
    second checkpoint node, is the same failure.
    """

    __tablename__ = "mirror_failures"
    __table_args__ = (UniqueConstraint("job_id", "iteration"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id", ondelete="CASCADE"))
    iteration: Mapped[int] = mapped_column(BigInteger)
    at: Mapped[datetime]
    received_at: Mapped[datetime]
    reported_by: Mapped[str | None] = mapped_column(String(64))
