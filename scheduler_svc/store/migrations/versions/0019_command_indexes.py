"""Indexes that find a job's live commands without reading its history

A job's life leaves a row per node at every switch point (a month of an 8,000-rank job
is about 300,000). Each reconcile pass looked for the few still on their way by reading
all of them: the queries had only the job_id index, and SQLite, asked for them in
command order, walked that index rather than sort a handful of rows (63 ms a query at
300,000 rows, several queries a pass). The coordinator's overdue sweep and the gauges
scanned the whole table by state (43 ms a sweep). Now:
- (job_id, comm_id, epoch): a communicator's newest epoch as one aggregate
  (CommandRepo.max_epoch), and a switch point's rows (CommandRepo.switch_points);
- (job_id, state, comm_id): a job's or communicator's commands in some states (the
  queries no longer ask SQL for an order; the few rows are sorted in Python);
- (state, ack_deadline_at): the overdue sweep and the unacknowledged gauges.

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


INDEXES = {
    "ix_commands_job_comm_epoch": ["job_id", "comm_id", "epoch"],
    "ix_commands_job_state": ["job_id", "state", "comm_id"],
    "ix_commands_state_deadline": ["state", "ack_deadline_at"],
}


def upgrade() -> None:
    for name, columns in INDEXES.items():
        op.create_index(name, "commands", columns, unique=False)


def downgrade() -> None:
    for name in INDEXES:
        op.drop_index(name, table_name="commands")
