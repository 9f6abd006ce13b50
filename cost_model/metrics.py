"""Ranking quality of cost-model scores against measured costs, within workloads.

All functions take ``scores`` (higher predicts faster) and ``costs`` (measured seconds; ``inf`` for
failures) of the candidates of *one* workload, or arrays plus ``groups`` for several; pairs and
top-k sets never mix workloads.
"""

from __future__ import annotations

import numpy as np


def pairwise_counts(scores: np.ndarray, costs: np.ndarray) -> tuple[int, int]:
    """``(correctly ordered pairs, comparable pairs)`` among candidates of one workload.

    A pair is comparable when the two costs differ (two failures tie); it is ordered correctly
    when the faster candidate has the higher score (a score tie counts as half, rounded down
    over the whole set).
    """
    if len(costs) < 2:
        return 0, 0
    # +1 where i is slower than j, -1 where faster, 0 for equal costs (two failures included)
    cost_diff = (costs[:, None] > costs[None, :]).astype(int) - (costs[:, None] < costs[None, :])
    score_diff = np.sign(scores[None, :] - scores[:, None])  # +1 where j scored above i
    upper = np.triu(np.ones_like(cost_diff, dtype=bool), k=1)
    comparable = upper & (cost_diff != 0)
    agree = (cost_diff == score_diff) & comparable
    ties = (score_diff == 0) & comparable
    total = int(comparable.sum())
    return int(agree.sum() + ties.sum() // 2), total


def pairwise_accuracy(scores: np.ndarray, costs: np.ndarray, groups: np.ndarray) -> float:
    """Fraction of comparable same-workload pairs that ``scores`` orders correctly (nan if none)."""
    correct = total = 0
    for group in np.unique(groups):
        rows = groups == group
        c, t = pairwise_counts(scores[rows], costs[rows])
        correct, total = correct + c, total + t
    return correct / total if total else float("nan")


def top_k_recall(scores: np.ndarray, costs: np.ndarray, groups: np.ndarray, k: int) -> float:
    """Mean over workloads of ``|predicted top-k ∩ measured top-k| / k``.

    The measured top-k are the k fastest valid candidates; the predicted top-k are the k highest
    scores among all candidates of the workload, failures included (a model that ranks a failure
    first loses recall). Workloads with fewer than ``k`` valid candidates are left out; nan if
    none is left.
    """
    recalls = []
    for group in np.unique(groups):
        rows = np.flatnonzero(groups == group)
        valid = rows[np.isfinite(costs[rows])]
        if len(valid) < k:
            continue
        true_top = set(valid[np.argsort(costs[valid], kind="stable")[:k]])
        predicted = set(rows[np.argsort(-scores[rows], kind="stable")[:k]])
        recalls.append(len(true_top & predicted) / k)
    return float(np.mean(recalls)) if recalls else float("nan")
