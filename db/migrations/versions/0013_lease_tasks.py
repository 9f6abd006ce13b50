"""A tune lease covers one or several tasks of a job (issue 33): the ``lease_tasks`` table.

A worker's search spreads a lease's trials over the lease's tasks with MetaSchedule's gradient
task scheduler, as ``tunehub tune`` does over a whole job. ``task_leases.task_id`` stays the
lease's first task; ``lease_tasks`` lists them all (``position`` 0 is that first task). Existing
tune leases get their one task.

Revision ID: 0013_lease_tasks
Revises: 0012_library_record_holds
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_lease_tasks"
down_revision = "0012_library_record_holds"
branch_labels = None
depends_on = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "lease_tasks",
        sa.Column(
            "lease_id",
            _BIG_ID,
            sa.ForeignKey("task_leases.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column(
            "task_id", _BIG_ID, sa.ForeignKey("job_tasks.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("position", sa.Integer(), nullable=False),
    )
    op.get_bind().execute(
        sa.text(
            "INSERT INTO lease_tasks (lease_id, task_id, position) "
            "SELECT id, task_id, 0 FROM task_leases WHERE kind = 'tune' AND task_id IS NOT NULL"
        )
    )


def downgrade() -> None:
    op.drop_table("lease_tasks")
