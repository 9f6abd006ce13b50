"""Trust boundaries (issue 18): held (quarantined) tuning records, workers bound to the token
that registered them and to one process at a time, model ids never reused on SQLite.

- ``tuning_records.quarantined``: a record held as implausible or quarantined by an operator
  (stored with ``is_valid`` false, so no best-record query uses it; the claimed run times stay
  in ``run_secs_json``).
- ``workers.token_id``: the worker token that registered the name (``NULL``: an in-process
  worker on the database); ``workers.instance``: the current registration (one process).
- ``id_floors``: the highest id ever handed out of a table whose rows are deleted (``models``),
  so SQLite (which reuses the highest rowid after a delete) never hands a deleted model's id to
  the next upload. Not ``AUTOINCREMENT`` by a table rebuild: dropping ``models`` in a batch
  migration with foreign keys on would cascade into its tasks and jobs. PostgreSQL sequences
  never reuse ids; the floor is kept there too.

Revision ID: 0006_trust
Revises: 0005_job_search
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_trust"
down_revision = "0005_job_search"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tuning_records") as batch:
        batch.add_column(
            sa.Column("quarantined", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    with op.batch_alter_table("workers") as batch:
        batch.add_column(
            sa.Column(
                "token_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True
            )
        )
        batch.add_column(sa.Column("instance", sa.String(64), nullable=True))
    op.create_table(
        "id_floors",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("last_id", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("id_floors")
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("instance")
        batch.drop_column("token_id")
    with op.batch_alter_table("tuning_records") as batch:
        batch.drop_column("quarantined")
