"""Fixed-length candidate features from MetaSchedule's ``PerStoreFeature``.

``PerStoreFeature`` gives one 164-float row per buffer store of a scheduled TIR function, so
candidates have different numbers of rows. MetaSchedule's own XGBModel sums per-row predictions
(its "pack-sum" objective); that ties the model to a custom objective. TuneHub instead folds the
rows of one candidate into one fixed-length vector (sum, max and mean over stores, plus the store
count, on ``log1p``-compressed values as ``PerStoreFeature`` emits them), which any XGBoost
objective accepts: squared error on normalized throughput as well as pairwise ranking with one
query group per workload.

A stored record becomes a candidate by replaying its trace on the workload's module
(:func:`records_to_candidates`). Replaying and extracting takes ~1–5 ms per record on one core;
:class:`cost_model.dataset.TrainingSet` keeps the resulting matrix so retraining only extracts
features for new records.

``FEATURE_VERSION`` names this layout; a persisted model whose feature version differs is never
loaded.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

from compiler.lowering.intrinsics import load_tensor_intrinsics
from cost_model.version import FEATURE_VERSION  # noqa: F401 - re-exported

_EXTRACTOR_ARGS = dict(
    buffers_per_store=5, arith_intensity_curve_num_samples=10, cache_line_bytes=64
)
STORE_FEATURES = 164
FEATURE_LENGTH = 3 * STORE_FEATURES + 1


def make_extractor() -> ms.feature_extractor.PerStoreFeature:
    """The per-store extractor whose output :func:`fold` expects (``FEATURE_VERSION``)."""
    return ms.feature_extractor.PerStoreFeature(**_EXTRACTOR_ARGS)


def fold(per_store: np.ndarray) -> np.ndarray:
    """Fold one candidate's ``[stores, 164]`` rows into a ``FEATURE_LENGTH`` vector.

    A candidate with no store rows (nothing to schedule) folds to zeros with a count of 0.
    """
    if per_store.ndim != 2 or per_store.shape[0] == 0:
        return np.zeros(FEATURE_LENGTH, dtype=np.float32)
    rows = per_store.astype(np.float32, copy=False)
    count = np.float32(np.log1p(rows.shape[0]))
    return np.concatenate([rows.sum(0), rows.max(0), rows.mean(0), [count]]).astype(np.float32)


def candidate_features(
    context: Any, candidates: Sequence[Any], extractor: Any | None = None
) -> np.ndarray:
    """Features of MetaSchedule ``MeasureCandidate`` objects of one tuning context.

    Returns a ``[len(candidates), FEATURE_LENGTH]`` float32 array (empty input, empty array).
    """
    if not candidates:
        return np.zeros((0, FEATURE_LENGTH), dtype=np.float32)
    extractor = extractor or make_extractor()
    rows = extractor.extract_from(context, list(candidates))
    return np.stack([fold(r.numpy()) for r in rows])


class FeatureCache:
    """:func:`candidate_features` that remembers the features of every scheduled module it saw.

    MetaSchedule's evolutionary search scores a population of ~512 candidates per generation,
    five generations a batch, and many of them are the same schedule again (a parent copied
    unmutated, the same parent sampled twice, the top candidates scored once more before being
    measured). Extracting ``PerStoreFeature`` costs ~5 ms per convolution candidate on one core,
    the structural hash that recognizes a repeat ~0.1 ms. Keys are the structural hash of the
    candidate's scheduled module (which includes the workload's shapes), so one cache serves all
    tasks of a run. At most ``capacity`` entries are kept, the least recently used dropped first.
    """

    def __init__(self, extractor: Any | None = None, capacity: int = 16384) -> None:
        self.extractor = extractor or make_extractor()
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self._rows: OrderedDict[int, np.ndarray] = OrderedDict()

    def __call__(self, context: Any, candidates: Sequence[Any]) -> np.ndarray:
        """Same contract as :func:`candidate_features`."""
        if not candidates:
            return np.zeros((0, FEATURE_LENGTH), dtype=np.float32)
        keys = [tvm_ffi.structural_hash(c.sch.mod) for c in candidates]
        missing = {}
        for index, key in enumerate(keys):
            if key in self._rows:
                self._rows.move_to_end(key)
            elif key not in missing:
                missing[key] = index
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        if missing:
            fresh = candidate_features(
                context, [candidates[i] for i in missing.values()], self.extractor
            )
            for key, row in zip(missing, fresh):
                self._rows[key] = row
        out = np.stack([self._rows[key] for key in keys])
        while len(self._rows) > self.capacity:
            self._rows.popitem(last=False)
        return out


def tune_context(mod: tvm.IRModule, target: tvm.target.Target) -> ms.TuneContext:
    """A bare tuning context for feature extraction (no space, no search strategy).

    Registers only the target's tensor intrinsics first: ``TuneContext`` would otherwise import
    every backend's (11-60 s, see :mod:`compiler.lowering.intrinsics`).
    """
    load_tensor_intrinsics("cuda" if target.kind.name == "cuda" else "cpu")
    return ms.TuneContext(mod=mod, target=target, task_name="features")


def records_to_candidates(
    mod: tvm.IRModule, traces: Iterable[tuple[str, str]]
) -> tuple[list[ms.MeasureCandidate], list[int]]:
    """Replay stored ``(trace_json, args_info_json)`` pairs on ``mod``.

    Returns the candidates and the positions (in ``traces``) they came from: a trace that no
    longer replays (e.g. written by another TVM version) is skipped rather than raised.
    """
    candidates: list[ms.MeasureCandidate] = []
    kept: list[int] = []
    for index, (trace_json, args_info_json) in enumerate(traces):
        try:
            sch = tvm.s_tir.Schedule(mod)
            tvm.s_tir.schedule.Trace.apply_json_to_schedule(json.loads(trace_json), sch)
            args = [ms.arg_info.ArgInfo.from_json(a) for a in json.loads(args_info_json)]
        except Exception:  # noqa: BLE001 - a trace that does not replay is skipped, by contract
            continue
        candidates.append(ms.MeasureCandidate(sch, args))
        kept.append(index)
    return candidates, kept
