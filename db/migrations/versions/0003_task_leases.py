"""Task leases for distributed workers; model tasks remember why they are not tuned.

``task_leases`` holds one row per lease a worker took: a trial batch of one job task
(``kind='tune'``) or the compile/verify/publish step of a job (``kind='finalize'``). The partial
unique index on ``work_key`` where ``status='active'`` is what makes a double assignment
impossible: two claimers of the same work cannot both insert an active lease.

Revision ID: 0003_task_leases
Revises: 0002_job_worker
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_task_leases"
down_revision = "0002_job_worker"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "task_leases",
        sa.Column("id", _ID, nullable=False),
        sa.Column("job_id", _ID, nullable=False),
        sa.Column("task_id", _ID, nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("work_key", sa.String(length=64), nullable=False),
        sa.Column("worker", sa.String(length=128), nullable=False),
        sa.Column("status", sa.String(length=16), server_default="active", nullable=False),
        sa.Column("trials", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("trials_done", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("batches_done", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("kind IN ('tune', 'finalize')", name=op.f("ck_task_leases_kind")),
        sa.CheckConstraint(
            "status IN ('active', 'done', 'expired', 'returned', 'failed', 'cancelled')",
            name=op.f("ck_task_leases_status"),
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_task_leases_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["job_tasks.id"],
            name=op.f("fk_task_leases_task_id_job_tasks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_leases")),
    )
    with op.batch_alter_table("task_leases", schema=None) as batch_op:
        batch_op.create_index(
            "uq_task_leases_active_work",
            ["work_key"],
            unique=True,
            postgresql_where=sa.text("status = 'active'"),
            sqlite_where=sa.text("status = 'active'"),
        )
        batch_op.create_index("ix_task_leases_worker", ["worker", "status"], unique=False)
        batch_op.create_index("ix_task_leases_job", ["job_id", "id"], unique=False)
        batch_op.create_index("ix_task_leases_expiry", ["status", "expires_at"], unique=False)
    with op.batch_alter_table("model_workloads", schema=None) as batch_op:
        batch_op.add_column(sa.Column("skip_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("model_workloads", schema=None) as batch_op:
        batch_op.drop_column("skip_reason")
    with op.batch_alter_table("task_leases", schema=None) as batch_op:
        batch_op.drop_index("ix_task_leases_expiry")
        batch_op.drop_index("ix_task_leases_job")
        batch_op.drop_index("ix_task_leases_worker")
        batch_op.drop_index("uq_task_leases_active_work")
    op.drop_table("task_leases")
