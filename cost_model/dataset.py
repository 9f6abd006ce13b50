"""Training data for the cost model: every stored record of one target, as features and costs.

A :class:`TrainingSet` holds, per measured candidate, its folded ``PerStoreFeature`` vector, its
measured mean latency (``inf`` for a failed candidate), the workload it belongs to, and the
record id. :func:`extend_training_set` reads only records newer than the set's last id, so a set
persisted with a model (:mod:`cost_model.store`) is brought up to date by extracting features
for the new records alone.

Labels compare candidates within one workload (:func:`throughput_labels`): a candidate's
normalized throughput ``best_cost / cost`` in ``(0, 1]``, and 0 for a failure, so workloads of
very different sizes share one scale.
"""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import tvm

from cost_model.features import (
    FEATURE_LENGTH,
    candidate_features,
    make_extractor,
    records_to_candidates,
    tune_context,
)


@dataclass(frozen=True)
class TrainingSet:
    """Features and measured costs of stored candidates of one target.

    ``features[i]`` describes the candidate of record ``record_ids[i]`` of workload
    ``workload_keys[groups[i]]``; ``costs[i]`` is its mean latency in seconds (``inf`` if it
    failed). Rows are in record-id order.
    """

    features: np.ndarray  # [n, FEATURE_LENGTH] float32
    costs: np.ndarray  # [n] float64
    groups: np.ndarray  # [n] int32, index into workload_keys
    record_ids: np.ndarray  # [n] int64
    workload_keys: tuple[str, ...]

    @classmethod
    def empty(cls) -> TrainingSet:
        return cls(
            np.zeros((0, FEATURE_LENGTH), np.float32),
            np.zeros(0),
            np.zeros(0, np.int32),
            np.zeros(0, np.int64),
            (),
        )

    def __len__(self) -> int:
        return len(self.costs)

    @property
    def last_record_id(self) -> int:
        return int(self.record_ids.max()) if len(self) else 0

    def subset(self, mask: np.ndarray) -> TrainingSet:
        """The rows where ``mask`` is true (workload keys are kept as they are)."""
        return TrainingSet(
            self.features[mask],
            self.costs[mask],
            self.groups[mask],
            self.record_ids[mask],
            self.workload_keys,
        )

    def rows_of(self, keys: Iterable[str]) -> np.ndarray:
        """Boolean mask of the rows whose workload key is in ``keys``."""
        wanted = {i for i, key in enumerate(self.workload_keys) if key in set(keys)}
        return np.isin(self.groups, list(wanted))

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        np.savez_compressed(
            buffer,
            features=self.features,
            costs=self.costs,
            groups=self.groups,
            record_ids=self.record_ids,
            workload_keys=np.array(self.workload_keys, dtype="U16"),
        )
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, blob: bytes) -> TrainingSet:
        with np.load(io.BytesIO(blob), allow_pickle=False) as data:
            return cls(
                data["features"],
                data["costs"],
                data["groups"],
                data["record_ids"],
                tuple(str(k) for k in data["workload_keys"]),
            )


def throughput_labels(costs: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Normalized throughput per workload: ``min cost of the group / cost``, 0 for failures.

    A group with no valid candidate gets all zeros.
    """
    labels = np.zeros(len(costs), dtype=np.float64)
    for group in np.unique(groups):
        rows = groups == group
        finite = np.isfinite(costs[rows])
        if not finite.any():
            continue
        best = costs[rows][finite].min()
        labels[rows] = np.where(finite, best / np.where(finite, costs[rows], 1.0), 0.0)
    return labels


def extend_training_set(
    storage,
    target,
    previous: TrainingSet | None = None,
    *,
    progress: Callable[[int], None] | None = None,
) -> TrainingSet:
    """``previous`` plus the features of every record of ``target`` stored after it.

    Args:
        storage: a :class:`db.TuningStorage`.
        target: the :class:`db.TargetRecord` whose records to read.
        previous: a set built earlier for the same target (``None``: start empty).
        progress: called with the number of records processed so far, per workload.

    Records whose trace no longer replays are skipped. Raises only storage errors.
    """
    previous = previous or TrainingSet.empty()
    by_workload: dict[int, list] = defaultdict(list)
    after = previous.last_record_id
    while True:
        batch = storage.list_records(target_id=target.id, after_id=after, limit=2000)
        for row in batch:
            by_workload[row.workload_id].append(row)
        if len(batch) < 2000:
            break
        after = batch[-1].id
    if not by_workload:
        return previous
    tvm_target = target.spec().tvm_target()
    extractor = make_extractor()
    keys = list(previous.workload_keys)
    key_index = {key: i for i, key in enumerate(keys)}
    parts = [(previous.features, previous.costs, previous.groups, previous.record_ids)]
    done = 0
    for workload_id, rows in by_workload.items():
        workload = storage.get_workload_by_id(workload_id)
        mod = tvm.ir.load_json(workload.mod_json)
        candidates, kept = records_to_candidates(
            mod, ((r.trace_json, r.args_info_json) for r in rows)
        )
        done += len(rows)
        if not candidates:
            continue
        features = candidate_features(tune_context(mod, tvm_target), candidates, extractor)
        kept_rows = [rows[i] for i in kept]
        if workload.key not in key_index:
            key_index[workload.key] = len(keys)
            keys.append(workload.key)
        parts.append(
            (
                features,
                np.array(
                    [r.mean_secs if r.is_valid and r.mean_secs else np.inf for r in kept_rows]
                ),
                np.full(len(kept_rows), key_index[workload.key], dtype=np.int32),
                np.array([r.id for r in kept_rows], dtype=np.int64),
            )
        )
        if progress:
            progress(done)
    features, costs, groups, ids = (np.concatenate(p) for p in zip(*parts, strict=True))
    order = np.argsort(ids, kind="stable")
    return TrainingSet(
        features[order].astype(np.float32),
        costs[order].astype(np.float64),
        groups[order].astype(np.int32),
        ids[order].astype(np.int64),
        tuple(keys),
    )
