"""XGBoost boosters over folded features: train, fine-tune, predict, serialize.

Two objectives, both comparing candidates only within a workload:

``throughput``
    squared error on normalized throughput (:func:`cost_model.dataset.throughput_labels`), the
    label MetaSchedule's own XGBModel uses.
``rank``
    XGBoost's ``rank:pairwise`` with one query group per workload: only the order of
    candidates inside a workload is learned.

Predictions are scores where higher means faster; only their order within a workload means
anything (MetaSchedule's search uses them to rank candidates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

Objective = Literal["throughput", "rank"]
OBJECTIVES: tuple[Objective, ...] = ("throughput", "rank")


@dataclass(frozen=True)
class BoosterConfig:
    """XGBoost settings. ``rounds`` for a full training, ``fine_tune_rounds`` per update.

    One thread: training sets are small (10^3-10^5 rows), and XGBoost's OpenMP threads spin while
    waiting, which on a machine that is also building and measuring candidates (always, while
    tuning) made a 2-thread training of a few hundred rows take minutes instead of seconds.
    """

    objective: Objective = "rank"
    rounds: int = 200
    fine_tune_rounds: int = 20
    max_depth: int = 8
    eta: float = 0.2
    min_child_weight: float = 2.0
    subsample: float = 0.9
    nthread: int = 1
    seed: int = 0

    def params(self) -> dict:
        params = {
            "max_depth": self.max_depth,
            "eta": self.eta,
            "min_child_weight": self.min_child_weight,
            "subsample": self.subsample,
            "nthread": self.nthread,
            "seed": self.seed,
            "verbosity": 0,
            "tree_method": "hist",
        }
        if self.objective == "rank":
            params.update(objective="rank:pairwise", eval_metric="auc")
        else:
            params.update(objective="reg:squarederror")
        return params


def _dmatrix(features: np.ndarray, labels: np.ndarray, groups: np.ndarray, objective: Objective):
    import xgboost as xgb

    if objective == "rank":
        order = np.argsort(groups, kind="stable")
        return xgb.DMatrix(features[order], label=labels[order], qid=groups[order])
    return xgb.DMatrix(features, label=labels)


def train_booster(
    features: np.ndarray,
    labels: np.ndarray,
    groups: np.ndarray,
    config: BoosterConfig,
    *,
    base=None,
    rounds: int | None = None,
):
    """Train an ``xgb.Booster`` (continuing from ``base`` when given; ``base`` is not modified).

    Raises ``ValueError`` for an empty training set.
    """
    import xgboost as xgb

    if len(labels) == 0:
        raise ValueError("no training samples")
    dtrain = _dmatrix(features, labels, groups, config.objective)
    start = None if base is None else base.copy()
    return xgb.train(
        config.params(), dtrain, num_boost_round=rounds or config.rounds, xgb_model=start
    )


def predict(booster, features: np.ndarray) -> np.ndarray:
    """Scores (float64, higher is faster) for ``features``; empty in, empty out."""
    import xgboost as xgb

    if len(features) == 0:
        return np.zeros(0)
    return booster.predict(xgb.DMatrix(features)).astype(np.float64)


def booster_to_bytes(booster) -> bytes:
    return bytes(booster.save_raw(raw_format="ubj"))


def booster_from_bytes(blob: bytes):
    import xgboost as xgb

    booster = xgb.Booster()
    booster.load_model(bytearray(blob))
    return booster
