"""Initial schema: specs, toolchains, pools, signatures, blobs, entries, jobs, tasks, coverage, workers.

Revision ID: 0001
Revises:
Create Date: 2026-11-29 23:06:35.815815
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('blobs',
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('size', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('reserved_until', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('sha256', name=op.f('pk_blobs'))
    )
    with op.batch_alter_table('blobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_blobs_reserved_until'), ['reserved_until'], unique=False)

    op.create_table('signatures',
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('data', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('key', name=op.f('pk_signatures'))
    )
    op.create_table('specs',
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('data', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('key', name=op.f('pk_specs'))
    )
    op.create_table('toolchains',
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('data', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('key', name=op.f('pk_toolchains'))
    )
    op.create_table('entries',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('signature_key', sa.String(length=64), nullable=False),
    sa.Column('toolchain_key', sa.String(length=64), nullable=False),
    sa.Column('compile_seconds', sa.Float(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['signature_key'], ['signatures.key'], name=op.f('fk_entries_signature_key_signatures')),
    sa.ForeignKeyConstraint(['toolchain_key'], ['toolchains.key'], name=op.f('fk_entries_toolchain_key_toolchains')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_entries')),
    sa.UniqueConstraint('signature_key', 'toolchain_key', name=op.f('uq_entries_signature_key_toolchain_key'))
    )
    with op.batch_alter_table('entries', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_entries_last_used_at'), ['last_used_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_entries_toolchain_key'), ['toolchain_key'], unique=False)

    op.create_table('jobs',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('spec_key', sa.String(length=64), nullable=False),
    sa.Column('toolchain_key', sa.String(length=64), nullable=False),
    sa.Column('warnings', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['spec_key'], ['specs.key'], name=op.f('fk_jobs_spec_key_specs')),
    sa.ForeignKeyConstraint(['toolchain_key'], ['toolchains.key'], name=op.f('fk_jobs_toolchain_key_toolchains')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_jobs')),
    sa.UniqueConstraint('spec_key', 'toolchain_key', name=op.f('uq_jobs_spec_key_toolchain_key'))
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_jobs_created_at'), ['created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_jobs_toolchain_key'), ['toolchain_key'], unique=False)

    op.create_table('pools',
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('toolchain_key', sa.String(length=64), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['toolchain_key'], ['toolchains.key'], name=op.f('fk_pools_toolchain_key_toolchains')),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_pools'))
    )
    op.create_table('tasks',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('signature_key', sa.String(length=64), nullable=False),
    sa.Column('toolchain_key', sa.String(length=64), nullable=False),
    sa.Column('state', sa.Enum('queued', 'running', 'done', 'failed', name='task_state', native_enum=False, create_constraint=True, length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('run_after', sa.DateTime(timezone=True), nullable=False),
    sa.Column('lease_owner', sa.String(length=255), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('log_tail', sa.Text(), nullable=True),
    sa.Column('compile_seconds', sa.Float(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint('attempts >= 0', name=op.f('ck_tasks_attempts')),
    sa.ForeignKeyConstraint(['signature_key'], ['signatures.key'], name=op.f('fk_tasks_signature_key_signatures')),
    sa.ForeignKeyConstraint(['toolchain_key'], ['toolchains.key'], name=op.f('fk_tasks_toolchain_key_toolchains')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tasks')),
    sa.UniqueConstraint('signature_key', 'toolchain_key', name=op.f('uq_tasks_signature_key_toolchain_key'))
    )
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.create_index('ix_tasks_claim', ['toolchain_key', 'state', 'run_after'], unique=False)

    op.create_table('workers',
    sa.Column('id', sa.String(length=255), nullable=False),
    sa.Column('toolchain_key', sa.String(length=64), nullable=False),
    sa.Column('pool', sa.String(length=128), nullable=True),
    sa.Column('host', sa.String(length=255), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_seen', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['toolchain_key'], ['toolchains.key'], name=op.f('fk_workers_toolchain_key_toolchains')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_workers'))
    )
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_workers_toolchain_key'), ['toolchain_key'], unique=False)

    op.create_table('coverage_reports',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.Uuid(), nullable=False),
    sa.Column('met', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('missed', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('fresh_compiles', sa.Integer(), nullable=False),
    sa.Column('details', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_coverage_reports_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_coverage_reports'))
    )
    with op.batch_alter_table('coverage_reports', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_coverage_reports_created_at'), ['created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_coverage_reports_job_id'), ['job_id'], unique=False)

    op.create_table('entry_files',
    sa.Column('entry_id', sa.Integer(), nullable=False),
    sa.Column('path', sa.String(length=1024), nullable=False),
    sa.Column('blob_sha256', sa.String(length=64), nullable=False),
    sa.ForeignKeyConstraint(['blob_sha256'], ['blobs.sha256'], name=op.f('fk_entry_files_blob_sha256_blobs')),
    sa.ForeignKeyConstraint(['entry_id'], ['entries.id'], name=op.f('fk_entry_files_entry_id_entries'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('entry_id', 'path', name=op.f('pk_entry_files'))
    )
    with op.batch_alter_table('entry_files', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_entry_files_blob_sha256'), ['blob_sha256'], unique=False)

    op.create_table('job_signatures',
    sa.Column('job_id', sa.Uuid(), nullable=False),
    sa.Column('signature_key', sa.String(length=64), nullable=False),
    sa.Column('source', sa.String(length=16), nullable=False),
    sa.CheckConstraint("source IN ('plan', 'coverage')", name=op.f('ck_job_signatures_source')),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_job_signatures_job_id_jobs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['signature_key'], ['signatures.key'], name=op.f('fk_job_signatures_signature_key_signatures')),
    sa.PrimaryKeyConstraint('job_id', 'signature_key', name=op.f('pk_job_signatures'))
    )
    with op.batch_alter_table('job_signatures', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_job_signatures_signature_key'), ['signature_key'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('job_signatures', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_job_signatures_signature_key'))

    op.drop_table('job_signatures')
    with op.batch_alter_table('entry_files', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_entry_files_blob_sha256'))

    op.drop_table('entry_files')
    with op.batch_alter_table('coverage_reports', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_coverage_reports_job_id'))
        batch_op.drop_index(batch_op.f('ix_coverage_reports_created_at'))

    op.drop_table('coverage_reports')
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_workers_toolchain_key'))

    op.drop_table('workers')
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.drop_index('ix_tasks_claim')

    op.drop_table('tasks')
    op.drop_table('pools')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_toolchain_key'))
        batch_op.drop_index(batch_op.f('ix_jobs_created_at'))

    op.drop_table('jobs')
    with op.batch_alter_table('entries', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_entries_toolchain_key'))
        batch_op.drop_index(batch_op.f('ix_entries_last_used_at'))

    op.drop_table('entries')
    op.drop_table('toolchains')
    op.drop_table('specs')
    op.drop_table('signatures')
    with op.batch_alter_table('blobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_blobs_reserved_until'))

    op.drop_table('blobs')
