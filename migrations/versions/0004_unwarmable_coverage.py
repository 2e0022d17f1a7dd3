"""A reported signature the job's spec cannot warm: the reason, on the job's link to it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04 21:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('job_signatures', schema=None) as batch_op:
        batch_op.add_column(sa.Column('unwarmable', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('job_signatures', schema=None) as batch_op:
        batch_op.drop_column('unwarmable')
