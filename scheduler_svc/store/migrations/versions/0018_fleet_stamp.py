"""The fleet's registration stamp as one row, not an aggregate over every node

fleet_stamp.version: given a new value in the transaction of every node registration that
creates a node or changes its topology (store/nodes.py, NodeRepo.bump_fleet). A decision reads it
to know whether a job's cached plans may still hold: one row by its key, where the
aggregate it replaces (count, sum and max over `nodes`) read every node of the fleet on
every decision (8 ms at 8,192 nodes on SQLite).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06 19:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "fleet_stamp",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.execute("INSERT INTO fleet_stamp (id, version) VALUES (1, 0)")


def downgrade() -> None:
    op.drop_table("fleet_stamp")
