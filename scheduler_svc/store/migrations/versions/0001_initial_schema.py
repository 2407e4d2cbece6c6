"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29 11:33:05.218454
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "api_tokens",
        sa.Column("token_id", sa.String(length=32), nullable=False),
        sa.Column("secret_sha256", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=True),
        sa.Column("description", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("token_id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("secret_sha256", name=op.f("uq_api_tokens_secret_sha256")),
    )
    op.create_table(
        "events",
        sa.Column("event_id", sa.String(length=128), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("device", sa.String(length=64), nullable=True),
        sa.Column("port", sa.Integer(), nullable=True),
        sa.Column("observed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("fault_id", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_events")),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index("ix_events_node_observed", ["node", "observed_at"], unique=False)

    op.create_table(
        "faults",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("device", sa.String(length=64), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cleared_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("first_event_id", sa.String(length=128), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_faults")),
    )
    with op.batch_alter_table("faults", schema=None) as batch_op:
        batch_op.create_index(
            "uq_faults_open_component",
            ["node", "device", "port"],
            unique=True,
            sqlite_where=sa.text("cleared_at IS NULL"),
            postgresql_where=sa.text("cleared_at IS NULL"),
        )

    op.create_table(
        "jobs",
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("checkpoint_interval_s", sa.Float(), nullable=False),
        sa.Column("reload_s", sa.Float(), nullable=False),
        sa.Column("detect_s", sa.Float(), nullable=False),
        sa.Column("timeout_s", sa.Float(), nullable=False),
        sa.Column("last_checkpoint_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_checkpoint_iteration", sa.BigInteger(), nullable=True),
        sa.Column("last_checkpoint_kind", sa.String(length=16), nullable=False),
        sa.Column("slowdown_k", sa.Float(), nullable=True),
        sa.Column("comm_share", sa.Float(), nullable=True),
        sa.Column("dp_size", sa.Integer(), nullable=False),
        sa.Column("tp_size", sa.Integer(), nullable=False),
        sa.Column("pp_size", sa.Integer(), nullable=False),
        sa.Column("allow_scaling", sa.Boolean(), nullable=False),
        sa.Column("spare_nodes", sa.Boolean(), nullable=False),
        sa.Column("node_replace_s", sa.Float(), nullable=False),
        sa.Column("notify_url", sa.String(length=2048), nullable=True),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("decision_count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_jobs")),
    )
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("topology_version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_nodes")),
    )
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("iteration", sa.BigInteger(), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.job_id"], name=op.f("fk_checkpoints_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoints")),
    )
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_checkpoints_job_id"), ["job_id"], unique=False)

    op.create_table(
        "commands",
        sa.Column(
            "command_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("decision_id", sa.String(length=36), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("comm_id", sa.BigInteger(), nullable=False),
        sa.Column("ops_done", sa.BigInteger(), nullable=False),
        sa.Column("disabled_channels", sa.JSON(), nullable=False),
        sa.Column("ranks", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.job_id"], name=op.f("fk_commands_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("command_id", name=op.f("pk_commands")),
        # Agents de-duplicate by command id, so ids must never come back after
        # a job's commands are deleted (SQLite reuses plain rowids).
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("commands", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_commands_job_id"), ["job_id"], unique=False)
        batch_op.create_index("ix_commands_node_state", ["node", "state"], unique=False)

    op.create_table(
        "decisions",
        sa.Column("decision_id", sa.String(length=36), nullable=False),
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("trigger", sa.String(length=128), nullable=False),
        sa.Column("fault_id", sa.Integer(), nullable=True),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("inputs", sa.JSON(), nullable=False),
        sa.Column("costs_s", sa.JSON(), nullable=False),
        sa.Column("costs_gpu_s", sa.JSON(), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.job_id"], name=op.f("fk_decisions_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("decision_id", name=op.f("pk_decisions")),
        sa.UniqueConstraint("job_id", "trigger", name=op.f("uq_decisions_job_id_trigger")),
    )
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.create_index("ix_decisions_job_created", ["job_id", "created_at"], unique=False)

    op.create_table(
        "gpus",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("pci", sa.String(length=32), nullable=False),
        sa.Column("numa", sa.Integer(), nullable=True),
        sa.Column("pcie_switch", sa.String(length=64), nullable=True),
        sa.Column("root_complex", sa.String(length=64), nullable=True),
        sa.Column("nvlink", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["node"], ["nodes.name"], name=op.f("fk_gpus_node_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpus")),
        sa.UniqueConstraint("node", "index", name=op.f("uq_gpus_node_index")),
    )
    op.create_table(
        "job_ranks",
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("gpu", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.job_id"], name=op.f("fk_job_ranks_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "rank", name=op.f("pk_job_ranks")),
    )
    with op.batch_alter_table("job_ranks", schema=None) as batch_op:
        batch_op.create_index("ix_job_ranks_node", ["node"], unique=False)

    op.create_table(
        "rnics",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("pci", sa.String(length=32), nullable=False),
        sa.Column("numa", sa.Integer(), nullable=True),
        sa.Column("pcie_switch", sa.String(length=64), nullable=True),
        sa.Column("root_complex", sa.String(length=64), nullable=True),
        sa.Column("rate_gbps", sa.Float(), nullable=False),
        sa.Column("link_layer", sa.String(length=32), nullable=True),
        sa.Column("netdev", sa.String(length=64), nullable=True),
        sa.Column("switch", sa.String(length=128), nullable=True),
        sa.Column("rail", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.ForeignKeyConstraint(
            ["node"], ["nodes.name"], name=op.f("fk_rnics_node_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rnics")),
        sa.UniqueConstraint("node", "name", "port", name=op.f("uq_rnics_node_name_port")),
    )
    with op.batch_alter_table("rnics", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_rnics_switch"), ["switch"], unique=False)

    op.create_table(
        "command_acks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column(
            "command_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["command_id"],
            ["commands.command_id"],
            name=op.f("fk_command_acks_command_id_commands"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_command_acks")),
    )
    with op.batch_alter_table("command_acks", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_command_acks_command_id"), ["command_id"], unique=False
        )


def downgrade() -> None:

    with op.batch_alter_table("command_acks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_command_acks_command_id"))

    op.drop_table("command_acks")
    with op.batch_alter_table("rnics", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_rnics_switch"))

    op.drop_table("rnics")
    with op.batch_alter_table("job_ranks", schema=None) as batch_op:
        batch_op.drop_index("ix_job_ranks_node")

    op.drop_table("job_ranks")
    op.drop_table("gpus")
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.drop_index("ix_decisions_job_created")

    op.drop_table("decisions")
    with op.batch_alter_table("commands", schema=None) as batch_op:
        batch_op.drop_index("ix_commands_node_state")
        batch_op.drop_index(batch_op.f("ix_commands_job_id"))

    op.drop_table("commands")
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_checkpoints_job_id"))

    op.drop_table("checkpoints")
    op.drop_table("nodes")
    op.drop_table("jobs")
    with op.batch_alter_table("faults", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_faults_open_component",
            sqlite_where=sa.text("cleared_at IS NULL"),
            postgresql_where=sa.text("cleared_at IS NULL"),
        )

    op.drop_table("faults")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index("ix_events_node_observed")

    op.drop_table("events")
    op.drop_table("api_tokens")
