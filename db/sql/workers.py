"""Workers on SQL: registration (an upsert by name) and heartbeats on the database clock."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import func, select, update

from db.contracts.workers import WorkerStorage
from db.errors import NotFoundError, StorageError
from db.models import WorkerRow
from db.sql.base import SQLBase, frozen
from db.types import WORKER_STATUSES, Worker


class WorkerSQL(SQLBase, WorkerStorage):
    """:class:`WorkerStorage` on SQL."""

    def register_worker(
        self,
        name: str,
        *,
        fingerprint_json: str = "{}",
        target_id: int | None = None,
        token_id: int | None = None,
    ) -> Worker:
        instance = uuid.uuid4().hex
        stmt = self._insert(WorkerRow.__table__).values(
            name=name,
            fingerprint_json=fingerprint_json,
            target_id=target_id,
            status="idle",
            last_heartbeat=func.now(),
            token_id=token_id,
            instance=instance,
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=["name"],
            set_={
                "fingerprint_json": stmt.excluded.fingerprint_json,
                "target_id": stmt.excluded.target_id,
                "status": "idle",
                "last_heartbeat": func.now(),
                "token_id": stmt.excluded.token_id,
                "instance": stmt.excluded.instance,
            },
        )
        with self._session(write=True) as session:
            session.execute(stmt)
            row = session.scalars(select(WorkerRow).where(WorkerRow.name == name)).one()
            return frozen(Worker, row)

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
            return frozen(Worker, session.get(WorkerRow, worker_id, populate_existing=True))

    def list_workers(
        self, *, token_id: int | None = None, limit: int | None = None, offset: int = 0
    ) -> list[Worker]:
        stmt = select(WorkerRow).order_by(WorkerRow.id).offset(max(0, int(offset)))
        if token_id is not None:
            stmt = stmt.where(WorkerRow.token_id == token_id)
        if limit is not None:
            stmt = stmt.limit(max(0, int(limit)))
        with self._session() as session:
            return [frozen(Worker, r) for r in session.scalars(stmt)]

    def count_workers(self, *, token_id: int | None = None) -> int:
        stmt = select(func.count()).select_from(WorkerRow)
        if token_id is not None:
            stmt = stmt.where(WorkerRow.token_id == token_id)
        with self._session() as session:
            return int(session.execute(stmt).scalar_one())
