"""Blob damage: what `warmup store check` found wrong with a stored blob, and when

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-04 21:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('blobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('damaged_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('damage', sa.Text(), nullable=True))
        batch_op.create_index(batch_op.f('ix_blobs_damaged_at'), ['damaged_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('blobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_blobs_damaged_at'))
        batch_op.drop_column('damage')
        batch_op.drop_column('damaged_at')
