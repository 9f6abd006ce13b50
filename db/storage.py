"""The SQL implementation of :class:`db.base.TuningStorage` (SQLite and PostgreSQL).

Hot paths (record commits, top-k) use Core statements on the ORM tables; everything returns the
frozen dataclasses of :mod:`db.types`. Duplicates are resolved in the database with
``INSERT ... ON CONFLICT (workload_id, target_id, trace_hash) DO UPDATE ... WHERE <better>``,
which both backends support, so concurrent writers need no application-level locking.
"""
from __future__ import annotations

import dataclasses
import json
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Engine, and_, bindparam, case, func, not_, or_, select, true as true_, update
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect

from db.base import TuningStorage
from db.engine import connection_scope, create_storage_engine, display_url, session_scope
from db.errors import (
    ConflictError,
    SchemaOutdatedError,
    InvalidTransitionError,
    NotFoundError,
    StorageError,
    StorageUnavailableError,
)
from db.models import (
    ApiTokenRow,
    ArtifactRow,
    CostModelRow,
    JobRow,
    JobTaskRow,
    ModelRow,
    ModelWorkloadRow,
    TargetRow,
    TaskLeaseRow,
    TuningRecordModel,
    WorkerRow,
    WorkloadRow,
)
from db.types import (
    TOKEN_KINDS,
    WORKER_STATUSES,
    ApiToken,
    Artifact,
    CostModelBlob,
    DatabaseStats,
    HistoryPoint,
    Job,
    JobHistoryPage,
    JobProgress,
    JobStatus,
    JobTask,
    LeaseBatchResult,
    LeaseStatus,
    ModelRecord,
    ModelWorkload,
    NewJobTask,
    NewTuningRecord,
    TargetRecord,
    TargetStats,
    TaskLease,
    TuningRecordRow,
    Worker,
    WorkloadRecord,
    WorkloadSummary,
    dumps_compact,
    measurement,
)

if TYPE_CHECKING:  # pragma: no cover
    from compiler.target import TargetSpec

T = TypeVar("T")
_REC = TuningRecordModel.__table__
_REC_KEY = ("workload_id", "target_id", "trace_hash")
#: ``= true`` (not ``IS true``): PostgreSQL only uses the top-k index for an equality.
_VALID = _REC.c.is_valid == True  # noqa: E712
_RECORD_COLUMNS = (
    _REC.c.id,
    _REC.c.workload_id,
    _REC.c.target_id,
    _REC.c.trace_hash,
    _REC.c.trace_json,
    _REC.c.run_secs_json,
    _REC.c.mean_secs,
    _REC.c.is_valid,
    _REC.c.args_info_json,
    _REC.c.error_text,
    _REC.c.measured_at,
    _REC.c.worker,
    _REC.c.job_id,
)


def _utc(value: Any) -> Any:
    """SQLite hands back naive datetimes (stored in UTC); make every datetime aware."""
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def _frozen(cls: type[T], row: Any) -> T:
    """Build the dataclass ``cls`` from an ORM row or a Core row with matching names."""
    getter = row._mapping.__getitem__ if hasattr(row, "_mapping") else row.__getattribute__
    return cls(**{f.name: _utc(getter(f.name)) for f in dataclasses.fields(cls)})


def _record_row(row: Any) -> TuningRecordRow:
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
        measured_at=_utc(row.measured_at),
        worker=row.worker,
        job_id=row.job_id,
    )


def _job_task_row(job_id: int, task: NewJobTask) -> JobTaskRow:
    """The ORM row of a new job task (one place, for ``add_job_tasks`` and job starts)."""
    return JobTaskRow(
        job_id=job_id,
        workload_id=task.workload_id,
        name=task.name,
        weight=task.weight,
        flops=task.flops,
        trial_budget=task.trial_budget,
        status=task.status,
        best_mean_secs=task.best_mean_secs,
    )


def _better(new: dict, old: dict) -> bool:
    """The keep-the-better rule (see :mod:`db.base`) applied to two rows of one batch."""
    if new["is_valid"] != old["is_valid"]:
        return new["is_valid"]
    if new["is_valid"]:
        return new["mean_secs"] < old["mean_secs"]
    return old["error_text"] is None and new["error_text"] is not None


class SQLStorage(TuningStorage):
    """:class:`TuningStorage` on SQLAlchemy: one engine per object, one session per call.

    Build it with :func:`db.open_storage`, which also checks the schema version.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._dialect = engine.dialect.name
        self._lock = threading.Lock()
        self._target_cache: dict[str, TargetRecord] = {}
        self._workload_id_cache: dict[str, int] = {}
        # Hot statements are built once: SQLAlchemy then reuses their compiled form.
        self._upsert_record = self._build_upsert()
        self._top_k = (
            select(*_RECORD_COLUMNS)
            .where(
                _REC.c.workload_id == bindparam("workload_id"),
                _REC.c.target_id == bindparam("target_id"),
                _VALID,
            )
            .order_by(_REC.c.mean_secs, _REC.c.id)
            .limit(bindparam("k"))
        )
        self._top_k_ids = (
            select(_REC.c.id, _REC.c.mean_secs)
            .where(
                _REC.c.workload_id == bindparam("workload_id"),
                _REC.c.target_id == bindparam("target_id"),
                _VALID,
            )
            .order_by(_REC.c.mean_secs, _REC.c.id)
            .limit(bindparam("k"))
        )

    @classmethod
    def from_url(cls, url: str) -> SQLStorage:
        """An unchecked storage for ``url`` (prefer :func:`db.open_storage`)."""
        return cls(create_storage_engine(url))

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def url(self) -> str:
        return display_url(self._engine.url)

    @property
    def dialect(self) -> str:
        return self._dialect

    def close(self) -> None:
        self._engine.dispose()

    def _session(self, *, write: bool = False):
        return session_scope(self._engine, write=write)

    def _connection(self, *, write: bool = False):
        return connection_scope(self._engine, write=write)

    def _build_upsert(self):
        """``INSERT ... ON CONFLICT DO UPDATE ... WHERE <better>``: the keep-the-better rule."""
        stmt = self._insert(_REC)
        new, old = stmt.excluded, _REC.c
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
            index_elements=list(_REC_KEY),
            set_={
                "run_secs_json": new.run_secs_json,
                "mean_secs": new.mean_secs,
                "is_valid": new.is_valid,
                "error_text": new.error_text,
                "args_info_json": new.args_info_json,
                "measured_at": func.now(),
                "worker": new.worker,
                "job_id": new.job_id,
            },
            where=improves,
        )

    def _insert(self, table: Any):
        module = pg_dialect if self._dialect == "postgresql" else sqlite_dialect
        return module.insert(table)

    # -- targets -----------------------------------------------------------------------------
    def ensure_target(self, spec: TargetSpec) -> TargetRecord:
        cached = self._target_cache.get(spec.key)
        if cached is not None:
            return cached
        stmt = self._insert(TargetRow.__table__).values(
            key=spec.key,
            kind=spec.kind,
            target_json=spec.target_json,
            fingerprint_json=spec.fingerprint_json,
            tvm_version=spec.tvm_version,
        )
        with self._session(write=True) as session:
            session.execute(stmt.on_conflict_do_nothing(index_elements=["key"]))
            row = session.scalars(select(TargetRow).where(TargetRow.key == spec.key)).one()
            record = _frozen(TargetRecord, row)
        with self._lock:
            self._target_cache[record.key] = record
        return record

    def get_target(self, key: str) -> TargetRecord | None:
        cached = self._target_cache.get(key)
        if cached is not None:
            return cached
        with self._session() as session:
            row = session.scalars(select(TargetRow).where(TargetRow.key == key)).one_or_none()
            return None if row is None else _frozen(TargetRecord, row)

    def get_target_by_id(self, target_id: int) -> TargetRecord | None:
        with self._session() as session:
            row = session.get(TargetRow, target_id)
            return None if row is None else _frozen(TargetRecord, row)

    def list_targets(self) -> list[TargetRecord]:
        with self._session() as session:
            rows = session.scalars(select(TargetRow).order_by(TargetRow.id))
            return [_frozen(TargetRecord, r) for r in rows]

    # -- workloads ---------------------------------------------------------------------------
    def ensure_workload(
        self, key: str, mod_json: str, *, flops: float | None = None, summary: str = ""
    ) -> WorkloadRecord:
        stmt = self._insert(WorkloadRow.__table__).values(
            key=key, mod_json=mod_json, flops=flops, summary=summary
        )
        with self._session(write=True) as session:
            session.execute(stmt.on_conflict_do_nothing(index_elements=["key"]))
            row = session.scalars(select(WorkloadRow).where(WorkloadRow.key == key)).one()
            record = _frozen(WorkloadRecord, row)
        with self._lock:
            self._workload_id_cache[key] = record.id
        return record

    def get_workload(self, key: str) -> WorkloadRecord | None:
        with self._session() as session:
            row = session.scalars(select(WorkloadRow).where(WorkloadRow.key == key)).one_or_none()
            return None if row is None else _frozen(WorkloadRecord, row)

    def get_workload_by_id(self, workload_id: int) -> WorkloadRecord | None:
        with self._session() as session:
            row = session.get(WorkloadRow, workload_id)
            return None if row is None else _frozen(WorkloadRecord, row)

    def workload_ids(self, keys: Sequence[str]) -> dict[str, int]:
        found = {k: self._workload_id_cache[k] for k in keys if k in self._workload_id_cache}
        missing = [k for k in set(keys) if k not in found]
        for start in range(0, len(missing), 500):
            chunk = missing[start : start + 500]
            with self._connection() as conn:
                rows = conn.execute(
                    select(WorkloadRow.key, WorkloadRow.id).where(WorkloadRow.key.in_(chunk))
                )
                found.update({key: wid for key, wid in rows})
        with self._lock:
            self._workload_id_cache.update(found)
        return found

    def list_workloads(self, *, target_id: int | None = None) -> list[WorkloadRecord]:
        stmt = select(WorkloadRow).order_by(WorkloadRow.id)
        if target_id is not None:
            has_records = (
                select(_REC.c.id)
                .where(_REC.c.workload_id == WorkloadRow.id, _REC.c.target_id == target_id)
                .exists()
            )
            stmt = stmt.where(has_records)
        with self._session() as session:
            return [_frozen(WorkloadRecord, r) for r in session.scalars(stmt)]

    # -- tuning records ----------------------------------------------------------------------
    def commit_records(self, records: Sequence[NewTuningRecord]) -> None:
        if not records:
            return
        best: dict[tuple, dict] = {}
        for rec in records:
            is_valid, mean = measurement(rec.run_secs)
            row = {
                "workload_id": rec.workload_id,
                "target_id": rec.target_id,
                "trace_hash": rec.trace_hash,
                "trace_json": rec.trace_json,
                "run_secs_json": dumps_compact(None if rec.run_secs is None else list(rec.run_secs)),
                "mean_secs": mean,
                "is_valid": is_valid,
                "error_text": rec.error_text,
                "args_info_json": rec.args_info_json,
                "worker": rec.worker,
                "job_id": rec.job_id,
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
            return [_record_row(r) for r in conn.execute(self._top_k, params)]

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
            stmt = select(*_RECORD_COLUMNS).where(_REC.c.id.in_(ids[start : start + 500]))
            with self._connection() as conn:
                out.extend(_record_row(r) for r in conn.execute(stmt))
        return out

    def get_record(
        self, workload_id: int, target_id: int, trace_hash: str
    ) -> TuningRecordRow | None:
        stmt = select(*_RECORD_COLUMNS).where(
            _REC.c.workload_id == workload_id,
            _REC.c.target_id == target_id,
            _REC.c.trace_hash == trace_hash,
        )
        with self._connection() as conn:
            row = conn.execute(stmt).one_or_none()
            return None if row is None else _record_row(row)

    def _record_filter(self, target_id, workload_id, valid, job_id=None) -> list:
        where = []
        if job_id is not None:
            where.append(_REC.c.job_id == job_id)
        if target_id is not None:
            where.append(_REC.c.target_id == target_id)
        if workload_id is not None:
            where.append(_REC.c.workload_id == workload_id)
        if valid is not None:
            where.append(_REC.c.is_valid.is_(bool(valid)))
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
                select(*_RECORD_COLUMNS)
                .where(*where, _REC.c.id > after)
                .order_by(_REC.c.id)
                .limit(batch_size)
            )
            with self._connection() as conn:
                batch = [_record_row(r) for r in conn.execute(stmt)]
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
        stmt = select(func.count()).select_from(_REC)
        stmt = stmt.where(*self._record_filter(target_id, workload_id, valid, job_id))
        if measured_within_secs is not None:
            stmt = stmt.where(_REC.c.measured_at >= self._db_now_plus(-measured_within_secs))
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
            select(*_RECORD_COLUMNS)
            .where(*where, _REC.c.id > after_id)
            .order_by(_REC.c.id)
            .limit(max(0, int(limit)))
        )
        with self._connection() as conn:
            return [_record_row(r) for r in conn.execute(stmt)]

    def job_history(self, job_id: int, *, after_id: int = 0, limit: int = 100_000) -> JobHistoryPage:
        # One index-only range scan of three numbers per record; the running best per workload
        # is kept here (faster on SQLite than a window function, which sorts the page by
        # workload). Timestamps are read only for the improvements and the page's ends.
        rec = _REC.c
        scan = (
            select(rec.id, rec.workload_id, rec.mean_secs)
            .where(rec.job_id == job_id, rec.id > after_id)
            .order_by(rec.id)
            .limit(max(0, int(limit)))
        )
        best: dict[int, float] = {}
        improved: list[tuple[int, int, int, float]] = []  # id, trial, workload, mean
        count = failed = 0
        first_id = last_id = after_id
        with self._connection() as conn:
            before = 0
            if after_id > 0:
                before = int(conn.execute(
                    select(func.count())
                    .select_from(_REC)
                    .where(rec.job_id == job_id, rec.id <= after_id)
                ).scalar_one())
            for last_id, workload_id, mean in conn.execute(scan):
                count += 1
                if count == 1:
                    first_id = last_id
                if mean is None:
                    failed += 1
                elif mean < best.get(workload_id, math.inf):
                    best[workload_id] = mean
                    improved.append((last_id, before + count, workload_id, mean))
            more = count > 0 and conn.execute(
                select(rec.id).where(rec.job_id == job_id, rec.id > last_id).limit(1)
            ).first() is not None
            wanted = sorted({first_id, last_id, *(p[0] for p in improved)}) if count else []
            times: dict[int, datetime] = {}
            for chunk in range(0, len(wanted), 500):
                ids = wanted[chunk:chunk + 500]
                stmt = select(rec.id, rec.measured_at).where(rec.id.in_(ids))
                times.update((row.id, row.measured_at) for row in conn.execute(stmt))
        return JobHistoryPage(
            job_id=job_id,
            after_id=after_id,
            last_id=last_id,
            trials_before=before,
            records=count,
            failed=failed,
            more=more,
            first_measured_at=_utc(times.get(first_id)) if count else None,
            last_measured_at=_utc(times.get(last_id)) if count else None,
            points=tuple(
                HistoryPoint(
                    id=record_id, trial=trial, workload_id=workload_id, mean_secs=mean,
                    measured_at=_utc(times.get(record_id)),
                )
                for record_id, trial, workload_id, mean in improved
            ),
        )

    def browse_workloads(
        self,
        *,
        target_id: int | None = None,
        model_id: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> tuple[list[WorkloadSummary], int]:
        per_record = (
            select(
                _REC.c.workload_id.label("workload_id"),
                func.sum(case((_REC.c.is_valid.is_(True), 1), else_=0)).label("valid"),
                func.sum(case((_REC.c.is_valid.is_(True), 0), else_=1)).label("failed"),
                func.min(_REC.c.mean_secs).label("best"),
            )
            .where(*([_REC.c.target_id == target_id] if target_id is not None else []))
            .group_by(_REC.c.workload_id)
            .subquery()
        )
        filters = []
        if target_id is not None:
            filters.append(per_record.c.workload_id.is_not(None))
        if model_id is not None:
            filters.append(
                select(ModelWorkloadRow.id)
                .where(
                    ModelWorkloadRow.workload_id == WorkloadRow.id,
                    ModelWorkloadRow.model_id == model_id,
                )
                .exists()
            )
        base = (
            select(
                WorkloadRow.id,
                WorkloadRow.key,
                WorkloadRow.summary,
                WorkloadRow.flops,
                per_record.c.valid,
                per_record.c.failed,
                per_record.c.best,
            )
            .select_from(WorkloadRow)
            .outerjoin(per_record, per_record.c.workload_id == WorkloadRow.id)
            .where(*filters)
        )
        page = base.order_by(WorkloadRow.id).limit(max(0, int(limit))).offset(max(0, int(offset)))
        total = select(func.count()).select_from(base.subquery())
        with self._connection() as conn:
            rows = [
                WorkloadSummary(
                    id=r.id,
                    key=r.key,
                    summary=r.summary,
                    flops=r.flops,
                    records_valid=int(r.valid or 0),
                    records_failed=int(r.failed or 0),
                    best_mean_secs=r.best,
                )
                for r in conn.execute(page)
            ]
            return rows, int(conn.execute(total).scalar_one())

    def tuned_workload_keys(
        self, target_id: int, keys: Sequence[str], *, exclude_job_id: int | None = None
    ) -> set[str]:
        if not keys:
            return set()
        stmt = (
            select(WorkloadRow.key)
            .join(JobTaskRow, JobTaskRow.workload_id == WorkloadRow.id)
            .join(JobRow, JobRow.id == JobTaskRow.job_id)
            .where(
                JobRow.target_id == target_id,
                JobTaskRow.status == JobStatus.SUCCEEDED,
                WorkloadRow.key.in_(list(keys)),
            )
            .distinct()
        )
        if exclude_job_id is not None:
            stmt = stmt.where(JobRow.id != exclude_job_id)
        with self._session() as session:
            return {row[0] for row in session.execute(stmt)}

    def stats(self) -> DatabaseStats:
        from db.schema import current_revision  # noqa: PLC0415

        def count(model) -> Any:
            return select(func.count()).select_from(model)

        with self._session() as session:
            workloads = session.execute(count(WorkloadRow)).scalar_one()
            models = session.execute(count(ModelRow)).scalar_one()
            jobs = session.execute(count(JobRow)).scalar_one()
            targets = {r.id: _frozen(TargetRecord, r) for r in session.scalars(select(TargetRow))}
            per = session.execute(
                select(
                    _REC.c.target_id,
                    func.sum(case((_REC.c.is_valid.is_(True), 1), else_=0)),
                    func.sum(case((_REC.c.is_valid.is_(True), 0), else_=1)),
                    func.count(func.distinct(_REC.c.workload_id)),
                ).group_by(_REC.c.target_id)
            ).all()
        by_target = {tid: (int(v or 0), int(f or 0), int(w)) for tid, v, f, w in per}
        per_target = tuple(
            TargetStats(t, *by_target.get(tid, (0, 0, 0))) for tid, t in sorted(targets.items())
        )
        return DatabaseStats(
            url=self.url,
            schema_revision=current_revision(self._engine),
            workloads=int(workloads),
            targets=len(targets),
            records_valid=sum(v for v, _, _ in by_target.values()),
            records_failed=sum(f for _, f, _ in by_target.values()),
            models=int(models),
            jobs=int(jobs),
            per_target=per_target,
        )

    # -- models ------------------------------------------------------------------------------
    def add_model(
        self, *, content_hash: str, format: str, filename: str, size: int, owner: str
    ) -> ModelRecord:
        stmt = self._insert(ModelRow.__table__).values(
            content_hash=content_hash, format=format, filename=filename, size=size, owner=owner
        )
        with self._session(write=True) as session:
            session.execute(stmt.on_conflict_do_nothing(index_elements=["owner", "content_hash"]))
            row = session.scalars(
                select(ModelRow).where(
                    ModelRow.owner == owner, ModelRow.content_hash == content_hash
                )
            ).one()
            return _frozen(ModelRecord, row)

    def get_model(self, model_id: int) -> ModelRecord | None:
        with self._session() as session:
            row = session.get(ModelRow, model_id)
            return None if row is None else _frozen(ModelRecord, row)

    def list_models(self, *, owner: str | None = None) -> list[ModelRecord]:
        stmt = select(ModelRow).order_by(ModelRow.id.desc())
        if owner is not None:
            stmt = stmt.where(ModelRow.owner == owner)
        with self._session() as session:
            return [_frozen(ModelRecord, r) for r in session.scalars(stmt)]

    def find_model(self, *, owner: str, content_hash: str) -> ModelRecord | None:
        stmt = select(ModelRow).where(
            ModelRow.owner == owner, ModelRow.content_hash == content_hash
        )
        with self._session() as session:
            row = session.scalars(stmt).one_or_none()
            return None if row is None else _frozen(ModelRecord, row)

    def delete_model(self, model_id: int) -> ModelRecord:
        active = (JobStatus.QUEUED, JobStatus.RUNNING)
        with self._session(write=True) as session:
            row = session.get(ModelRow, model_id)
            if row is None:
                raise NotFoundError(f"model {model_id} does not exist")
            busy = session.execute(
                select(JobRow.id).where(JobRow.model_id == model_id, JobRow.status.in_(active))
            ).first()
            if busy is not None:
                raise ConflictError(f"model {model_id} is used by job {busy[0]}, which is not finished")
            record = _frozen(ModelRecord, row)
            # Explicit rather than relying on ON DELETE (SQLite batch migrations may lose it).
            session.execute(
                ModelWorkloadRow.__table__.delete().where(ModelWorkloadRow.model_id == model_id)
            )
            session.execute(
                update(JobRow)
                .where(JobRow.model_id == model_id)
                .values(model_id=None)
                .execution_options(synchronize_session=False)
            )
            session.execute(ModelRow.__table__.delete().where(ModelRow.id == model_id))
            return record

    def model_content_in_use(self, content_hash: str) -> bool:
        stmt = select(ModelRow.id).where(ModelRow.content_hash == content_hash).limit(1)
        with self._connection() as conn:
            return conn.execute(stmt).first() is not None

    def set_model_workloads(self, model_id: int, tasks: Sequence[ModelWorkload]) -> None:
        with self._session(write=True) as session:
            if session.get(ModelRow, model_id) is None:
                raise NotFoundError(f"model {model_id} does not exist")
            session.execute(
                ModelWorkloadRow.__table__.delete().where(ModelWorkloadRow.model_id == model_id)
            )
            session.add_all(
                ModelWorkloadRow(
                    model_id=model_id,
                    workload_id=t.workload_id,
                    task_name=t.task_name,
                    weight=t.weight,
                    skip_reason=t.skip_reason,
                )
                for t in tasks
            )

    def model_workloads(self, model_id: int) -> list[ModelWorkload]:
        stmt = (
            select(ModelWorkloadRow)
            .where(ModelWorkloadRow.model_id == model_id)
            .order_by(ModelWorkloadRow.id)
        )
        with self._session() as session:
            return [_frozen(ModelWorkload, r) for r in session.scalars(stmt)]

    # -- jobs --------------------------------------------------------------------------------
    def create_job(
        self,
        *,
        target_id: int,
        trial_budget: int,
        model_id: int | None = None,
        priority: int = 0,
        owner: str | None = None,
    ) -> Job:
        if trial_budget < 0:
            raise StorageError(f"trial_budget must be >= 0, got {trial_budget}")
        with self._session(write=True) as session:
            row = JobRow(
                target_id=target_id,
                trial_budget=trial_budget,
                model_id=model_id,
                priority=priority,
                owner=owner,
                status=JobStatus.QUEUED,
            )
            session.add(row)
            session.flush()
            session.refresh(row)
            return _frozen(Job, row)

    def get_job(self, job_id: int) -> Job | None:
        with self._session() as session:
            row = session.get(JobRow, job_id)
            return None if row is None else _frozen(Job, row)

    def list_jobs(
        self,
        *,
        status: str | None = None,
        limit: int = 100,
        owner: str | None = None,
        offset: int = 0,
    ) -> list[Job]:
        stmt = select(JobRow).order_by(JobRow.id.desc()).limit(limit).offset(max(0, offset))
        if status is not None:
            stmt = stmt.where(JobRow.status == status)
        if owner is not None:
            stmt = stmt.where(JobRow.owner == owner)
        with self._session() as session:
            return [_frozen(Job, r) for r in session.scalars(stmt)]

    def job_progress(self, job_id: int) -> JobProgress | None:
        jobs, tasks, artifacts = JobRow.__table__, JobTaskRow.__table__, ArtifactRow.__table__
        with self._connection() as conn:
            job = conn.execute(select(jobs).where(jobs.c.id == job_id)).one_or_none()
            if job is None:
                return None
            task_rows = conn.execute(
                select(tasks).where(tasks.c.job_id == job_id).order_by(tasks.c.id)
            ).all()
            artifact_rows = conn.execute(
                select(artifacts).where(artifacts.c.job_id == job_id).order_by(artifacts.c.id)
            ).all()
            target_key = conn.execute(
                select(TargetRow.key).where(TargetRow.id == job.target_id)
            ).scalar_one()
            model_tasks = None
            if job.model_id is not None:
                model_tasks = conn.execute(
                    select(func.count())
                    .select_from(ModelWorkloadRow)
                    .where(ModelWorkloadRow.model_id == job.model_id)
                ).scalar_one()
        return JobProgress(
            job=_frozen(Job, job),
            tasks=tuple(_frozen(JobTask, r) for r in task_rows),
            artifacts=tuple(_frozen(Artifact, r) for r in artifact_rows),
            target_key=target_key,
            model_tasks=None if model_tasks is None else int(model_tasks),
        )

    def count_jobs(self, *, status: str | None = None, owner: str | None = None) -> int:
        stmt = select(func.count()).select_from(JobRow)
        if status is not None:
            stmt = stmt.where(JobRow.status == status)
        if owner is not None:
            stmt = stmt.where(JobRow.owner == owner)
        with self._connection() as conn:
            return int(conn.execute(stmt).scalar_one())

    def job_counts(self) -> dict[str, int]:
        stmt = select(JobRow.status, func.count()).group_by(JobRow.status)
        counts = dict.fromkeys(JobStatus.ALL, 0)
        with self._connection() as conn:
            counts.update({status: int(n) for status, n in conn.execute(stmt)})
        return counts

    def claim_next_job(self, worker: str, *, target_id: int | None = None) -> Job | None:
        candidate = select(JobRow.id).where(JobRow.status == JobStatus.QUEUED)
        if target_id is not None:
            candidate = candidate.where(JobRow.target_id == target_id)
        candidate = (
            candidate.order_by(JobRow.priority.desc(), JobRow.id)
            .limit(1)
            .with_for_update(skip_locked=True)  # PostgreSQL; SQLite holds the write lock
            .scalar_subquery()
        )
        stmt = (
            update(JobRow)
            .where(JobRow.id == candidate, JobRow.status == JobStatus.QUEUED)
            .values(
                status=JobStatus.RUNNING,
                worker=worker,
                started_at=func.coalesce(JobRow.started_at, func.now()),
                updated_at=func.now(),
            )
            .returning(JobRow.id)
            .execution_options(synchronize_session=False)
        )
        with self._session(write=True) as session:
            job_id = session.execute(stmt).scalar_one_or_none()
            if job_id is None:
                return None
            return _frozen(Job, session.get(JobRow, job_id, populate_existing=True))

    def requeue_jobs(
        self, *, worker: str | None = None, stale_after_secs: float | None = None
    ) -> list[int]:
        if worker is None and stale_after_secs is None:
            raise StorageError("requeue_jobs needs a worker or stale_after_secs")
        where = [JobRow.status == JobStatus.RUNNING, JobRow.worker.is_not(None)]
        if worker is not None:
            where.append(JobRow.worker == worker)
        if stale_after_secs is not None:
            alive = (
                select(WorkerRow.id)
                .where(
                    WorkerRow.name == JobRow.worker,
                    WorkerRow.status != "offline",
                    WorkerRow.last_heartbeat >= self._db_now_plus(-stale_after_secs),
                )
                .exists()
            )
            where.append(not_(alive))
        with self._session(write=True) as session:
            ids = list(session.scalars(select(JobRow.id).where(*where)))
            if not ids:
                return []
            # Compare-and-set again on the same conditions: a job claimed or finished meanwhile
            # is left alone.
            result = session.execute(
                update(JobRow)
                .where(JobRow.id.in_(ids), *where)
                .values(status=JobStatus.QUEUED, worker=None, updated_at=func.now())
                .returning(JobRow.id)
                .execution_options(synchronize_session=False)
            )
            return sorted(result.scalars())

    @staticmethod
    def _sources(new_status: str, expected: str | None) -> list[str]:
        if new_status not in JobStatus.ALL:
            raise StorageError(f"unknown status {new_status!r}")
        sources = [s for s in JobStatus.ALL if JobStatus.allowed(s, new_status)]
        if expected is not None:
            sources = [s for s in sources if s == expected]
        return sources

    def _compare_and_set(self, session, model, kind: str, row_id: int, new_status, sources, values):
        result = session.execute(
            update(model)
            .where(model.id == row_id, model.status.in_(sources))
            .values(status=new_status, updated_at=func.now(), **values)
            .execution_options(synchronize_session=False)
        )
        if result.rowcount != 1:
            current = session.execute(
                select(model.status).where(model.id == row_id)
            ).scalar_one_or_none()
            if current is None:
                raise NotFoundError(f"{kind} {row_id} does not exist")
            raise InvalidTransitionError(kind, row_id, current, new_status)
        return session.get(model, row_id, populate_existing=True)

    def transition_job(
        self, job_id: int, new_status: str, *, expected: str | None = None, error: str | None = None
    ) -> Job:
        sources = self._sources(new_status, expected)
        values: dict[str, Any] = {}
        if new_status == JobStatus.RUNNING:
            values["started_at"] = func.coalesce(JobRow.started_at, func.now())
        if new_status in JobStatus.TERMINAL:
            values["finished_at"] = func.now()
        if error is not None:
            values["error"] = error
        with self._session(write=True) as session:
            row = self._compare_and_set(session, JobRow, "job", job_id, new_status, sources, values)
            return _frozen(Job, row)

    def add_job_trials(self, job_id: int, trials: int) -> Job:
        with self._session(write=True) as session:
            result = session.execute(
                update(JobRow)
                .where(JobRow.id == job_id)
                .values(trials_done=JobRow.trials_done + trials, updated_at=func.now())
                .execution_options(synchronize_session=False)
            )
            if result.rowcount != 1:
                raise NotFoundError(f"job {job_id} does not exist")
            return _frozen(Job, session.get(JobRow, job_id, populate_existing=True))

    def add_job_tasks(self, job_id: int, tasks: Sequence[NewJobTask]) -> list[JobTask]:
        with self._session(write=True) as session:
            if session.get(JobRow, job_id) is None:
                raise NotFoundError(f"job {job_id} does not exist")
            rows = [_job_task_row(job_id, t) for t in tasks]
            session.add_all(rows)
            session.flush()
            for row in rows:
                session.refresh(row)
            return [_frozen(JobTask, r) for r in rows]

    def list_job_tasks(self, job_id: int) -> list[JobTask]:
        stmt = select(JobTaskRow).where(JobTaskRow.job_id == job_id).order_by(JobTaskRow.id)
        with self._session() as session:
            return [_frozen(JobTask, r) for r in session.scalars(stmt)]

    def transition_job_task(
        self,
        task_id: int,
        new_status: str,
        *,
        expected: str | None = None,
        leased_by: str | None = None,
        lease_seconds: float | None = None,
    ) -> JobTask:
        sources = self._sources(new_status, expected)
        values: dict[str, Any] = {}
        if new_status == JobStatus.RUNNING:
            values["leased_by"] = leased_by
            values["lease_expires_at"] = (
                None if lease_seconds is None else self._db_now_plus(lease_seconds)
            )
        else:
            values["leased_by"] = None
            values["lease_expires_at"] = None
        with self._session(write=True) as session:
            row = self._compare_and_set(
                session, JobTaskRow, "job task", task_id, new_status, sources, values
            )
            return _frozen(JobTask, row)

    def _db_now_plus(self, seconds: float) -> Any:
        if self._dialect == "postgresql":
            return func.now() + timedelta(seconds=seconds)
        return func.datetime("now", f"{float(seconds):+} seconds")

    def update_job_task_progress(
        self, task_id: int, *, trials_done: int | None = None, best_mean_secs: float | None = None
    ) -> JobTask:
        values: dict[str, Any] = {"updated_at": func.now()}
        if trials_done is not None:
            values["trials_done"] = trials_done
        if best_mean_secs is not None:
            values["best_mean_secs"] = case(
                (
                    or_(
                        JobTaskRow.best_mean_secs.is_(None),
                        JobTaskRow.best_mean_secs > best_mean_secs,
                    ),
                    best_mean_secs,
                ),
                else_=JobTaskRow.best_mean_secs,
            )
        with self._session(write=True) as session:
            result = session.execute(
                update(JobTaskRow)
                .where(JobTaskRow.id == task_id)
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            if result.rowcount != 1:
                raise NotFoundError(f"job task {task_id} does not exist")
            return _frozen(JobTask, session.get(JobTaskRow, task_id, populate_existing=True))

    # -- workers -----------------------------------------------------------------------------
    def register_worker(
        self, name: str, *, fingerprint_json: str = "{}", target_id: int | None = None
    ) -> Worker:
        stmt = self._insert(WorkerRow.__table__).values(
            name=name,
            fingerprint_json=fingerprint_json,
            target_id=target_id,
            status="idle",
            last_heartbeat=func.now(),
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=["name"],
            set_={
                "fingerprint_json": stmt.excluded.fingerprint_json,
                "target_id": stmt.excluded.target_id,
                "status": "idle",
                "last_heartbeat": func.now(),
            },
        )
        with self._session(write=True) as session:
            session.execute(stmt)
            row = session.scalars(select(WorkerRow).where(WorkerRow.name == name)).one()
            return _frozen(Worker, row)

    def heartbeat(self, worker_id: int, *, status: str | None = None) -> Worker:
        values: dict[str, Any] = {"last_heartbeat": func.now()}
        if status is not None:
            if status not in WORKER_STATUSES:
                raise StorageError(f"unknown worker status {status!r}")
            values["status"] = status
        with self._session(write=True) as session:
            result = session.execute(
                update(WorkerRow)
                .where(WorkerRow.id == worker_id)
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            if result.rowcount != 1:
                raise NotFoundError(f"worker {worker_id} does not exist")
            return _frozen(Worker, session.get(WorkerRow, worker_id, populate_existing=True))

    def list_workers(self) -> list[Worker]:
        with self._session() as session:
            rows = session.scalars(select(WorkerRow).order_by(WorkerRow.id))
            return [_frozen(Worker, r) for r in rows]

    # -- task leases (distributed workers) ---------------------------------------------------
    def start_job(self, job_id: int, tasks: Sequence[NewJobTask]) -> Job | None:
        with self._session(write=True) as session:
            result = session.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.status == JobStatus.QUEUED)
                .values(
                    status=JobStatus.RUNNING,
                    worker=None,
                    started_at=func.coalesce(JobRow.started_at, func.now()),
                    updated_at=func.now(),
                )
                .execution_options(synchronize_session=False)
            )
            if result.rowcount != 1:
                return None
            existing = {
                t.workload_id: t
                for t in session.scalars(select(JobTaskRow).where(JobTaskRow.job_id == job_id))
            }
            # Tasks left by an earlier run of this job: unfinished ones are lease-able again.
            session.execute(
                update(JobTaskRow)
                .where(
                    JobTaskRow.job_id == job_id,
                    JobTaskRow.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)),
                )
                .values(
                    status=JobStatus.QUEUED, leased_by=None, lease_expires_at=None,
                    updated_at=func.now(),
                )
                .execution_options(synchronize_session=False)
            )
            session.add_all(
                _job_task_row(job_id, t)
                for t in tasks
                if t.workload_id not in existing
            )
            session.flush()
            return _frozen(Job, session.get(JobRow, job_id, populate_existing=True))

    def claim_task_lease(
        self,
        worker: str,
        *,
        target_id: int,
        lease_secs: float,
        max_trials: int | Callable[[int], int],
    ) -> TaskLease | None:
        cap = max_trials if callable(max_trials) else (lambda _budget: max_trials)
        candidate = (
            select(JobTaskRow.id, JobTaskRow.trial_budget, JobTaskRow.trials_done, JobTaskRow.job_id)
            .join(JobRow, JobRow.id == JobTaskRow.job_id)
            .where(
                JobTaskRow.status == JobStatus.QUEUED,
                JobRow.status == JobStatus.RUNNING,
                JobRow.target_id == target_id,
            )
            .order_by(
                JobRow.priority.desc(),
                JobRow.id,
                (func.coalesce(JobTaskRow.flops, 0.0) * JobTaskRow.weight).desc(),
                JobTaskRow.id,
            )
            .limit(1)
            .with_for_update(skip_locked=True, of=JobTaskRow)  # PostgreSQL; SQLite: write lock
        )
        with self._session(write=True) as session:
            while True:
                row = session.execute(candidate).one_or_none()
                if row is None:
                    return None
                task_id, budget, done, job_id = row
                remaining = budget - done
                values: dict[str, Any] = {"updated_at": func.now()}
                if remaining <= 0:  # nothing left to measure: finished, not lease-able
                    values["status"] = JobStatus.SUCCEEDED
                else:
                    values.update(
                        status=JobStatus.RUNNING,
                        leased_by=worker,
                        lease_expires_at=self._db_now_plus(lease_secs),
                    )
                claimed = session.execute(
                    update(JobTaskRow)
                    .where(JobTaskRow.id == task_id, JobTaskRow.status == JobStatus.QUEUED)
                    .values(**values)
                    .execution_options(synchronize_session=False)
                )
                if claimed.rowcount != 1 or remaining <= 0:
                    continue
                lease = TaskLeaseRow(
                    job_id=job_id,
                    task_id=task_id,
                    kind="tune",
                    work_key=f"task:{task_id}",
                    worker=worker,
                    status=LeaseStatus.ACTIVE,
                    trials=max(1, min(remaining, int(cap(budget)))),
                    expires_at=self._db_now_plus(lease_secs),
                )
                session.add(lease)
                session.flush()
                session.refresh(lease)
                return _frozen(TaskLease, lease)

    def claim_finalize_lease(
        self, worker: str, *, target_id: int, lease_secs: float
    ) -> TaskLease | None:
        from sqlalchemy import exc  # noqa: PLC0415

        unfinished = (
            select(JobTaskRow.id)
            .where(
                JobTaskRow.job_id == JobRow.id,
                JobTaskRow.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)),
            )
            .exists()
        )
        finalizing = (
            select(TaskLeaseRow.id)
            .where(
                TaskLeaseRow.job_id == JobRow.id,
                TaskLeaseRow.kind == "finalize",
                TaskLeaseRow.status == LeaseStatus.ACTIVE,
            )
            .exists()
        )
        candidates = (
            select(JobRow.id)
            .where(
                JobRow.status == JobStatus.RUNNING,
                JobRow.target_id == target_id,
                not_(unfinished),
                not_(finalizing),
            )
            .order_by(JobRow.priority.desc(), JobRow.id)
            .limit(5)
        )
        with self._session(write=True) as session:
            for job_id in list(session.scalars(candidates)):
                lease = TaskLeaseRow(
                    job_id=job_id,
                    task_id=None,
                    kind="finalize",
                    work_key=f"finalize:{job_id}",
                    worker=worker,
                    status=LeaseStatus.ACTIVE,
                    trials=0,
                    expires_at=self._db_now_plus(lease_secs),
                )
                try:
                    # The partial unique index on the active work key settles a race between
                    # two claimers (PostgreSQL: the second waits for the first, then fails).
                    with session.begin_nested():
                        session.add(lease)
                        session.flush()
                except exc.IntegrityError:
                    continue
                session.refresh(lease)
                return _frozen(TaskLease, lease)
        return None

    def get_lease(self, lease_id: int) -> TaskLease | None:
        with self._session() as session:
            row = session.get(TaskLeaseRow, lease_id)
            return None if row is None else _frozen(TaskLease, row)

    def list_leases(
        self,
        *,
        job_id: int | None = None,
        worker: str | None = None,
        status: str | None = None,
        after_id: int = 0,
        limit: int = 100,
    ) -> list[TaskLease]:
        stmt = select(TaskLeaseRow).where(TaskLeaseRow.id > after_id)
        if job_id is not None:
            stmt = stmt.where(TaskLeaseRow.job_id == job_id)
        if worker is not None:
            stmt = stmt.where(TaskLeaseRow.worker == worker)
        if status is not None:
            stmt = stmt.where(TaskLeaseRow.status == status)
        stmt = stmt.order_by(TaskLeaseRow.id).limit(max(0, int(limit)))
        with self._session() as session:
            return [_frozen(TaskLease, r) for r in session.scalars(stmt)]

    def renew_leases(self, worker: str, *, lease_secs: float) -> list[TaskLease]:
        active = (TaskLeaseRow.worker == worker, TaskLeaseRow.status == LeaseStatus.ACTIVE)
        with self._session(write=True) as session:
            session.execute(
                update(TaskLeaseRow)
                .where(*active)
                .values(expires_at=self._db_now_plus(lease_secs), updated_at=func.now())
                .execution_options(synchronize_session=False)
            )
            rows = session.scalars(select(TaskLeaseRow).where(*active).order_by(TaskLeaseRow.id))
            return [_frozen(TaskLease, r) for r in rows]

    def record_lease_batch(
        self,
        lease_id: int,
        *,
        batch: int,
        trials: int,
        best_mean_secs: float | None,
        lease_secs: float,
    ) -> LeaseBatchResult:
        with self._session(write=True) as session:
            lease = session.get(TaskLeaseRow, lease_id)
            if lease is None:
                raise NotFoundError(f"task lease {lease_id} does not exist")
            counted = False
            if lease.status == LeaseStatus.ACTIVE and lease.kind == "tune":
                if batch > lease.batches_done:
                    raise ConflictError(
                        f"batch {batch} of lease {lease_id} arrived before batch "
                        f"{lease.batches_done}: upload batches in order"
                    )
                if batch == lease.batches_done:
                    counted = self._count_batch(session, lease, trials, best_mean_secs, lease_secs)
            job_status = session.execute(
                select(JobRow.status).where(JobRow.id == lease.job_id)
            ).scalar_one()
            lease = session.get(TaskLeaseRow, lease_id, populate_existing=True)
            return LeaseBatchResult(_frozen(TaskLease, lease), counted, job_status)

    def _count_batch(self, session, lease, trials: int, best: float | None, lease_secs: float) -> bool:
        moved = session.execute(
            update(TaskLeaseRow)
            .where(
                TaskLeaseRow.id == lease.id,
                TaskLeaseRow.status == LeaseStatus.ACTIVE,
                TaskLeaseRow.batches_done == lease.batches_done,
            )
            .values(
                trials_done=TaskLeaseRow.trials_done + trials,
                batches_done=TaskLeaseRow.batches_done + 1,
                expires_at=self._db_now_plus(lease_secs),
                updated_at=func.now(),
            )
            .execution_options(synchronize_session=False)
        )
        if moved.rowcount != 1:
            return False
        task_values: dict[str, Any] = {
            "trials_done": JobTaskRow.trials_done + trials,
            "updated_at": func.now(),
        }
        if best is not None:
            task_values["best_mean_secs"] = case(
                (
                    or_(JobTaskRow.best_mean_secs.is_(None), JobTaskRow.best_mean_secs > best),
                    best,
                ),
                else_=JobTaskRow.best_mean_secs,
            )
        session.execute(
            update(JobTaskRow)
            .where(JobTaskRow.id == lease.task_id)
            .values(**task_values)
            .execution_options(synchronize_session=False)
        )
        session.execute(
            update(JobRow)
            .where(JobRow.id == lease.job_id)
            .values(trials_done=JobRow.trials_done + trials, updated_at=func.now())
            .execution_options(synchronize_session=False)
        )
        return True

    def finish_lease(
        self, lease_id: int, outcome: str, *, error: str | None = None, max_attempts: int = 3
    ) -> TaskLease:
        if outcome not in LeaseStatus.OUTCOMES:
            raise StorageError(f"unknown lease outcome {outcome!r}")
        with self._session(write=True) as session:
            self._end_lease(session, lease_id, outcome, error=error)
            lease = session.get(TaskLeaseRow, lease_id, populate_existing=True)
            self._release_work(session, lease, max_attempts=max_attempts)
            return _frozen(TaskLease, lease)

    def _end_lease(self, session, lease_id: int, outcome: str, *, error=None, where=()) -> bool:
        values: dict[str, Any] = {
            "status": outcome, "finished_at": func.now(), "updated_at": func.now(),
        }
        if error is not None:
            values["error"] = error
        result = session.execute(
            update(TaskLeaseRow)
            .where(TaskLeaseRow.id == lease_id, TaskLeaseRow.status == LeaseStatus.ACTIVE, *where)
            .values(**values)
            .execution_options(synchronize_session=False)
        )
        if result.rowcount == 1:
            return True
        if where:
            return False
        current = session.execute(
            select(TaskLeaseRow.status).where(TaskLeaseRow.id == lease_id)
        ).scalar_one_or_none()
        if current is None:
            raise NotFoundError(f"task lease {lease_id} does not exist")
        raise InvalidTransitionError("task lease", lease_id, current, outcome)

    def _attempts(self, session, work_key: str) -> int:
        return int(
            session.execute(
                select(func.count())
                .select_from(TaskLeaseRow)
                .where(
                    TaskLeaseRow.work_key == work_key,
                    TaskLeaseRow.status.in_((LeaseStatus.EXPIRED, LeaseStatus.FAILED)),
                )
            ).scalar_one()
        )

    def _release_work(self, session, lease: TaskLeaseRow, *, max_attempts: int) -> None:
        """After ``lease`` ended: move its task (or its job, for a finalize lease) on."""
        job = session.get(JobRow, lease.job_id, populate_existing=True)
        outcome = lease.status
        if lease.kind == "finalize":
            failed = outcome == LeaseStatus.FAILED or (
                outcome == LeaseStatus.EXPIRED and self._attempts(session, lease.work_key) >= max_attempts
            )
            if failed and job.status == JobStatus.RUNNING:
                reason = lease.error or f"the finalize step was lost {max_attempts} times"
                self._compare_and_set(
                    session, JobRow, "job", job.id, JobStatus.FAILED, [JobStatus.RUNNING],
                    {"finished_at": func.now(), "error": f"finalize failed: {reason}"},
                )
            return
        task = session.get(JobTaskRow, lease.task_id, populate_existing=True)
        if task is None or task.status != JobStatus.RUNNING:
            return
        if job.status != JobStatus.RUNNING or outcome == LeaseStatus.CANCELLED:
            new = JobStatus.CANCELLED
        elif task.trials_done >= task.trial_budget:
            new = JobStatus.SUCCEEDED
        elif outcome == LeaseStatus.DONE and lease.trials_done < lease.trials:
            new = JobStatus.SUCCEEDED  # the search ran out of new candidates
        elif outcome in (LeaseStatus.EXPIRED, LeaseStatus.FAILED) and (
            self._attempts(session, lease.work_key) >= max_attempts
        ):
            new = JobStatus.FAILED
        else:
            new = JobStatus.QUEUED
        session.execute(
            update(JobTaskRow)
            .where(JobTaskRow.id == task.id, JobTaskRow.status == JobStatus.RUNNING)
            .values(status=new, leased_by=None, lease_expires_at=None, updated_at=func.now())
            .execution_options(synchronize_session=False)
        )

    def reap_expired_leases(self, *, max_attempts: int = 3) -> list[int]:
        expired = (TaskLeaseRow.status == LeaseStatus.ACTIVE, TaskLeaseRow.expires_at < func.now())
        reaped: list[int] = []
        with self._session(write=True) as session:
            ids = list(session.scalars(select(TaskLeaseRow.id).where(*expired).limit(100)))
            for lease_id in ids:
                # Compare-and-set on the same conditions: a lease renewed or reaped by another
                # process meanwhile is left alone (PostgreSQL re-checks after the row lock).
                if not self._end_lease(session, lease_id, LeaseStatus.EXPIRED,
                                       error="lease expired (no heartbeat)", where=expired[1:]):
                    continue
                lease = session.get(TaskLeaseRow, lease_id, populate_existing=True)
                self._release_work(session, lease, max_attempts=max_attempts)
                reaped.append(lease_id)
        return reaped

    def release_worker_leases(self, worker: str, *, max_attempts: int = 3) -> list[int]:
        released: list[int] = []
        with self._session(write=True) as session:
            ids = list(session.scalars(select(TaskLeaseRow.id).where(
                TaskLeaseRow.worker == worker, TaskLeaseRow.status == LeaseStatus.ACTIVE
            )))
            for lease_id in ids:
                if not self._end_lease(session, lease_id, LeaseStatus.EXPIRED,
                                       error=f"worker {worker} went away", where=(true_(),)):
                    continue
                lease = session.get(TaskLeaseRow, lease_id, populate_existing=True)
                self._release_work(session, lease, max_attempts=max_attempts)
                released.append(lease_id)
        return released

    def complete_finalize(
        self,
        lease_id: int,
        *,
        path: str,
        sha256: str,
        size: int,
        manifest_json: str,
        verified: bool,
    ) -> Artifact:
        with self._session(write=True) as session:
            lease = session.get(TaskLeaseRow, lease_id)
            if lease is None:
                raise NotFoundError(f"task lease {lease_id} does not exist")
            if lease.kind != "finalize":
                raise ConflictError(f"lease {lease_id} is a {lease.kind} lease, not a finalize lease")
            self._end_lease(session, lease_id, LeaseStatus.DONE)
            artifact = ArtifactRow(
                job_id=lease.job_id, path=path, sha256=sha256, size=size,
                manifest_json=manifest_json, verified=verified,
            )
            session.add(artifact)
            self._compare_and_set(
                session, JobRow, "job", lease.job_id, JobStatus.SUCCEEDED, [JobStatus.RUNNING],
                {"finished_at": func.now(), "worker": lease.worker},
            )
            session.flush()
            session.refresh(artifact)
            return _frozen(Artifact, artifact)

    def count_open_jobs(self, *, target_id: int) -> int:
        stmt = select(func.count()).select_from(JobRow).where(
            JobRow.target_id == target_id,
            JobRow.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)),
        )
        with self._connection() as conn:
            return int(conn.execute(stmt).scalar_one())

    # -- artifacts, cost models, tokens -----------------------------------------------------
    def _add(self, cls: type[T], row: Any) -> T:
        with self._session(write=True) as session:
            session.add(row)
            session.flush()
            session.refresh(row)
            return _frozen(cls, row)

    def add_artifact(
        self,
        *,
        job_id: int,
        path: str,
        sha256: str,
        size: int,
        manifest_json: str = "{}",
        verified: bool = False,
    ) -> Artifact:
        row = ArtifactRow(
            job_id=job_id,
            path=path,
            sha256=sha256,
            size=size,
            manifest_json=manifest_json,
            verified=verified,
        )
        return self._add(Artifact, row)

    def list_artifacts(self, job_id: int) -> list[Artifact]:
        stmt = select(ArtifactRow).where(ArtifactRow.job_id == job_id).order_by(ArtifactRow.id)
        with self._session() as session:
            return [_frozen(Artifact, r) for r in session.scalars(stmt)]

    def save_cost_model(
        self, *, target_id: int, blob: bytes, feature_version: str, tvm_version: str, n_samples: int
    ) -> CostModelBlob:
        row = CostModelRow(
            target_id=target_id,
            blob=blob,
            feature_version=feature_version,
            tvm_version=tvm_version,
            n_samples=n_samples,
        )
        return self._add(CostModelBlob, row)

    def latest_cost_model(
        self, target_id: int, *, feature_version: str | None = None
    ) -> CostModelBlob | None:
        stmt = select(CostModelRow).where(CostModelRow.target_id == target_id)
        if feature_version is not None:
            stmt = stmt.where(CostModelRow.feature_version == feature_version)
        stmt = stmt.order_by(CostModelRow.id.desc()).limit(1)
        with self._session() as session:
            row = session.scalars(stmt).one_or_none()
            return None if row is None else _frozen(CostModelBlob, row)

    def add_api_token(self, *, name: str, token_hash: str, kind: str) -> ApiToken:
        if kind not in TOKEN_KINDS:
            raise StorageError(f"unknown token kind {kind!r}")
        return self._add(ApiToken, ApiTokenRow(name=name, token_hash=token_hash, kind=kind))

    def find_api_token(self, token_hash: str) -> ApiToken | None:
        stmt = select(ApiTokenRow).where(
            ApiTokenRow.token_hash == token_hash, ApiTokenRow.revoked.is_(False)
        )
        with self._session() as session:
            row = session.scalars(stmt).one_or_none()
            return None if row is None else _frozen(ApiToken, row)

    def revoke_api_token(self, token_id: int) -> None:
        with self._session(write=True) as session:
            result = session.execute(
                update(ApiTokenRow)
                .where(ApiTokenRow.id == token_id)
                .values(revoked=True)
                .execution_options(synchronize_session=False)
            )
            if result.rowcount != 1:
                raise NotFoundError(f"API token {token_id} does not exist")

    def list_api_tokens(self) -> list[ApiToken]:
        with self._session() as session:
            rows = session.scalars(select(ApiTokenRow).order_by(ApiTokenRow.id))
            return [_frozen(ApiToken, r) for r in rows]


def open_storage(url: str, *, upgrade: bool = False, pool_size: int | None = None) -> SQLStorage:
    """Open the tuning database at ``url`` and check its schema.

    Args:
        url: an SQLAlchemy URL, ``sqlite:///path`` or ``postgresql[+psycopg]://...``.
        upgrade: migrate a missing or old schema to the head instead of refusing it. The service
            and the workers pass ``False`` (schema changes are an explicit step, ``tunehub db
            upgrade``); the embedded default SQLite database passes ``True``, so a first run on a
            fresh machine creates it.
        pool_size: connections kept open (default: SQLAlchemy's 5); a process with more threads
            using the storage at once (the API's request threads) sets it to that number, so
            no request waits for a connection or reopens one.

    Raises:
        SchemaOutdatedError: the schema is missing or old (and ``upgrade`` is false), or newer
            than this TuneHub; the message names the exact command to run.
        StorageUnavailableError: the database cannot be reached.
    """
    from db import schema  # noqa: PLC0415
    from db.engine import normalize_url  # noqa: PLC0415

    parsed = normalize_url(url)
    if not upgrade and parsed.get_backend_name() == "sqlite":
        path = parsed.database or ""
        if path and path != ":memory:" and not path.startswith("file:"):
            if not Path(path).expanduser().exists():  # do not leave an empty file behind
                raise SchemaOutdatedError(display_url(parsed), None, schema.head_revision())
    engine = create_storage_engine(url, **({"pool_size": pool_size} if pool_size else {}))
    try:
        if upgrade:
            current = schema.current_revision(engine)
            if current != schema.head_revision():
                if current is not None and current not in schema.known_revisions():
                    schema.check_schema(engine)  # raises: newer than this code
                schema.upgrade(engine)
        schema.check_schema(engine)
    except BaseException:
        engine.dispose()
        raise
    return SQLStorage(engine)
