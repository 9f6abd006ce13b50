"""A job keeps what its runs' search features did (sibling seeds, stored schedules skipped,
default schedules, cost model), summed over its leases or its ``tunehub tune`` runs:
``jobs.search_json``.

Revision ID: 0005_job_search
Revises: 0004_job_history_index
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_job_search"
down_revision = "0004_job_history_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("search_json", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("search_json")
