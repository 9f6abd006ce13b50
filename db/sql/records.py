"""Tuning records on SQL: bulk commits with the keep-the-better rule, top-k, lookups and pages.

Hot paths (record commits, top-k) use Core statements on the ORM table, built once per storage
object. Duplicates are resolved in the database with
``INSERT ... ON CONFLICT (workload_id, target_id, trace_hash) DO UPDATE ... WHERE <better>``,
which both backends support, so concurrent writers need no application-level locking.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import Engine, and_, bindparam, func, not_, or_, select

from db.contracts.records import RecordStorage
from db.errors import StorageUnavailableError
from db.models import TuningRecordModel
from db.sql.base import SQLBase, utc
from db.types import NewTuningRecord, TuningRecordRow, dumps_compact, measurement

REC = TuningRecordModel.__table__
REC_KEY = ("workload_id", "target_id", "trace_hash")
#: ``= true`` (not ``IS true``): PostgreSQL only uses the top-k index for an equality.
_VALID = REC.c.is_valid == True  # noqa: E712
RECORD_COLUMNS = (
    REC.c.id,
    REC.c.workload_id,
    REC.c.target_id,
    REC.c.trace_hash,
    REC.c.trace_json,
    REC.c.run_secs_json,
    REC.c.mean_secs,
    REC.c.is_valid,
    REC.c.args_info_json,
    REC.c.error_text,
    REC.c.measured_at,
    REC.c.worker,
    REC.c.job_id,
    REC.c.quarantined,
)


def record_row(row: Any) -> TuningRecordRow:
    run_secs = json.loads(row.run_secs_json)
    return TuningRecordRow(
        id=row.id,
        workload_id=row.workload_id,
        target_id=row.target_id,
        trace_hash=row.trace_hash,
        trace_json=row.trace_json,
        run_secs=None if run_secs is None else tuple(run_secs),
        mean_secs=row.mean_secs,
        is_valid=bool(row.is_valid),
        args_info_json=row.args_info_json,
        error_text=row.error_text,
        measured_at=utc(row.measured_at),
        worker=row.worker,
        job_id=row.job_id,
        quarantined=bool(row.quarantined),
    )


def _better(new: dict, old: dict) -> bool:
    """The keep-the-better rule (:mod:`db.contracts.records`) on two rows of one batch."""
    if new["is_valid"] != old["is_valid"]:
        return new["is_valid"]
    if new["is_valid"]:
        return new["mean_secs"] < old["mean_secs"]
    return old["error_text"] is None and new["error_text"] is not None


class RecordSQL(SQLBase, RecordStorage):
    """The tuning-records part of :class:`RecordStorage`."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        # Hot statements are built once: SQLAlchemy then reuses their compiled form.
        self._upsert_record = self._build_upsert()
        self._top_k = (
            select(*RECORD_COLUMNS)
            .where(
                REC.c.workload_id == bindparam("workload_id"),
                REC.c.target_id == bindparam("target_id"),
                _VALID,
            )
            .order_by(REC.c.mean_secs, REC.c.id)
            .limit(bindparam("k"))
        )
        self._top_k_ids = (
            select(REC.c.id, REC.c.mean_secs)
            .where(
                REC.c.workload_id == bindparam("workload_id"),
                REC.c.target_id == bindparam("target_id"),
                _VALID,
            )
            .order_by(REC.c.mean_secs, REC.c.id)
            .limit(bindparam("k"))
        )

    def _build_upsert(self):
        """``INSERT ... ON CONFLICT DO UPDATE ... WHERE <better>``: the keep-the-better rule."""
        stmt = self._insert(REC)
        new, old = stmt.excluded, REC.c
        improves = or_(
            and_(new.is_valid, not_(old.is_valid)),
            and_(new.is_valid, old.is_valid, new.mean_secs < old.mean_secs),
            and_(
                not_(new.is_valid),
                not_(old.is_valid),
                old.error_text.is_(None),
                new.error_text.is_not(None),
            ),
        )
        return stmt.on_conflict_do_update(
            index_elements=list(REC_KEY),
            set_={
                "run_secs_json": new.run_secs_json,
                "mean_secs": new.mean_secs,
                "is_valid": new.is_valid,
                "error_text": new.error_text,
                "args_info_json": new.args_info_json,
                "measured_at": func.now(),
                "worker": new.worker,
                "job_id": new.job_id,
                "quarantined": new.quarantined,
            },
            where=improves,
        )

    # -- tuning records ----------------------------------------------------------------------
    def commit_records(self, records: Sequence[NewTuningRecord]) -> None:
        if not records:
            return
        best: dict[tuple, dict] = {}
        for rec in records:
            is_valid, mean = measurement(rec.run_secs)
            if rec.quarantined:  # held: never a best record; the claimed times are kept
                is_valid, mean = False, None
            row = {
                "workload_id": rec.workload_id,
                "target_id": rec.target_id,
                "trace_hash": rec.trace_hash,
                "trace_json": rec.trace_json,
                "run_secs_json": dumps_compact(
                    None if rec.run_secs is None else list(rec.run_secs)
                ),
                "mean_secs": mean,
                "is_valid": is_valid,
                "error_text": rec.error_text,
                "args_info_json": rec.args_info_json,
                "worker": rec.worker,
                "job_id": rec.job_id,
                "quarantined": bool(rec.quarantined),
            }
            key = (rec.workload_id, rec.target_id, rec.trace_hash)
            old = best.get(key)
            if old is None or _better(row, old):
                best[key] = row
        # One lock order for every writer: concurrent batches never deadlock on PostgreSQL.
        rows = [best[key] for key in sorted(best)]
        for attempt in range(3):
            try:
                with self._connection(write=True) as conn:
                    conn.execute(self._upsert_record, rows)
                return
            except StorageUnavailableError as err:  # pragma: no cover - timing dependent
                if "deadlock" not in str(err).lower() or attempt == 2:
                    raise

    def top_k(self, workload_id: int, target_id: int, k: int) -> list[TuningRecordRow]:
        if k <= 0:
            return []
        params = {"workload_id": workload_id, "target_id": target_id, "k": int(k)}
        with self._connection() as conn:
            return [record_row(r) for r in conn.execute(self._top_k, params)]

    def top_k_ids(self, workload_id: int, target_id: int, k: int) -> list[tuple[int, float]]:
        if k <= 0:
            return []
        params = {"workload_id": workload_id, "target_id": target_id, "k": int(k)}
        with self._connection() as conn:
            return [(r[0], r[1]) for r in conn.execute(self._top_k_ids, params)]

    def get_records(self, ids: Sequence[int]) -> list[TuningRecordRow]:
        out: list[TuningRecordRow] = []
        ids = list(ids)
        for start in range(0, len(ids), 500):
            stmt = select(*RECORD_COLUMNS).where(REC.c.id.in_(ids[start : start + 500]))
            with self._connection() as conn:
                out.extend(record_row(r) for r in conn.execute(stmt))
        return out

    def get_record(
        self, workload_id: int, target_id: int, trace_hash: str
    ) -> TuningRecordRow | None:
        stmt = select(*RECORD_COLUMNS).where(
            REC.c.workload_id == workload_id,
            REC.c.target_id == target_id,
            REC.c.trace_hash == trace_hash,
        )
        with self._connection() as conn:
            row = conn.execute(stmt).one_or_none()
            return None if row is None else record_row(row)

    def _record_filter(self, target_id, workload_id, valid, job_id=None) -> list:
        where = []
        if job_id is not None:
            where.append(REC.c.job_id == job_id)
        if target_id is not None:
            where.append(REC.c.target_id == target_id)
        if workload_id is not None:
            where.append(REC.c.workload_id == workload_id)
        if valid is not None:
            where.append(REC.c.is_valid.is_(bool(valid)))
        return where

    def iter_records(
        self,
        *,
        target_id: int | None = None,
        workload_id: int | None = None,
        valid_only: bool = False,
        batch_size: int = 1000,
    ) -> Iterator[TuningRecordRow]:
        where = self._record_filter(target_id, workload_id, True if valid_only else None)
        after = 0
        while True:
            stmt = (
                select(*RECORD_COLUMNS)
                .where(*where, REC.c.id > after)
                .order_by(REC.c.id)
                .limit(batch_size)
            )
            with self._connection() as conn:
                batch = [record_row(r) for r in conn.execute(stmt)]
            yield from batch
            if len(batch) < batch_size:
                return
            after = batch[-1].id

    def count_records(
        self,
        *,
        target_id: int | None = None,
        workload_id: int | None = None,
        valid: bool | None = None,
        job_id: int | None = None,
        measured_within_secs: float | None = None,
    ) -> int:
        stmt = select(func.count()).select_from(REC)
        stmt = stmt.where(*self._record_filter(target_id, workload_id, valid, job_id))
        if measured_within_secs is not None:
            stmt = stmt.where(REC.c.measured_at >= self._db_now_plus(-measured_within_secs))
        with self._connection() as conn:
            return int(conn.execute(stmt).scalar_one())

    def list_records(
        self,
        *,
        target_id: int | None = None,
        workload_id: int | None = None,
        job_id: int | None = None,
        valid: bool | None = None,
        after_id: int = 0,
        limit: int = 100,
    ) -> list[TuningRecordRow]:
        where = self._record_filter(target_id, workload_id, valid, job_id)
        stmt = (
            select(*RECORD_COLUMNS)
            .where(*where, REC.c.id > after_id)
            .order_by(REC.c.id)
            .limit(max(0, int(limit)))
        )
        with self._connection() as conn:
            return [record_row(r) for r in conn.execute(stmt)]

    # -- quarantine --------------------------------------------------------------------------
    def _selection(self, worker, job_id, record_ids) -> list:
        where = []
        if worker is not None:
            where.append(REC.c.worker == worker)
        if job_id is not None:
            where.append(REC.c.job_id == job_id)
        if record_ids is not None:
            where.append(REC.c.id.in_([int(i) for i in record_ids]))
        if not where:
            raise ValueError("name a worker, a job or record ids")
        return where

    def quarantine_records(
        self,
        *,
        worker: str | None = None,
        job_id: int | None = None,
        record_ids: Sequence[int] | None = None,
        reason: str = "quarantined",
    ) -> int:
        where = self._selection(worker, job_id, record_ids)
        stmt = (
            REC.update()
            .where(*where, REC.c.quarantined == False)  # noqa: E712
            .values(
                quarantined=True,
                is_valid=False,
                mean_secs=None,
                error_text=f"quarantined: {reason}"[:20_000],
            )
        )
        with self._connection(write=True) as conn:
            return int(conn.execute(stmt).rowcount)

    def delete_records(
        self,
        *,
        worker: str | None = None,
        job_id: int | None = None,
        record_ids: Sequence[int] | None = None,
    ) -> int:
        stmt = REC.delete().where(*self._selection(worker, job_id, record_ids))
        with self._connection(write=True) as conn:
            return int(conn.execute(stmt).rowcount)
