"""fleet notification: subscriptions, outbox, deliveries, audit log

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 11:49:30.513628
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("token_id", sa.String(length=32), nullable=True),
        sa.Column("role", sa.String(length=16), nullable=True),
        sa.Column("method", sa.String(length=8), nullable=False),
        sa.Column("path", sa.String(length=512), nullable=False),
        sa.Column("operation", sa.String(length=96), nullable=True),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("client", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.create_index("ix_audit_log_at", ["at"], unique=False)

    op.create_table(
        "outbox_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("event_id", sa.String(length=36), nullable=False),
        sa.Column("type", sa.String(length=96), nullable=False),
        sa.Column("subject", sa.String(length=253), nullable=False),
        sa.Column("job_id", sa.String(length=128), nullable=True),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox_events")),
        sa.UniqueConstraint("event_id", name=op.f("uq_outbox_events_event_id")),
    )
    with op.batch_alter_table("outbox_events", schema=None) as batch_op:
        batch_op.create_index("ix_outbox_events_job", ["job_id", "id"], unique=False)

    op.create_table(
        "subscriptions",
        sa.Column("subscription_id", sa.String(length=32), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("secret", sa.String(length=128), nullable=False),
        sa.Column("event_types", sa.JSON(), nullable=False),
        sa.Column("job_id", sa.String(length=128), nullable=True),
        sa.Column("description", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("subscription_id", name=op.f("pk_subscriptions")),
    )
    op.create_table(
        "deliveries",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column(
            "outbox_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("target", sa.String(length=160), nullable=False),
        sa.Column("lane", sa.String(length=300), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claimed_by", sa.String(length=64), nullable=True),
        sa.Column("claimed_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("dead_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["outbox_id"],
            ["outbox_events.id"],
            name=op.f("fk_deliveries_outbox_id_outbox_events"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deliveries")),
    )
    with op.batch_alter_table("deliveries", schema=None) as batch_op:
        batch_op.create_index("ix_deliveries_lane", ["lane", "state", "id"], unique=False)
        batch_op.create_index(batch_op.f("ix_deliveries_outbox_id"), ["outbox_id"], unique=False)
        batch_op.create_index("ix_deliveries_state_due", ["state", "next_attempt_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("deliveries", schema=None) as batch_op:
        batch_op.drop_index("ix_deliveries_state_due")
        batch_op.drop_index(batch_op.f("ix_deliveries_outbox_id"))
        batch_op.drop_index("ix_deliveries_lane")

    op.drop_table("deliveries")
    op.drop_table("subscriptions")
    with op.batch_alter_table("outbox_events", schema=None) as batch_op:
        batch_op.drop_index("ix_outbox_events_job")

    op.drop_table("outbox_events")
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_index("ix_audit_log_at")

    op.drop_table("audit_log")
