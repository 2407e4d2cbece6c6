"""Port levels and explicit incarnations

rnics.observed_at: when the port's state (its level) was observed, so a report older
than the newest one known for a port changes nothing but the history.
jobs.incarnation: the job's current incarnation, started by a fleet manager's re-post.
commands.incarnation and checkpoints.incarnation: the incarnation a command is for and
a checkpoint came from (null on a checkpoint that did not say).
commands.returning_ranks: the ranks a FAILBACK returns to their primary, of the many its
switch point names (null on other kinds and on older rows).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 07:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN, not batch mode: on SQLite a batch copies the table, and the copy of
    # `commands` would lose its AUTOINCREMENT (command ids must never be handed out twice).
    op.add_column("rnics", sa.Column("observed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "jobs",
        sa.Column("incarnation", sa.Integer(), nullable=False, server_default=sa.text("1")),
    )
    op.add_column(
        "commands",
        sa.Column("incarnation", sa.Integer(), nullable=False, server_default=sa.text("1")),
    )
    op.add_column("checkpoints", sa.Column("incarnation", sa.Integer(), nullable=True))
    op.add_column("commands", sa.Column("returning_ranks", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_column("incarnation")
    with op.batch_alter_table("commands", schema=None) as batch_op:
        batch_op.drop_column("returning_ranks")
        batch_op.drop_column("incarnation")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("incarnation")
    with op.batch_alter_table("rnics", schema=None) as batch_op:
        batch_op.drop_column("observed_at")
