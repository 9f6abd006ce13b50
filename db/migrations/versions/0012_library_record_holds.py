"""Held library records (issue 31): a library record can be stored *held*, like a tuning record.

- ``library_records.quarantined``: held as implausible (faster than a physical limit of its
  task, :mod:`tuner.jobs.plausibility`); no best-library-record query uses it. ``held_reason``: why,
  in a sentence (``NULL`` when not held).

Rows stored before this revision are checked against the limits SQL can apply alone: a median
below the least time of any kernel call on the target's kind (1e-9 s on CPU, 1e-7 s on CUDA and
other kinds 1e-9 s), or implying more FLOP/s than the kind's ceiling (50e12 on CPU, 2e15
otherwise), is held. (The memory-bandwidth limit needs the workload's TIR: it applies to what
is stored from now on.)

Revision ID: 0012_library_record_holds
Revises: 0011_one_lease_per_worker
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_library_record_holds"
down_revision = "0011_one_lease_per_worker"
branch_labels = None
depends_on = None

#: The limits as they were when this revision was written (a migration never changes).
_MIN_CALL_SECS = {"cuda": 1e-7}
_DEFAULT_MIN_CALL_SECS = 1e-9
_PEAK_FLOPS = {"cpu": 50e12}
_DEFAULT_PEAK_FLOPS = 2e15


def _hold_implausible() -> None:
    lib = sa.table(
        "library_records",
        sa.column("id"),
        sa.column("workload_id"),
        sa.column("target_id"),
        sa.column("median_secs"),
        sa.column("quarantined", sa.Boolean),
        sa.column("held_reason"),
    )
    targets = sa.table("targets", sa.column("id"), sa.column("kind"))
    workloads = sa.table("workloads", sa.column("id"), sa.column("flops"))
    kind = sa.select(targets.c.kind).where(targets.c.id == lib.c.target_id).scalar_subquery()
    flops = (
        sa.select(workloads.c.flops).where(workloads.c.id == lib.c.workload_id).scalar_subquery()
    )
    floor = sa.case(
        *((kind == k, sa.literal(v, sa.Float)) for k, v in _MIN_CALL_SECS.items()),
        else_=sa.literal(_DEFAULT_MIN_CALL_SECS, sa.Float),
    )
    peak = sa.case(
        *((kind == k, sa.literal(v, sa.Float)) for k, v in _PEAK_FLOPS.items()),
        else_=sa.literal(_DEFAULT_PEAK_FLOPS, sa.Float),
    )
    op.get_bind().execute(
        lib.update()
        .where(
            lib.c.quarantined == sa.false(),
            sa.or_(
                lib.c.median_secs < floor,
                lib.c.median_secs * peak < sa.func.coalesce(flops, 0.0),
            ),
        )
        .values(
            quarantined=sa.true(),
            held_reason="held by migration 0012: faster than the least time of any kernel "
            "call or than the target's FLOP/s ceiling allows",
        )
    )


def upgrade() -> None:
    with op.batch_alter_table("library_records") as batch:
        batch.add_column(
            sa.Column("quarantined", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("held_reason", sa.String(512), nullable=True))
    _hold_implausible()


def downgrade() -> None:
    with op.batch_alter_table("library_records") as batch:
        batch.drop_column("held_reason")
        batch.drop_column("quarantined")
