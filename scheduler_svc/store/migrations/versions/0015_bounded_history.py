"""Bounded history: refused requests counted per audit entry; events pruned by age

audit_log.count: the requests one entry stands for. Refused requests that never got
past authentication are kept as one entry per peer, status and minute (a flood of 401s
wrote a row each: 6,926 rows in 20 s). ix_events_received_at: the retention sweep
deletes events by their age (services/retention.py).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06 06:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("audit_log", sa.Column("count", sa.Integer(), nullable=False, server_default="1"))
    op.create_index("ix_events_received_at", "events", ["received_at"])


def downgrade() -> None:
    op.drop_index("ix_events_received_at", table_name="events")
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_column("count")
