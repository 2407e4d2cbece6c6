"""When the current incarnation started

jobs.incarnation_started_at: the service's clock when the job's current incarnation
started (a re-post, or a checkpoint naming the next incarnation). A progress report
that names no incarnation and was observed before it belongs to the ended one: it is
kept as history and moves no op count. Null for jobs still in their first incarnation.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06 00:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "jobs", sa.Column("incarnation_started_at", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("incarnation_started_at")
