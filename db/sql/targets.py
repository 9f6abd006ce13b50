"""Targets and workloads on SQL: inserted once (first writer wins), their ids cached."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlalchemy import Engine, select

from db.contracts.records import RecordStorage
from db.models import TargetRow, WorkloadRow
from db.sql.base import SQLBase, frozen
from db.sql.records import REC
from db.types import TargetRecord, WorkloadRecord

if TYPE_CHECKING:  # pragma: no cover
    from compiler.target import TargetSpec


class TargetSQL(SQLBase, RecordStorage):
    """The targets and workloads part of :class:`RecordStorage`."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self._target_cache: dict[str, TargetRecord] = {}
        self._workload_id_cache: dict[str, int] = {}

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
            record = frozen(TargetRecord, row)
        with self._lock:
            self._target_cache[record.key] = record
        return record

    def get_target(self, key: str) -> TargetRecord | None:
        cached = self._target_cache.get(key)
        if cached is not None:
            return cached
        with self._session() as session:
            row = session.scalars(select(TargetRow).where(TargetRow.key == key)).one_or_none()
            return None if row is None else frozen(TargetRecord, row)

    def get_target_by_id(self, target_id: int) -> TargetRecord | None:
        with self._session() as session:
            row = session.get(TargetRow, target_id)
            return None if row is None else frozen(TargetRecord, row)

    def list_targets(self) -> list[TargetRecord]:
        with self._session() as session:
            rows = session.scalars(select(TargetRow).order_by(TargetRow.id))
            return [frozen(TargetRecord, r) for r in rows]

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
            record = frozen(WorkloadRecord, row)
        with self._lock:
            self._workload_id_cache[key] = record.id
        return record

    def get_workload(self, key: str) -> WorkloadRecord | None:
        with self._session() as session:
            row = session.scalars(select(WorkloadRow).where(WorkloadRow.key == key)).one_or_none()
            return None if row is None else frozen(WorkloadRecord, row)

    def get_workload_by_id(self, workload_id: int) -> WorkloadRecord | None:
        with self._session() as session:
            row = session.get(WorkloadRow, workload_id)
            return None if row is None else frozen(WorkloadRecord, row)

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
                select(REC.c.id)
                .where(REC.c.workload_id == WorkloadRow.id, REC.c.target_id == target_id)
                .exists()
            )
            stmt = stmt.where(has_records)
        with self._session() as session:
            return [frozen(WorkloadRecord, r) for r in session.scalars(stmt)]
