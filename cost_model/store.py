"""Train, persist and load the transferred cost model of a target.

A persisted model is one row of the database's ``cost_models`` table (through the storage
contract): the booster, the training set it was trained on (so retraining extracts features only
for newer records), the objective, ``FEATURE_VERSION``, the TVM version and the training-set
size. :func:`load_model` returns only a model whose feature version and TVM version match this
process; anything else is ignored and tuning falls back to MetaSchedule's cold model.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import tvm

from cost_model.booster import (
    BoosterConfig,
    Objective,
    booster_from_bytes,
    booster_to_bytes,
    train_booster,
)
from cost_model.dataset import TrainingSet, extend_training_set, throughput_labels
from cost_model.version import FEATURE_VERSION, latest_model_blob

logger = logging.getLogger("tunehub.cost_model")

#: retrain when the records of a target grew by this fraction and at least ``MIN_NEW_RECORDS``
RETRAIN_GROWTH = 0.25
MIN_NEW_RECORDS = 256


@dataclass(frozen=True)
class TrainedModel:
    """A booster plus what it was trained on."""

    booster: Any
    objective: Objective
    training_set: TrainingSet
    train_secs: float = 0.0
    model_id: int | None = None

    @property
    def n_samples(self) -> int:
        return len(self.training_set)

    def config(self, base: BoosterConfig | None = None) -> BoosterConfig:
        """``base`` (default settings if omitted) with this model's objective."""
        return replace(base or BoosterConfig(), objective=self.objective)

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        np.savez(
            buffer,
            booster=np.frombuffer(booster_to_bytes(self.booster), dtype=np.uint8),
            training_set=np.frombuffer(self.training_set.to_bytes(), dtype=np.uint8),
            objective=np.array(self.objective),
        )
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, blob: bytes, model_id: int | None = None) -> TrainedModel:
        with np.load(io.BytesIO(blob), allow_pickle=False) as data:
            return cls(
                booster=booster_from_bytes(data["booster"].tobytes()),
                objective=str(data["objective"]),  # type: ignore[arg-type]
                training_set=TrainingSet.from_bytes(data["training_set"].tobytes()),
                model_id=model_id,
            )


def train(training_set: TrainingSet, config: BoosterConfig | None = None) -> TrainedModel:
    """Train a booster on ``training_set`` (labels: throughput within each workload).

    Raises ``ValueError`` when the set has no valid measurement.
    """
    config = config or BoosterConfig()
    labels = throughput_labels(training_set.costs, training_set.groups)
    if not labels.any():
        raise ValueError("the training set holds no valid measurement")
    start = time.perf_counter()
    booster = train_booster(training_set.features, labels, training_set.groups, config)
    return TrainedModel(booster, config.objective, training_set, time.perf_counter() - start)


def _target_row(storage, spec):
    return storage.get_target(spec.key)


def load_model(storage, spec) -> TrainedModel | None:
    """The newest persisted model of ``spec``'s target usable by this process, or ``None``."""
    found = latest_model_blob(storage, spec.key, tvm.__version__)
    return None if found is None else TrainedModel.from_bytes(found[1], model_id=found[0])


def save_model(storage, spec, model: TrainedModel) -> int:
    """Persist ``model`` for ``spec``'s target; returns the row id. The target must exist."""
    target = storage.ensure_target(spec)
    row = storage.save_cost_model(
        target_id=target.id,
        blob=model.to_bytes(),
        feature_version=FEATURE_VERSION,
        tvm_version=tvm.__version__,
        n_samples=model.n_samples,
    )
    return row.id


def train_for_target(
    storage,
    spec,
    *,
    config: BoosterConfig | None = None,
    previous: TrainedModel | None = None,
    progress: Callable[[int], None] | None = None,
) -> TrainedModel:
    """Train on every record of ``spec``'s target (reusing ``previous``'s extracted features).

    Raises ``ValueError`` when the target has no records or no valid measurement.
    """
    target = _target_row(storage, spec)
    if target is None:
        raise ValueError(f"no records for target {spec.describe()}")
    training_set = extend_training_set(
        storage, target, previous.training_set if previous else None, progress=progress
    )
    return train(training_set, config)


def new_records_since(storage, spec, model: TrainedModel | None) -> int:
    """How many records of ``spec``'s target are newer than ``model``'s training set."""
    target = _target_row(storage, spec)
    if target is None:
        return 0
    total = storage.count_records(target_id=target.id)
    return max(0, total - (model.n_samples if model else 0))


def maybe_retrain(storage, spec, *, config: BoosterConfig | None = None) -> TrainedModel | None:
    """Retrain and persist when enough new records arrived since the stored model.

    "Enough": at least ``MIN_NEW_RECORDS`` and ``RETRAIN_GROWTH`` of the stored model's size.
    Returns the new model, or ``None`` when nothing was done. Meant for idle time (a worker
    between jobs, ``tunehub cost-model train``); raises only storage errors.
    """
    current = load_model(storage, spec)
    fresh = new_records_since(storage, spec, current)
    needed = max(MIN_NEW_RECORDS, int(RETRAIN_GROWTH * (current.n_samples if current else 0)))
    if fresh < needed:
        return None
    try:
        model = train_for_target(storage, spec, config=config, previous=current)
    except ValueError:
        return None
    save_model(storage, spec, model)
    logger.info("cost model retrained on %d records of %s", model.n_samples, spec.describe())
    return model
