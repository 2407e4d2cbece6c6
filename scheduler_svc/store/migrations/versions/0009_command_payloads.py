"""Balance weights, allreduce split and NVL transit on commands; a job's transit cap

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 15:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("commands", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("channel_weights", sa.JSON(), nullable=False, server_default="[]")
        )
        batch_op.add_column(sa.Column("split_ratio", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("transit", sa.JSON(), nullable=False, server_default="[]"))
        batch_op.add_column(sa.Column("transit_mb_per_channel", sa.Integer(), nullable=True))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("nvl_cap_mb", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("nvl_cap_mb")
    with op.batch_alter_table("commands", schema=None) as batch_op:
        batch_op.drop_column("transit_mb_per_channel")
        batch_op.drop_column("transit")
        batch_op.drop_column("split_ratio")
        batch_op.drop_column("channel_weights")
