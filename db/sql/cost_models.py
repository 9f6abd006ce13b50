"""Trained cost models on SQL."""

from __future__ import annotations

from sqlalchemy import select

from db.contracts.cost_models import CostModelStorage
from db.models import CostModelRow
from db.sql.base import SQLBase, frozen
from db.types import CostModelBlob


class CostModelSQL(SQLBase, CostModelStorage):
    """:class:`CostModelStorage` on SQL."""

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
            return None if row is None else frozen(CostModelBlob, row)
