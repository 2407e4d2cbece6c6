"""Port levels and explicit incarnations

rnics.observed_at: when the port's state (its level) was observed, so a report older
than the newest one known for a port changes nothing but the history.
jobs.incarnation: the job's current incarnation, started by a fleet manager's re-post.
commands.incarnation and checkpoints.incarnation: the incarnation a command is for and
a checkpoint came from (null on a checkpoint that did not say).

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
    with op.batch_alter_table("rnics", schema=None) as batch_op:
        batch_op.add_column(sa.Column("observed_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("incarnation", sa.Integer(), nullable=False, server_default=sa.text("1"))
        )
    with op.batch_alter_table("commands", schema=None) as batch_op:
        # A plain constant default: SQLite adds the column in place. With sa.text("1") the
        # batch recreated the table without AUTOINCREMENT, and a deleted job's command ids
        # were handed out again (agents de-duplicate by id).
        batch_op.add_column(
            sa.Column("incarnation", sa.Integer(), nullable=False, server_default="1")
        )
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.add_column(sa.Column("incarnation", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_column("incarnation")
    with op.batch_alter_table("commands", schema=None) as batch_op:
        batch_op.drop_column("incarnation")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("incarnation")
    with op.batch_alter_table("rnics", schema=None) as batch_op:
        batch_op.drop_column("observed_at")
