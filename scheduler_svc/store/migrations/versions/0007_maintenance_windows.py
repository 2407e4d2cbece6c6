"""Planned maintenance windows

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 12:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "maintenance_windows",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("switch", sa.String(length=128), nullable=True),
        sa.Column("node", sa.String(length=253), nullable=True),
        sa.Column("device", sa.String(length=64), nullable=True),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("start_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("moves_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=True),
        sa.Column("cancelled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("would_restart", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_maintenance_windows")),
    )
    with op.batch_alter_table("maintenance_windows", schema=None) as batch_op:
        batch_op.create_index("ix_maintenance_windows_due", ["phase", "due_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("maintenance_windows", schema=None) as batch_op:
        batch_op.drop_index("ix_maintenance_windows_due")
    op.drop_table("maintenance_windows")
