"""Kernels as peers (issue 21): library calls measured as candidates of a tuning task.

``library_records``: one row per measurement of a library call (e.g. OpenBLAS ``sgemm`` behind a
shim) for a workload on a target: the library, its version, the call (canonical JSON), the time
of each round (``run_secs_json``), their median and relative spread, the job and worker. Stored
like a schedule: shared by every model with the task; deleting the workload or target deletes
its rows, deleting the job keeps them (job unset).

Revision ID: 0008_library_records
Revises: 0007_remeasurements
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_library_records"
down_revision = "0007_remeasurements"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "library_records",
        sa.Column("id", _ID, primary_key=True),
        sa.Column(
            "workload_id", _ID, sa.ForeignKey("workloads.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column(
            "target_id", _ID, sa.ForeignKey("targets.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("library", sa.String(64), nullable=False),
        sa.Column("version", sa.String(128), nullable=False),
        sa.Column("call_json", sa.Text(), nullable=False),
        sa.Column("run_secs_json", sa.Text(), nullable=False),
        sa.Column("median_secs", sa.Float(), nullable=False),
        sa.Column("spread", sa.Float(), nullable=False),
        sa.Column("job_id", _ID, sa.ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True),
        sa.Column("worker", sa.String(128), nullable=True),
        sa.Column(
            "measured_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )
    op.create_index("ix_library_records_task", "library_records", ["workload_id", "target_id"])
    op.create_index("ix_library_records_job", "library_records", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_library_records_job", "library_records")
    op.drop_index("ix_library_records_task", "library_records")
    op.drop_table("library_records")
