"""coordination

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 11:56:40.444461
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "maintenance_flags",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("device", sa.String(length=64), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("flagged_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cleared_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_maintenance_flags")),
    )
    with op.batch_alter_table("maintenance_flags", schema=None) as batch_op:
        batch_op.create_index(
            "uq_maintenance_flags_open",
            ["node", "device", "port"],
            unique=True,
            sqlite_where=sa.text("cleared_at IS NULL"),
            postgresql_where=sa.text("cleared_at IS NULL"),
        )

    op.create_table(
        "switch_faults",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("switch", sa.String(length=128), nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cleared_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_switch_faults")),
    )
    with op.batch_alter_table("switch_faults", schema=None) as batch_op:
        batch_op.create_index(
            "uq_switch_faults_open",
            ["switch"],
            unique=True,
            sqlite_where=sa.text("cleared_at IS NULL"),
            postgresql_where=sa.text("cleared_at IS NULL"),
        )

    op.create_table(
        "communicators",
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("comm_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("channels", sa.Integer(), nullable=False),
        sa.Column("ranks", sa.JSON(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("disabled_channels", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.job_id"],
            name=op.f("fk_communicators_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "comm_id", name=op.f("pk_communicators")),
    )
    with op.batch_alter_table("communicators", schema=None) as batch_op:
        batch_op.create_index("ix_communicators_comm_id", ["comm_id"], unique=False)

    op.create_table(
        "iteration_samples",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("degraded", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.job_id"],
            name=op.f("fk_iteration_samples_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_iteration_samples")),
    )
    with op.batch_alter_table("iteration_samples", schema=None) as batch_op:
        batch_op.create_index(
            "ix_iteration_samples_job", ["job_id", "degraded", "id"], unique=False
        )

    op.create_table(
        "rank_progress",
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("comm_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("rank", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("ops_done", sa.BigInteger(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("rate_ops_per_s", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.job_id"],
            name=op.f("fk_rank_progress_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "comm_id", "rank", name=op.f("pk_rank_progress")),
    )
    with op.batch_alter_table("commands", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attempt", sa.Integer(), nullable=False, server_default="1"))
        batch_op.add_column(sa.Column("ack_deadline_at", sa.DateTime(timezone=True), nullable=True))

    with op.batch_alter_table("faults", schema=None) as batch_op:
        batch_op.add_column(sa.Column("switch", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index(batch_op.f("ix_faults_switch"), ["switch"], unique=False)

    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("measured_k", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("repair_estimate_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("failed_over_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:

    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("failed_over_at")
        batch_op.drop_column("repair_estimate_s")
        batch_op.drop_column("measured_k")

    with op.batch_alter_table("faults", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_faults_switch"))
        batch_op.drop_column("resolved_at")
        batch_op.drop_column("switch")

    with op.batch_alter_table("commands", schema=None) as batch_op:
        batch_op.drop_column("ack_deadline_at")
        batch_op.drop_column("attempt")

    op.drop_table("rank_progress")
    with op.batch_alter_table("iteration_samples", schema=None) as batch_op:
        batch_op.drop_index("ix_iteration_samples_job")

    op.drop_table("iteration_samples")
    with op.batch_alter_table("communicators", schema=None) as batch_op:
        batch_op.drop_index("ix_communicators_comm_id")

    op.drop_table("communicators")
    with op.batch_alter_table("switch_faults", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_switch_faults_open",
            sqlite_where=sa.text("cleared_at IS NULL"),
            postgresql_where=sa.text("cleared_at IS NULL"),
        )

    op.drop_table("switch_faults")
    with op.batch_alter_table("maintenance_flags", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_maintenance_flags_open",
            sqlite_where=sa.text("cleared_at IS NULL"),
            postgresql_where=sa.text("cleared_at IS NULL"),
        )

    op.drop_table("maintenance_flags")
