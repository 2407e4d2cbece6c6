"""A node's backup plan, stored at registration

nodes.plan: the s-Bond plan (primary and backup RNIC of each GPU, warnings) as computed
when the topology was registered, with the topology version and PCIe-switch cap it was
computed for. GET /v1/nodes served it recomputed for every node at every read: 1.9 s a
call for one node of 1,024 GPUs and 1,024 RNICs. Null for nodes registered before: their
plan is computed at read until they register again.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06 06:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("plan", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("plan")
