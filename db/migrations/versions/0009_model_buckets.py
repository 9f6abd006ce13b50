"""Shape buckets of a model with symbolic dimensions (issue 20): ``models.buckets_json``.

The buckets an upload was validated with (``compiler.shapes.buckets.ShapeBuckets.to_json()``: each
symbol's values, which were defaulted), so that every later step that prepares the model again
(a finalize lease, the server's check of its artifact) compiles the same specializations and
the same task list. ``NULL`` for a model with static inputs. A plain ``ADD COLUMN`` (no table
rebuild: see 0006 on rebuilding ``models`` in SQLite).

Revision ID: 0009_model_buckets
Revises: 0008_library_records
Create Date: 2026-12-09
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_model_buckets"
down_revision = "0008_library_records"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("models", sa.Column("buckets_json", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("buckets_json")
