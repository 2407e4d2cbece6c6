"""An index for a communicator's newest epoch

Every switch point the service issues takes the communicator's next epoch; for a job
without registered communicators that is the highest epoch its commands have had, which
was read by loading every command the job ever had (a row per node per switch point: a
month of an 8,000-rank job is hundreds of thousands). It is now one aggregate
(CommandRepo.max_epoch) on this index.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06 19:00:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_commands_job_comm_epoch", "commands", ["job_id", "comm_id", "epoch"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_commands_job_comm_epoch", table_name="commands")
