"""reconcile: fault evidence and resolution, desired state per job, too-late acks

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 09:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("faults", schema=None) as batch_op:
        batch_op.add_column(sa.Column("last_error_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("resolved_reason", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("resolved_by", sa.String(length=32), nullable=True))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("restart_decided_at", sa.DateTime(timezone=True), nullable=True)
        )
        batch_op.add_column(sa.Column("desired", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("commanded", sa.JSON(), nullable=True))
        batch_op.add_column(
            sa.Column("reconcile_due_at", sa.DateTime(timezone=True), nullable=True)
        )
    with op.batch_alter_table("command_acks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("ops_done", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.add_column(sa.Column("detail", sa.Text(), nullable=True))
    with op.batch_alter_table("maintenance_flags", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("source", sa.String(length=16), nullable=False, server_default="flapping")
        )


def downgrade() -> None:
    with op.batch_alter_table("maintenance_flags", schema=None) as batch_op:
        batch_op.drop_column("source")
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_column("detail")
    with op.batch_alter_table("command_acks", schema=None) as batch_op:
        batch_op.drop_column("ops_done")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("reconcile_due_at")
        batch_op.drop_column("commanded")
        batch_op.drop_column("desired")
        batch_op.drop_column("restart_decided_at")
    with op.batch_alter_table("faults", schema=None) as batch_op:
        batch_op.drop_column("resolved_by")
        batch_op.drop_column("resolved_reason")
        batch_op.drop_column("last_error_at")
