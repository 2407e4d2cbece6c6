"""The evidence's stamp: one row that every commit writing the fabric's evidence counts

evidence_stamp.version: one more at every commit that wrote faults, port levels, quarantine
flags, switch failures or maintenance windows, in that commit's transaction, as its last
statement (store/evidence_view.py). A replica keeps the evidence in memory and reads it
again only where the stamp says a commit it did not follow changed it.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07 18:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "evidence_stamp",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.execute("INSERT INTO evidence_stamp (id, version) VALUES (1, 0)")


def downgrade() -> None:
    op.drop_table("evidence_stamp")
