"""The contract of trained cost models, stored per target and feature version."""

from __future__ import annotations

import abc

from db.types import CostModelBlob


class CostModelStorage(abc.ABC):
    """Trained cost models (opaque blobs)."""

    @abc.abstractmethod
    def save_cost_model(
        self, *, target_id: int, blob: bytes, feature_version: str, tvm_version: str, n_samples: int
    ) -> CostModelBlob:
        """Store a trained cost model (a new row each time)."""

    @abc.abstractmethod
    def latest_cost_model(
        self, target_id: int, *, feature_version: str | None = None
    ) -> CostModelBlob | None:
        """The newest cost model for a target (and feature version), or ``None``."""
