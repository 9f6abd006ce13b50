"""Ranking metrics on hand-made scores and costs."""

from __future__ import annotations

import math

import numpy as np

from cost_model.dataset import throughput_labels
from cost_model.metrics import pairwise_accuracy, pairwise_counts, top_k_recall

INF = np.inf


def test_pairwise_counts_perfect_inverted_and_failures() -> None:
    costs = np.array([1.0, 2.0, 3.0, INF])
    assert pairwise_counts(np.array([4.0, 3.0, 2.0, 1.0]), costs) == (6, 6)
    assert pairwise_counts(np.array([1.0, 2.0, 3.0, 4.0]), costs) == (0, 6)
    # Two failures tie: that pair is not comparable.
    assert pairwise_counts(np.array([2.0, 1.0, 0.0]), np.array([1.0, INF, INF])) == (2, 2)


def test_pairwise_accuracy_never_mixes_workloads() -> None:
    # Within each workload the order is right; across workloads it would be wrong.
    scores = np.array([10.0, 9.0, 1.0, 0.0])
    costs = np.array([5.0, 6.0, 1.0, 2.0])
    groups = np.array([0, 0, 1, 1])
    assert pairwise_accuracy(scores, costs, groups) == 1.0
    assert math.isnan(pairwise_accuracy(scores[:1], costs[:1], groups[:1]))


def test_top_k_recall_counts_failures_ranked_first_as_misses() -> None:
    costs = np.array([1.0, 2.0, 3.0, INF, 5.0, 6.0])
    groups = np.zeros(6, dtype=int)
    assert top_k_recall(np.array([6.0, 5, 4, 0, 2, 1]), costs, groups, 1) == 1.0
    assert top_k_recall(np.array([1.0, 5, 4, 9, 2, 0]), costs, groups, 1) == 0.0
    assert top_k_recall(np.array([6.0, 5, 4, 3, 2, 1]), costs, groups, 5) == 0.8
    assert math.isnan(top_k_recall(np.ones(6), costs, groups, 6))


def test_throughput_labels_are_per_workload_and_zero_for_failures() -> None:
    labels = throughput_labels(np.array([2.0, 4.0, INF, 10.0, 20.0]), np.array([0, 0, 0, 1, 1]))
    assert labels.tolist() == [1.0, 0.5, 0.0, 1.0, 0.5]
    assert throughput_labels(np.array([INF, INF]), np.array([0, 0])).tolist() == [0.0, 0.0]
