"""RDMA devices of every kind: PCI function optional, kind, physfn, members, counters

rnics.pci becomes nullable (a soft device, or one whose sysfs names no PCI function;
rows registered with "" become null); rnics.kind (physical, sf, vf, bond, soft;
existing rows are physical), rnics.physfn (a VF's physical function), rnics.members
(a RoCE bond's member functions) and rnics.counters (each watched counter's
availability as the agent registered it).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-08 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("rnics", schema=None) as batch_op:
        batch_op.alter_column("pci", existing_type=sa.String(length=32), nullable=True)
        batch_op.add_column(
            sa.Column("kind", sa.String(length=16), server_default="physical", nullable=False)
        )
        batch_op.add_column(sa.Column("physfn", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("members", sa.JSON(), server_default="[]", nullable=False))
        batch_op.add_column(sa.Column("counters", sa.JSON(), server_default="{}", nullable=False))
    op.execute("UPDATE rnics SET pci = NULL WHERE pci = ''")


def downgrade() -> None:
    op.execute("UPDATE rnics SET pci = '' WHERE pci IS NULL")
    with op.batch_alter_table("rnics", schema=None) as batch_op:
        batch_op.drop_column("counters")
        batch_op.drop_column("members")
        batch_op.drop_column("physfn")
        batch_op.drop_column("kind")
        batch_op.alter_column("pci", existing_type=sa.String(length=32), nullable=False)
