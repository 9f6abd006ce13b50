"""Re-measurements on SQL (:mod:`db.contracts.remeasurements`)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import func, select

from db.contracts.remeasurements import RemeasurementStorage
from db.models import RemeasurementRow
from db.sql.base import SQLBase, utc
from db.types import NewRemeasurement, Remeasurement, dumps_compact


def _frozen(row: RemeasurementRow) -> Remeasurement:
    return Remeasurement(
        id=row.id,
        record_id=row.record_id,
        rounds_secs=tuple(json.loads(row.rounds_json)),
        median_secs=row.median_secs,
        spread=row.spread,
        chosen=bool(row.chosen),
        job_id=row.job_id,
        worker=row.worker,
        measured_at=utc(row.measured_at),
    )


class RemeasurementSQL(SQLBase, RemeasurementStorage):
    """:class:`RemeasurementStorage` on SQL."""

    def add_remeasurements(self, items: Sequence[NewRemeasurement]) -> None:
        if not items:
            return
        with self._session(write=True) as session:
            session.add_all(
                RemeasurementRow(
                    record_id=item.record_id,
                    job_id=item.job_id,
                    worker=item.worker,
                    rounds_json=dumps_compact(list(item.rounds_secs)),
                    median_secs=item.median_secs,
                    spread=item.spread,
                    chosen=item.chosen,
                )
                for item in items
            )

    def list_remeasurements(
        self,
        *,
        job_id: int | None = None,
        record_ids: Sequence[int] | None = None,
        latest: int | None = None,
    ) -> list[Remeasurement]:
        where = []
        if job_id is not None:
            where.append(RemeasurementRow.job_id == job_id)
        if record_ids is not None:
            where.append(RemeasurementRow.record_id.in_(list(record_ids)))
        stmt = select(RemeasurementRow).where(*where)
        if latest is not None:
            if latest <= 0:
                return []
            rank = (
                func.row_number()
                .over(
                    partition_by=RemeasurementRow.record_id,
                    order_by=RemeasurementRow.id.desc(),
                )
                .label("rank")
            )
            ranked = select(RemeasurementRow.id, rank).where(*where).subquery()
            stmt = stmt.where(
                RemeasurementRow.id.in_(select(ranked.c.id).where(ranked.c.rank <= int(latest)))
            )
        with self._session() as session:
            return [_frozen(row) for row in session.scalars(stmt.order_by(RemeasurementRow.id))]
