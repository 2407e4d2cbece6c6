"""Railover beside stock NCCL: job CCL, announced communicators, stalls

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 09:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("ccl", sa.JSON(), nullable=True))
    with op.batch_alter_table("communicators", schema=None) as batch_op:
        batch_op.add_column(sa.Column("nranks", sa.Integer(), nullable=True))
    op.create_table(
        "ccl_stalls",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("event_id", sa.String(length=128), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("comm_id", sa.BigInteger(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("seq_number", sa.BigInteger(), nullable=False),
        sa.Column("func", sa.String(length=64), nullable=False),
        sa.Column("open_s", sa.Float(), nullable=True),
        sa.Column("job_id", sa.String(length=128), nullable=True),
        sa.Column("observed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ccl_stalls")),
        sa.UniqueConstraint(
            "node",
            "comm_id",
            "rank",
            "seq_number",
            name=op.f("uq_ccl_stalls_node_comm_id_rank_seq_number"),
        ),
    )
    with op.batch_alter_table("ccl_stalls", schema=None) as batch_op:
        batch_op.create_index("ix_ccl_stalls_comm", ["comm_id", "observed_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("ccl_stalls", schema=None) as batch_op:
        batch_op.drop_index("ix_ccl_stalls_comm")
    op.drop_table("ccl_stalls")
    with op.batch_alter_table("communicators", schema=None) as batch_op:
        batch_op.drop_column("nranks")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("ccl")
