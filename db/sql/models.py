"""Uploaded models and their tuning tasks on SQL."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select, update

from db.contracts.models import ModelStorage
from db.errors import ConflictError, NotFoundError
from db.models import IdFloorRow, JobRow, ModelRow, ModelWorkloadRow
from db.sql.base import SQLBase, frozen
from db.types import JobStatus, ModelRecord, ModelWorkload


class ModelSQL(SQLBase, ModelStorage):
    """:class:`ModelStorage` on SQL."""

    # -- models ------------------------------------------------------------------------------
    def add_model(
        self,
        *,
        content_hash: str,
        format: str,
        filename: str,
        size: int,
        owner: str,
        buckets_json: str | None = None,
    ) -> ModelRecord:
        values = dict(
            content_hash=content_hash,
            format=format,
            filename=filename,
            size=size,
            owner=owner,
            buckets_json=buckets_json,
        )
        with self._session(write=True) as session:
            if self.dialect == "sqlite":
                # SQLite hands out max(rowid) + 1: above a deleted model's id, never its id.
                floor = session.get(IdFloorRow, "models")
                top = session.execute(select(func.max(ModelRow.id))).scalar_one() or 0
                if floor is not None and floor.last_id > top:
                    values["id"] = floor.last_id + 1
            stmt = self._insert(ModelRow.__table__).values(**values)
            session.execute(stmt.on_conflict_do_nothing(index_elements=["owner", "content_hash"]))
            row = session.scalars(
                select(ModelRow).where(
                    ModelRow.owner == owner, ModelRow.content_hash == content_hash
                )
            ).one()
            return frozen(ModelRecord, row)

    def get_model(self, model_id: int) -> ModelRecord | None:
        with self._session() as session:
            row = session.get(ModelRow, model_id)
            return None if row is None else frozen(ModelRecord, row)

    def list_models(self, *, owner: str | None = None) -> list[ModelRecord]:
        stmt = select(ModelRow).order_by(ModelRow.id.desc())
        if owner is not None:
            stmt = stmt.where(ModelRow.owner == owner)
        with self._session() as session:
            return [frozen(ModelRecord, r) for r in session.scalars(stmt)]

    def find_model(self, *, owner: str, content_hash: str) -> ModelRecord | None:
        stmt = select(ModelRow).where(
            ModelRow.owner == owner, ModelRow.content_hash == content_hash
        )
        with self._session() as session:
            row = session.scalars(stmt).one_or_none()
            return None if row is None else frozen(ModelRecord, row)

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
                raise ConflictError(
                    f"model {model_id} is used by job {busy[0]}, which is not finished"
                )
            record = frozen(ModelRecord, row)
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
            floor = session.get(IdFloorRow, "models")
            if floor is None:
                session.add(IdFloorRow(name="models", last_id=model_id))
            elif floor.last_id < model_id:
                floor.last_id = model_id
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
            return [frozen(ModelWorkload, r) for r in session.scalars(stmt)]
