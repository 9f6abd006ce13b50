"""Version tags of persisted cost models; importable without TVM (the API process uses them)."""

from __future__ import annotations

#: The feature layout of :mod:`cost_model.features`; a stored model with another tag is ignored.
FEATURE_VERSION = "per-store-feature/b5-a10-c64:sum-max-mean-count:v1"


def latest_model_blob(storage, target_key: str, tvm_version: str) -> tuple[int, bytes] | None:
    """``(id, blob)`` of the newest stored model of ``target_key`` made with this feature layout
    and ``tvm_version``, or ``None`` (unknown target, no model, or another TVM version)."""
    target = storage.get_target(target_key)
    if target is None:
        return None
    row = storage.latest_cost_model(target.id, feature_version=FEATURE_VERSION)
    if row is None or row.tvm_version != tvm_version:
        return None
    return row.id, row.blob
