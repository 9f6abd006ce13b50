"""The MetaSchedule cost model TuneHub tunes with: transferred from the database, guarded.

:class:`TransferCostModel` starts from a booster trained on every stored record of the target
(:mod:`cost_model.store`), so its first predictions already rank candidates, where MetaSchedule's
own ``XGBModel`` predicts at random until it has 100 samples of the current run. During tuning it
keeps the run's measurements per workload and fine-tunes a copy of the transferred booster on
them (a few boosting rounds on top of it, whenever the run's data grew by a fifth). Candidate
features go through a :class:`cost_model.features.FeatureCache`: the evolutionary search scores
the same schedules again and again (72 % of lookups in a ResNet-18 profile).

Negative transfer guard: MetaSchedule's cold ``XGBModel`` is trained alongside on the same
measurements. Before learning from a measured batch, both models score it, and each one's
pairwise rank accuracy on that batch is kept per workload *family* (:func:`workload_family`:
ResNet-18's eight ``conv2d + add + relu`` tasks are one family) over the family's last
``guard_window`` batches, so that the evidence of one round over sibling tasks is enough to
decide, where a single task's own batches would take several rounds. While the cold model is
still in its warm-up (MetaSchedule's XGBModel predicts at random below 100 samples) it is credited
with a random model's expected accuracy, 0.5, rather than with its luck on the batch. When the
cold model ranks the family's batches better by more than ``guard_margin`` plus ``guard_z``
times the spread a random ranking would show over the same batches (:func:`prefers_cold`; a
first version without that band switched ResNet-18's convolutions to the random model and back
on single batches of 11), predictions for the family come from the cold model (and switch back
when the transferred one recovers).
:attr:`TransferCostModel.guard_log` keeps every decision for reports.
"""

from __future__ import annotations

import logging
import math
import os
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any

import numpy as np
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.cost_model import PyCostModel

from compiler.keys import workload_key
from compiler.task_family import workload_family
from cost_model.booster import (
    BoosterConfig,
    booster_from_bytes,
    booster_to_bytes,
    predict,
    train_booster,
)
from cost_model.dataset import throughput_labels
from cost_model.features import FeatureCache
from cost_model.metrics import pairwise_counts
from db.types import mean_run_secs

logger = logging.getLogger("tunehub.cost_model")


@dataclass(frozen=True)
class GuardDecision:
    """One measured batch as the guard saw it; the accuracies are the family's window's."""

    workload: str
    family: str
    transfer_accuracy: float
    cold_accuracy: float
    uses_cold: bool


def _warmed_up(cold: Any) -> bool:
    """Whether ``cold`` predicts from a trained model (MetaSchedule's XGBModel: once it holds
    ``num_warmup_samples`` samples; a model without these attributes counts as trained)."""
    warmup = getattr(cold, "num_warmup_samples", 0)
    return getattr(cold, "data_size", warmup) >= warmup


def measured_costs(results: list[Any]) -> np.ndarray:
    """Mean run time of each ``RunnerResult``; ``inf`` for a failed candidate."""
    means = [mean_run_secs(result) for result in results]
    return np.array([np.inf if m is None else m for m in means], dtype=np.float64)


class RankWindow:
    """Pairwise rank counts of the last ``size`` scored batches, and how much a random ranking's
    accuracy would spread over them."""

    def __init__(self, size: int) -> None:
        self.batches: deque[tuple[float, int, int]] = deque(maxlen=size)

    def add(self, correct: float, total: int, candidates: int) -> None:
        """One batch: ``correct`` of ``total`` comparable pairs among ``candidates``."""
        if total:
            self.batches.append((correct, total, candidates))

    @property
    def pairs(self) -> int:
        return sum(t for _, t, _ in self.batches)

    @property
    def accuracy(self) -> float:
        total = self.pairs
        return sum(c for c, _, _ in self.batches) / total if total else float("nan")

    @property
    def chance_sd(self) -> float:
        """Standard deviation of :attr:`accuracy` under a random ranking: Kendall's null variance
        of the correct pairs among n candidates, ``n(n-1)(2n+5)/72``, summed over the
        (independent) batches. Pairs within a batch share candidates, so one batch of 11 (55
        pairs) spreads by 0.12, not the 0.07 of 55 independent pairs."""
        total = self.pairs
        variance = sum(n * (n - 1) * (2 * n + 5) / 72 for _, _, n in self.batches)
        return math.sqrt(variance) / total if total else math.inf


def prefers_cold(
    transfer: RankWindow,
    cold: RankWindow,
    uses_cold: bool,
    *,
    margin: float,
    z: float,
    min_pairs: int,
) -> bool:
    """The guard's decision for one family: whether its next predictions come from the cold model.

    Switches to cold when the cold window's accuracy beats the transferred one's by more than
    ``margin + z * transfer.chance_sd`` (and back when the transferred one leads by as much);
    keeps ``uses_cold`` while the window has fewer than ``min_pairs`` pairs or the gap is within
    that band.
    """
    if transfer.pairs < min_pairs:
        return uses_cold
    gap = cold.accuracy - transfer.accuracy
    band = margin + z * transfer.chance_sd
    if not uses_cold and gap > band:
        return True
    if uses_cold and gap < -band:
        return False
    return uses_cold


@derived_object
class TransferCostModel(PyCostModel):
    """A MetaSchedule cost model warm-started from a booster trained on the database.

    Args:
        base_booster: the transferred ``xgb.Booster`` (never modified), or None to learn from the
            run's measurements alone: random predictions (as MetaSchedule's XGBModel below its
            warm-up) until the first fit, then a booster trained from scratch on the run's data.
        config: booster settings (the objective must match the one ``base_booster`` was
            trained with).
        cold: MetaSchedule's cost model to compare with and fall back to (default: a fresh
            ``ms.cost_model.XGBModel``).
        guard_window: batches per workload family the rank comparison looks back over.
        guard_margin: how much better (pairwise accuracy) the cold model must rank to be used.
        guard_min_pairs: comparable pairs needed in the family's window before any switch.
        guard_z: how many standard deviations of a random ranking's accuracy
            (:attr:`RankWindow.chance_sd`) the gap must exceed on top of ``guard_margin``.
    """

    def __init__(
        self,
        base_booster: Any,
        config: BoosterConfig,
        *,
        cold: Any | None = None,
        guard_window: int = 8,
        guard_margin: float = 0.03,
        guard_min_pairs: int = 20,
        guard_z: float = 1.5,
    ) -> None:
        super().__init__()
        self.base_booster = base_booster
        self.booster = base_booster
        self.config = config
        self.features = FeatureCache()
        self.cold = cold or ms.cost_model.XGBModel(
            num_tuning_cores=max(1, len(os.sched_getaffinity(0))), verbose_eval=0
        )
        self.guard_window = guard_window
        self.guard_margin = guard_margin
        self.guard_min_pairs = guard_min_pairs
        self.guard_z = guard_z
        self.guard_log: list[GuardDecision] = []
        self._transfer_rank: dict[str, RankWindow] = defaultdict(lambda: RankWindow(guard_window))
        self._cold_rank: dict[str, RankWindow] = defaultdict(lambda: RankWindow(guard_window))
        self._uses_cold: dict[str, bool] = {}
        self._features: dict[str, list[np.ndarray]] = defaultdict(list)
        self._costs: dict[str, list[np.ndarray]] = defaultdict(list)
        self._samples = 0
        self._last_fine_tune = 0
        self._keys: dict[int, tuple[str, str]] = {}

    # -- PyCostModel -----------------------------------------------------------------------
    def load(self, path: str) -> None:
        with open(path, "rb") as file:
            self.booster = self.base_booster = booster_from_bytes(file.read())

    def save(self, path: str) -> None:
        if self.booster is None:
            raise ValueError("nothing to save: no base booster and no measurements learned yet")
        with open(path, "wb") as file:
            file.write(booster_to_bytes(self.booster))

    def predict(self, context: Any, candidates: list[Any]) -> np.ndarray:
        _, family = self._key(context)
        if self._uses_cold.get(family, False):
            return np.asarray(self.cold.predict(context, candidates), dtype=np.float64)
        return self._predict(self.features(context, candidates))

    def update(self, context: Any, candidates: list[Any], results: list[Any]) -> None:
        if not candidates:
            return
        key, family = self._key(context)
        features = self.features(context, candidates)
        costs = measured_costs(results)
        cold_scores = (
            np.asarray(self.cold.predict(context, candidates)) if _warmed_up(self.cold) else None
        )
        self._observe(key, family, self._predict(features), cold_scores, costs)
        self.cold.update(context, candidates, results)
        self._features[key].append(features)
        self._costs[key].append(costs)
        self._samples += len(costs)
        if self._samples - self._last_fine_tune >= max(16, self._last_fine_tune // 5):
            self._fine_tune()

    # -- internals -------------------------------------------------------------------------
    def _predict(self, features: np.ndarray) -> np.ndarray:
        if self.booster is None:  # nothing learned yet (no base booster)
            return np.random.uniform(0, 1, size=len(features))
        return predict(self.booster, features)

    def _key(self, context: Any) -> tuple[str, str]:
        """``(workload key, family)`` of a tuning context."""
        handle = context.mod.__hash__()
        keys = self._keys.get(handle)
        if keys is None:
            keys = self._keys[handle] = (
                workload_key(context.mod),
                workload_family(str(context.task_name or "main")),
            )
        return keys

    def _observe(
        self,
        key: str,
        family: str,
        transfer: np.ndarray,
        cold: np.ndarray | None,
        costs: np.ndarray,
    ) -> None:
        """Score one measured batch of workload ``key`` and decide for its ``family``
        (``cold=None``: the cold model is still random; credit it with half the pairs)."""
        correct, total = pairwise_counts(transfer, costs)
        self._transfer_rank[family].add(correct, total, len(costs))
        if cold is None:
            self._cold_rank[family].add(total / 2, total, len(costs))
        else:
            self._cold_rank[family].add(*pairwise_counts(cold, costs), len(costs))
        t_window, c_window = self._transfer_rank[family], self._cold_rank[family]
        uses_cold = prefers_cold(
            t_window,
            c_window,
            self._uses_cold.get(family, False),
            margin=self.guard_margin,
            z=self.guard_z,
            min_pairs=self.guard_min_pairs,
        )
        if uses_cold != self._uses_cold.get(family, False):
            logger.info(
                "cost model for %s: %s (rank accuracy transfer %.2f, cold %.2f)",
                family,
                "cold" if uses_cold else "transferred",
                t_window.accuracy,
                c_window.accuracy,
            )
        self._uses_cold[family] = uses_cold
        self.guard_log.append(
            GuardDecision(key, family, t_window.accuracy, c_window.accuracy, uses_cold)
        )

    def _fine_tune(self) -> None:
        keys = list(self._features)
        features = np.concatenate([np.concatenate(self._features[k]) for k in keys])
        costs = np.concatenate([np.concatenate(self._costs[k]) for k in keys])
        groups = np.concatenate(
            [np.full(sum(len(c) for c in self._costs[k]), i) for i, k in enumerate(keys)]
        )
        labels = throughput_labels(costs, groups)
        if not labels.any():
            return
        rounds = self.config.fine_tune_rounds if self.base_booster is not None else None
        self.booster = train_booster(
            features, labels, groups, self.config, base=self.base_booster, rounds=rounds
        )
        self._last_fine_tune = self._samples
