"""A job's preview artifact (issue 21): the zero-trial build published while the job tunes.

- ``task_leases.kind`` may be ``preview`` (the lease whose worker builds and uploads it).
- ``artifacts.kind``: ``final`` (every artifact so far: the job's result) or ``preview``.

The lease kind's CHECK constraint is replaced; on SQLite that rebuilds ``task_leases`` (a batch
migration: nothing references it, so no cascade). Its partial unique index on the active work
key is dropped first and made again after, explicitly, so the rebuild cannot lose its
``WHERE status = 'active'``.

Revision ID: 0010_preview_artifacts
Revises: 0009_model_buckets
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_preview_artifacts"
down_revision = "0009_model_buckets"
branch_labels = None
depends_on = None

_ACTIVE_WORK = "uq_task_leases_active_work"


def _lease_kinds(kinds: str) -> None:
    op.drop_index(_ACTIVE_WORK, table_name="task_leases")
    with op.batch_alter_table("task_leases") as batch:
        batch.drop_constraint(op.f("ck_task_leases_kind"), type_="check")
        batch.create_check_constraint(op.f("ck_task_leases_kind"), f"kind IN ({kinds})")
    op.create_index(
        _ACTIVE_WORK,
        "task_leases",
        ["work_key"],
        unique=True,
        postgresql_where=sa.text("status = 'active'"),
        sqlite_where=sa.text("status = 'active'"),
    )


def upgrade() -> None:
    _lease_kinds("'tune', 'finalize', 'preview'")
    op.add_column(
        "artifacts", sa.Column("kind", sa.String(16), nullable=False, server_default="final")
    )


def downgrade() -> None:
    op.execute("DELETE FROM task_leases WHERE kind = 'preview'")
    op.execute("DELETE FROM artifacts WHERE kind = 'preview'")
    with op.batch_alter_table("artifacts") as batch:
        batch.drop_column("kind")
    _lease_kinds("'tune', 'finalize'")
