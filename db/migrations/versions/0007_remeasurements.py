"""Noise-proof winners (issue 19): re-measurements of a task's top records before a final build.

``remeasurements``: one row per record measured again side by side with its task's other top
records (:mod:`tuner.final_build.remeasure`): the mean run time of each round (``rounds_json``),
their median and relative spread, whether the build chose it, the job and worker. A record's own
measurement is never changed by one (keep-the-better stays the only rule for ``tuning_records``).

Revision ID: 0007_remeasurements
Revises: 0006_trust
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_remeasurements"
down_revision = "0006_trust"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "remeasurements",
        sa.Column("id", _ID, primary_key=True),
        sa.Column(
            "record_id", _ID, sa.ForeignKey("tuning_records.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("job_id", _ID, sa.ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True),
        sa.Column("worker", sa.String(128), nullable=True),
        sa.Column("rounds_json", sa.Text(), nullable=False),
        sa.Column("median_secs", sa.Float(), nullable=False),
        sa.Column("spread", sa.Float(), nullable=False),
        sa.Column("chosen", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column(
            "measured_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )
    op.create_index("ix_remeasurements_record", "remeasurements", ["record_id"])
    op.create_index("ix_remeasurements_job", "remeasurements", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_remeasurements_job", "remeasurements")
    op.drop_index("ix_remeasurements_record", "remeasurements")
    op.drop_table("remeasurements")
