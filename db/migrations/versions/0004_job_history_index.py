"""A job's records are read in id order from any point (the job history behind the dashboard):
the ``job_id`` index becomes ``(job_id, id, workload_id, mean_secs, measured_at)``, so a page of
history is an index-only range scan on both backends.

Revision ID: 0004_job_history_index
Revises: 0003_task_leases
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0004_job_history_index"
down_revision = "0003_task_leases"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_tuning_records_job_history",
        "tuning_records",
        ["job_id", "id", "workload_id", "mean_secs", "measured_at"],
        unique=False,
    )
    op.drop_index("ix_tuning_records_job", table_name="tuning_records")


def downgrade() -> None:
    op.create_index("ix_tuning_records_job", "tuning_records", ["job_id"], unique=False)
    op.drop_index("ix_tuning_records_job_history", table_name="tuning_records")
