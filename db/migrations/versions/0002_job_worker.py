"""Jobs remember the worker that claimed them (stale-work reaping); jobs are listed by owner.

Revision ID: 0002_job_worker
Revises: 0001_initial
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_job_worker"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("worker", sa.String(length=128), nullable=True))
        batch_op.create_index("ix_jobs_owner", ["owner", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_owner")
        batch_op.drop_column("worker")
