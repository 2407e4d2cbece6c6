"""FlowCheck rebuild failures, checkpoint_now's iteration and a checkpoint index

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 15:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "mirror_failures",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("iteration", sa.BigInteger(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reported_by", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.job_id"],
            name=op.f("fk_mirror_failures_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_mirror_failures")),
        sa.UniqueConstraint(
            "job_id", "iteration", name=op.f("uq_mirror_failures_job_id_iteration")
        ),
    )
    with op.batch_alter_table("commands", schema=None) as batch_op:
        batch_op.add_column(sa.Column("iteration", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.create_index(
            "ix_checkpoints_job_kind_iteration", ["job_id", "kind", "iteration"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_index("ix_checkpoints_job_kind_iteration")
    with op.batch_alter_table("commands", schema=None) as batch_op:
        batch_op.drop_column("iteration")
    op.drop_table("mirror_failures")
