"""How many spare nodes are free, as the fleet manager last said

jobs.spares_free: the count of healthy spare nodes free for the job, said with the job's
post or a checkpoint (null: never said; then only spare_nodes, a boolean, is known). With
RAILOVER_SPARE_RESERVE the service keeps that many spares for faults that only a
replacement fixes (a lost GPU, a dead node): a job restarts to escape a fault it could
fail over from only while more spares than the reserve are free.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 12:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("spares_free", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("spares_free")
