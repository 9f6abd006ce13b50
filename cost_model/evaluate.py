"""Offline evaluation: how well a transferred model ranks workloads it never saw.

Protocol (:func:`evaluate`): the target's workloads are split into ``folds`` groups. For each
fold, a booster per objective is trained on the records of the other folds' workloads. Each
held-out workload's records, in measurement order, are split in half: the first half is the
"history" a tuning run would have measured, the second half the test candidates. For
``seen`` in ``history_sizes`` (0 = a run that has measured nothing of this workload yet):

- ``cold``: MetaSchedule's own ``XGBModel``, updated with the first ``seen`` history records
  through its public ``update`` and asked to ``predict`` the test candidates (it predicts at
  random until it holds 100 samples, as it does in a real run);
- ``transfer/<objective>``: the transferred booster, fine-tuned on the first ``seen`` history
  records as :class:`cost_model.transfer.TransferCostModel` does during tuning.

Metrics on the test candidates (:mod:`cost_model.metrics`): pairwise rank accuracy, top-1 and
top-5 recall, averaged over held-out workloads (each workload weighs the same).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import tvm
from tvm.s_tir import meta_schedule as ms

from cost_model.booster import OBJECTIVES, BoosterConfig, predict, train_booster
from cost_model.dataset import TrainingSet, throughput_labels
from cost_model.features import records_to_candidates, tune_context
from cost_model.metrics import pairwise_accuracy, top_k_recall


@dataclass(frozen=True)
class EvalRow:
    """Mean metrics of one model at one history size over the held-out workloads."""

    model: str
    seen: int
    workloads: int
    pairwise: float
    top1: float
    top5: float


def _runner_results(costs: np.ndarray) -> list:
    return [
        ms.runner.RunnerResult(run_secs=[float(c)], error_msg=None)
        if np.isfinite(c)
        else ms.runner.RunnerResult(run_secs=None, error_msg="failed")
        for c in costs
    ]


def _metrics(scores: np.ndarray, costs: np.ndarray) -> tuple[float, float, float]:
    groups = np.zeros(len(costs), dtype=np.int32)
    return (
        pairwise_accuracy(scores, costs, groups),
        top_k_recall(scores, costs, groups, 1),
        top_k_recall(scores, costs, groups, 5),
    )


def _held_out_candidates(storage, target, key: str, record_ids: np.ndarray):
    """Replayed candidates of the given records of workload ``key``, in ``record_ids`` order."""
    workload = storage.get_workload(key)
    mod = tvm.ir.load_json(workload.mod_json)
    rows = {r.id: r for r in storage.get_records([int(i) for i in record_ids])}
    ordered = [rows[int(i)] for i in record_ids]
    candidates, kept = records_to_candidates(
        mod, ((r.trace_json, r.args_info_json) for r in ordered)
    )
    return tune_context(mod, target.spec().tvm_target()), candidates, kept


def evaluate(
    storage,
    target,
    training_set: TrainingSet,
    *,
    folds: int = 4,
    history_sizes: Sequence[int] = (0, 32, 128),
    min_records: int = 40,
    config: BoosterConfig | None = None,
    seed: int = 0,
) -> list[EvalRow]:
    """Evaluate transferred boosters (every objective) against MetaSchedule's cold XGBModel.

    Args:
        storage: the :class:`db.TuningStorage` the training set was read from.
        target: its :class:`db.TargetRecord`.
        training_set: every record of ``target`` (:func:`cost_model.dataset.extend_training_set`).
        folds: workload folds (at least 2).
        history_sizes: records of the held-out workload a model may learn from first.
        min_records: workloads with fewer records are never held out (too few to rank).

    Raises ``ValueError`` when fewer than ``folds`` workloads have ``min_records`` records.
    """
    config = config or BoosterConfig()
    counts = np.bincount(training_set.groups, minlength=len(training_set.workload_keys))
    eligible = [g for g in range(len(training_set.workload_keys)) if counts[g] >= min_records]
    if len(eligible) < max(2, folds):
        raise ValueError(
            f"need {max(2, folds)} workloads with at least {min_records} records; "
            f"the database has {len(eligible)}"
        )
    rng = np.random.default_rng(seed)
    np.random.seed(seed)  # XGBModel's random warm-up predictions
    order = rng.permutation(eligible)
    results: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    labels = throughput_labels(training_set.costs, training_set.groups)
    for fold in range(folds):
        held_out = set(order[fold::folds].tolist())
        train_rows = ~np.isin(training_set.groups, list(held_out))
        boosters = {
            objective: train_booster(
                training_set.features[train_rows],
                labels[train_rows],
                training_set.groups[train_rows],
                replace(config, objective=objective),
            )
            for objective in OBJECTIVES
        }
        for group in held_out:
            rows = np.flatnonzero(training_set.groups == group)  # record-id order
            half = len(rows) // 2
            history, test = rows[:half], rows[half:]
            features, costs = training_set.features, training_set.costs
            context, candidates, kept = _held_out_candidates(
                storage, target, training_set.workload_keys[group], training_set.record_ids[rows]
            )
            by_row = dict(zip((rows[i] for i in kept), candidates, strict=True))
            for seen in history_sizes:
                if seen > len(history):
                    continue
                seen_rows = history[:seen]
                cold = ms.cost_model.XGBModel(
                    num_tuning_cores=max(1, len(os.sched_getaffinity(0))), verbose_eval=0
                )
                if seen:
                    known = [r for r in seen_rows if r in by_row]
                    cold.update(context, [by_row[r] for r in known], _runner_results(costs[known]))
                test_known = [r for r in test if r in by_row]
                cold_scores = np.asarray(cold.predict(context, [by_row[r] for r in test_known]))
                results.setdefault(("cold", seen), []).append(
                    _metrics(cold_scores, costs[test_known])
                )
                for objective, booster in boosters.items():
                    tuned = booster
                    seen_labels = throughput_labels(costs[seen_rows], np.zeros(seen, np.int32))
                    if seen and seen_labels.any():
                        tuned = train_booster(
                            features[seen_rows],
                            seen_labels,
                            np.zeros(seen, np.int32),
                            replace(config, objective=objective),
                            base=booster,
                            rounds=config.fine_tune_rounds,
                        )
                    scores = predict(tuned, features[test_known])
                    results.setdefault((f"transfer/{objective}", seen), []).append(
                        _metrics(scores, costs[test_known])
                    )
    rows_out = []
    for (model, seen), values in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        array = np.array(values, dtype=np.float64)
        means = [
            float(np.nanmean(array[:, i])) if np.isfinite(array[:, i]).any() else float("nan")
            for i in range(3)
        ]
        rows_out.append(EvalRow(model, seen, len(values), *means))
    return rows_out
