"""One active lease per worker (issue 31): a partial unique index on ``task_leases.worker``
where ``status = 'active'``.

The documentation always said a worker works on one task at a time; nothing enforced it, and
one worker could hold any number of active leases. With the index, two claims for the same
worker cannot both insert an active lease, whatever the backend or the interleaving.

A database that already holds several active leases of one worker keeps the newest; the others
are ended ``returned`` (which counts as no failed attempt) and their tune tasks go back to the
queue, with the trials already counted kept, before the index is made.

Revision ID: 0011_one_lease_per_worker
Revises: 0010_preview_artifacts
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_one_lease_per_worker"
down_revision = "0010_preview_artifacts"
branch_labels = None
depends_on = None

_INDEX = "uq_task_leases_active_worker"
_RETURNED = "returned by migration 0011: its worker held another active lease"


def upgrade() -> None:
    op.get_bind().execute(
        sa.text(
            "UPDATE task_leases SET status = 'returned', error = :why, "
            "finished_at = CURRENT_TIMESTAMP, updated_at = CURRENT_TIMESTAMP "
            "WHERE status = 'active' AND id < ("
            "  SELECT MAX(newest.id) FROM task_leases newest"
            "  WHERE newest.worker = task_leases.worker AND newest.status = 'active')"
        ),
        {"why": _RETURNED},
    )
    op.get_bind().execute(
        sa.text(
            "UPDATE job_tasks SET status = 'queued', leased_by = NULL, lease_expires_at = NULL, "
            "updated_at = CURRENT_TIMESTAMP "
            "WHERE status = 'running' AND id IN ("
            "  SELECT task_id FROM task_leases WHERE kind = 'tune' AND error = :why)"
        ),
        {"why": _RETURNED},
    )
    op.create_index(
        _INDEX,
        "task_leases",
        ["worker"],
        unique=True,
        postgresql_where=sa.text("status = 'active'"),
        sqlite_where=sa.text("status = 'active'"),
    )


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="task_leases")
