"""Library records on SQL (:mod:`db.contracts.library_records`).

Rows hold workload and target ids; every read joins ``workloads`` and ``targets`` for their keys,
so the frozen :class:`LibraryRecord` names them the way callers do.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import false, func, insert, select

from db.contracts.library_records import MAX_LIBRARY_PAGE, LibraryRecordStorage
from db.errors import ConflictError
from db.models import JobRow, LibraryRecordRow, TargetRow, WorkloadRow
from db.sql.base import SQLBase, utc
from db.types import LibraryRecord, NewLibraryRecord, dumps_compact

LIB = LibraryRecordRow.__table__
WL = WorkloadRow.__table__
TG = TargetRow.__table__
#: Keys per ``IN (...)`` list (well below SQLite's and PostgreSQL's bound-parameter limits).
_CHUNK = 1000

_COLUMNS = (
    LIB.c.id,
    WL.c.key.label("workload_key"),
    TG.c.key.label("target_key"),
    LIB.c.library,
    LIB.c.version,
    LIB.c.call_json,
    LIB.c.run_secs_json,
    LIB.c.median_secs,
    LIB.c.spread,
    LIB.c.job_id,
    LIB.c.worker,
    LIB.c.measured_at,
    LIB.c.quarantined,
    LIB.c.held_reason,
)


def _joined(*columns: Any):
    return (
        select(*columns)
        .join_from(LIB, WL, WL.c.id == LIB.c.workload_id)
        .join(TG, TG.c.id == LIB.c.target_id)
    )


def _frozen(row: Any) -> LibraryRecord:
    m = row._mapping  # noqa: SLF001 - Row._mapping is SQLAlchemy's public API
    return LibraryRecord(
        id=m["id"],
        workload_key=m["workload_key"],
        target_key=m["target_key"],
        library=m["library"],
        version=m["version"],
        call=json.loads(m["call_json"]),
        run_secs=tuple(json.loads(m["run_secs_json"])),
        median_secs=m["median_secs"],
        spread=m["spread"],
        job_id=m["job_id"],
        worker=m["worker"],
        measured_at=utc(m["measured_at"]),
        quarantined=bool(m["quarantined"]),
        held_reason=m["held_reason"],
    )


def _filtered(
    stmt: Any,
    workload_key: str | None,
    target_key: str | None,
    job_id: int | None,
    quarantined: bool | None,
) -> Any:
    """``stmt`` (over :func:`_joined`) with the listing filters that are given."""
    if workload_key is not None:
        stmt = stmt.where(WL.c.key == workload_key)
    if target_key is not None:
        stmt = stmt.where(TG.c.key == target_key)
    if job_id is not None:
        stmt = stmt.where(LIB.c.job_id == job_id)
    if quarantined is not None:
        stmt = stmt.where(LIB.c.quarantined == bool(quarantined))
    return stmt


def _ids(session: Any, column: Any, key: Any, wanted: set) -> dict:
    found: dict = {}
    ordered = sorted(wanted)
    for start in range(0, len(ordered), _CHUNK):
        chunk = ordered[start : start + _CHUNK]
        found.update((k, v) for k, v in session.execute(select(key, column).where(key.in_(chunk))))
    return found


class LibraryRecordSQL(SQLBase, LibraryRecordStorage):
    """:class:`LibraryRecordStorage` on SQL."""

    def add_library_records(self, items: Sequence[NewLibraryRecord]) -> list[LibraryRecord]:
        items = list(items)
        prepared = []
        for index, item in enumerate(items):  # every check before the transaction
            if not isinstance(item, NewLibraryRecord):
                raise ValueError(
                    f"library record {index}: a NewLibraryRecord, not {type(item).__name__}"
                )
            prepared.append((item, item.call_json))  # checks ``call`` again (a dict is mutable)
        if not prepared:
            return []
        with self._session(write=True) as session:
            workloads = _ids(session, WL.c.id, WL.c.key, {i.workload_key for i in items})
            targets = _ids(session, TG.c.id, TG.c.key, {i.target_key for i in items})
            jobs = _ids(
                session, JobRow.id, JobRow.id, {i.job_id for i in items if i.job_id is not None}
            )
            for item in items:
                if item.workload_key not in workloads:
                    raise ConflictError(f"library record: unknown workload {item.workload_key}")
                if item.target_key not in targets:
                    raise ConflictError(f"library record: unknown target {item.target_key}")
                if item.job_id is not None and item.job_id not in jobs:
                    raise ConflictError(f"library record: unknown job {item.job_id}")
            values = [
                {
                    "workload_id": workloads[item.workload_key],
                    "target_id": targets[item.target_key],
                    "library": item.library,
                    "version": item.version,
                    "call_json": call_json,
                    "run_secs_json": dumps_compact(list(item.run_secs)),
                    "median_secs": item.median_secs,
                    "spread": item.spread,
                    "job_id": item.job_id,
                    "worker": item.worker,
                    "quarantined": item.quarantined,
                    "held_reason": item.held_reason,
                }
                for item, call_json in prepared
            ]
            stored = session.execute(
                insert(LIB).returning(LIB.c.id, LIB.c.measured_at, sort_by_parameter_order=True),
                values,
            ).all()
        return [
            LibraryRecord(
                id=row.id,
                workload_key=item.workload_key,
                target_key=item.target_key,
                library=item.library,
                version=item.version,
                call=json.loads(call_json),
                run_secs=item.run_secs,
                median_secs=item.median_secs,
                spread=item.spread,
                job_id=item.job_id,
                worker=item.worker,
                measured_at=utc(row.measured_at),
                quarantined=item.quarantined,
                held_reason=item.held_reason,
            )
            for (item, call_json), row in zip(prepared, stored, strict=True)
        ]

    def best_library_records(
        self, target_key: str, workload_keys: Sequence[str]
    ) -> dict[str, LibraryRecord]:
        keys = sorted(set(workload_keys))
        best: dict[str, LibraryRecord] = {}
        with self._connection() as conn:
            for start in range(0, len(keys), _CHUNK):
                rank = (
                    func.row_number()
                    .over(
                        partition_by=LIB.c.workload_id,
                        order_by=(LIB.c.median_secs, LIB.c.id.desc()),
                    )
                    .label("rank")
                )
                ranked = (
                    _joined(*_COLUMNS, rank)
                    .where(
                        TG.c.key == target_key,
                        WL.c.key.in_(keys[start : start + _CHUNK]),
                        LIB.c.quarantined == false(),  # a held record is never a best
                    )
                    .subquery()
                )
                rows = conn.execute(select(ranked).where(ranked.c.rank == 1))
                best.update((r.workload_key, _frozen(r)) for r in rows)
        return best

    def list_library_records(
        self,
        *,
        workload_key: str | None = None,
        target_key: str | None = None,
        job_id: int | None = None,
        quarantined: bool | None = None,
        after_id: int = 0,
        limit: int = MAX_LIBRARY_PAGE,
    ) -> list[LibraryRecord]:
        limit = min(int(limit), MAX_LIBRARY_PAGE)
        if limit <= 0:
            return []
        stmt = _filtered(
            _joined(*_COLUMNS).where(LIB.c.id > int(after_id)),
            workload_key,
            target_key,
            job_id,
            quarantined,
        )
        with self._connection() as conn:
            return [_frozen(row) for row in conn.execute(stmt.order_by(LIB.c.id).limit(limit))]

    def count_library_records(
        self,
        *,
        workload_key: str | None = None,
        target_key: str | None = None,
        job_id: int | None = None,
        quarantined: bool | None = None,
    ) -> int:
        stmt = _filtered(
            _joined(func.count(LIB.c.id)), workload_key, target_key, job_id, quarantined
        )
        with self._connection() as conn:
            return int(conn.execute(stmt).scalar_one())
