"""The transferred cost model on a real tuning database (a few real MetaSchedule trials).

One small CNN tuned cold into a SQLite database once per session (``tuned_small_cnn``, shared
with other modules and copied here); the tests then extract
features from its records, train and persist a model, tune another model with it (the session's
``mlp_on_small_cnn``, shared with tests/tuner/test_sibling_seeds.py), check that
the negative-transfer guard falls back to MetaSchedule's cold model when the transferred one
ranks backwards, and drive the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

import db
from compiler.target import cpu_target
from cost_model.booster import BoosterConfig, predict, train_booster
from cost_model.dataset import extend_training_set, throughput_labels
from cost_model.features import (
    FEATURE_LENGTH,
    FeatureCache,
    candidate_features,
    records_to_candidates,
    tune_context,
)
from cost_model.store import load_model, maybe_retrain, save_model, train
from cost_model.transfer import (
    RankWindow,
    TransferCostModel,
    prefers_cold,
    workload_family,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, tuned_small_cnn):
    """A database holding one cold tuning run of the small CNN (6 tasks, 24 trials): this
    module's copy of the session's ``tuned_small_cnn`` (tests/conftest.py)."""
    assert tuned_small_cnn.summary.extra["cost_model"]["kind"] == "cold"
    work = tmp_path_factory.mktemp("cost-model")
    url = tuned_small_cnn.copy(work / "tune.db")
    storage = db.open_storage(url)
    target = cpu_target()
    yield storage, target, url, work
    storage.close()


@pytest.mark.slow
def test_training_set_persist_and_reload(tuned) -> None:
    storage, target, _, _ = tuned
    target_row = storage.get_target(target.key)
    records = storage.count_records(target_id=target_row.id)
    training_set = extend_training_set(storage, target_row)
    # Every stored record replays into one feature row, in record-id order.
    assert len(training_set) == records > 0
    assert training_set.features.shape == (records, FEATURE_LENGTH)
    assert np.isfinite(training_set.features).all()
    assert (np.diff(training_set.record_ids) > 0).all()
    labels = throughput_labels(training_set.costs, training_set.groups)
    assert ((labels >= 0) & (labels <= 1)).all() and labels.max() == 1.0
    # Nothing new since: extending is a no-op.
    assert extend_training_set(storage, target_row, training_set) is training_set

    model = train(training_set, BoosterConfig(rounds=20))
    model_id = save_model(storage, target, model)
    loaded = load_model(storage, target)
    assert loaded is not None and loaded.model_id == model_id
    assert loaded.n_samples == records and loaded.objective == "rank"
    np.testing.assert_array_equal(
        predict(loaded.booster, training_set.features),
        predict(model.booster, training_set.features),
    )
    # Too few new records since that model: no retraining.
    assert maybe_retrain(storage, target) is None


@pytest.mark.slow
def test_tune_with_transferred_model(mlp_on_small_cnn, tmp_path) -> None:
    """Another model (the MLP) tuned with the model trained on the small CNN's records: the
    session's ``mlp_on_small_cnn`` run (tests/conftest.py: the model trained and saved on a copy of
    ``tuned_small_cnn``'s database, then 16 trials with ``cost_model="transfer"``)."""
    summary = mlp_on_small_cnn.summary
    storage = db.open_storage(mlp_on_small_cnn.copy(tmp_path / "transfer.db"))
    try:
        saved = load_model(storage, cpu_target())
    finally:
        storage.close()
    info = summary.extra["cost_model"]
    assert saved.model_id == mlp_on_small_cnn.observed["model_id"]
    assert info["kind"] == "transfer" and info["model_id"] == saved.model_id
    assert info["batches_scored"] >= 1
    assert summary.trials_this_run >= 8 and summary.verification["passed"]


def _candidates(storage, target, rank: int = 0, task_name: str | None = None):
    """Replayed candidates and measured costs of the workload with the most valid records
    (``rank`` 1: the second most, ...), in a context named ``task_name`` when given."""
    target_row = storage.get_target(target.key)
    workloads = sorted(
        storage.list_workloads(target_id=target_row.id),
        key=lambda w: -storage.count_records(target_id=target_row.id, workload_id=w.id, valid=True),
    )
    chosen = workloads[rank]
    rows = storage.list_records(target_id=target_row.id, workload_id=chosen.id, limit=1000)
    mod = tvm.ir.load_json(chosen.mod_json)
    candidates, kept = records_to_candidates(mod, ((r.trace_json, r.args_info_json) for r in rows))
    costs = np.array([rows[i].mean_secs if rows[i].is_valid else np.inf for i in kept])
    context = tune_context(mod, target.tvm_target())
    if task_name is not None:
        context = ms.TuneContext(mod=mod, target=target.tvm_target(), task_name=task_name)
    return context, candidates, costs


def _results(costs: np.ndarray) -> list:
    return [
        ms.runner.RunnerResult(
            run_secs=[float(c)] if np.isfinite(c) else None,
            error_msg=None if np.isfinite(c) else "failed",
        )
        for c in costs
    ]


def _backwards_model(context, candidates, costs: np.ndarray):
    """A booster that learned the opposite of the measured order (negative transfer on purpose)
    and a guarded model starting from it that may switch on any evidence: ``(booster, model)``."""
    groups = np.zeros(len(costs), dtype=np.int32)
    backwards = train_booster(
        candidate_features(context, candidates),
        1.0 - throughput_labels(costs, groups),
        groups,
        BoosterConfig(objective="throughput", rounds=30),
    )
    model = TransferCostModel(
        backwards,
        BoosterConfig(objective="throughput", fine_tune_rounds=1),
        guard_min_pairs=1,
        guard_margin=0.0,
    )
    return backwards, model


@pytest.mark.slow
def test_feature_cache_extracts_each_schedule_once(tuned) -> None:
    storage, target, _, _ = tuned
    context, candidates, _ = _candidates(storage, target)
    other_context, others, _ = _candidates(storage, target, rank=1)
    distinct = len({tvm_ffi.structural_hash(c.sch.mod) for c in candidates})
    cache = FeatureCache(capacity=distinct + 1)
    # A population with every schedule twice: extracted once, same rows as without the cache.
    doubled = candidates + candidates[::-1]
    rows = cache(context, doubled)
    np.testing.assert_array_equal(rows, candidate_features(context, doubled))
    assert (cache.hits, cache.misses) == (len(doubled) - distinct, distinct)
    np.testing.assert_array_equal(cache(context, candidates[:3]), rows[:3])
    assert cache.misses == distinct
    # Another workload's schedules are other keys; the least recently used rows make room.
    np.testing.assert_array_equal(
        cache(other_context, others[:2]), candidate_features(other_context, others[:2])
    )
    assert cache.misses == distinct + 2 and len(cache._rows) == cache.capacity
    assert cache(context, []).shape == (0, FEATURE_LENGTH)


def test_workload_family_drops_operator_numbers() -> None:
    assert workload_family("fused_conv2d3_add3_add4_relu2") == "fused_conv2d_add_add_relu"
    assert workload_family("fused_conv2d_add_relu") == "fused_conv2d_add_relu"
    assert workload_family("fused_matmul4_add") == "fused_matmul_add"
    assert workload_family("fused_conv2d25_add20_tir_clip10") == "fused_conv2d_add_tir_clip"
    assert workload_family("softmax") == "softmax"


def test_guard_waits_until_the_gap_exceeds_chance() -> None:
    """One batch of 11 ranked at 0.40 is within a random ranking's spread; eight are not."""

    def windows(batches: int) -> tuple[RankWindow, RankWindow]:
        transfer, cold = RankWindow(8), RankWindow(8)
        for _ in range(batches):
            transfer.add(22, 55, 11)  # 0.40 of the 55 pairs of 11 candidates
            cold.add(27.5, 55, 11)  # a cold model still in its warm-up: credited 0.5
        return transfer, cold

    transfer, cold = windows(1)
    assert transfer.chance_sd == pytest.approx(np.sqrt(11 * 10 * 27 / 72) / 55)  # 0.117
    assert not prefers_cold(transfer, cold, False, margin=0.03, z=1.5, min_pairs=20)
    transfer, cold = windows(8)
    assert transfer.chance_sd == pytest.approx(0.117 / np.sqrt(8), abs=1e-3)
    assert prefers_cold(transfer, cold, False, margin=0.03, z=1.5, min_pairs=20)
    # Too few pairs: no decision either way; on cold, a small lead of the transfer keeps cold.
    assert prefers_cold(transfer, cold, True, margin=0.03, z=1.5, min_pairs=1000)
    even = RankWindow(8)
    for _ in range(8):
        even.add(30, 55, 11)
    assert prefers_cold(even, cold, True, margin=0.03, z=1.5, min_pairs=20)


@pytest.mark.slow
def test_guard_decides_for_the_whole_family(tuned) -> None:
    """Evidence from one task's batch moves its siblings (same family, other shapes) to the cold
    model at once; a task of another family keeps the transferred one."""
    storage, target, _, _ = tuned
    first, candidates, costs = _candidates(storage, target, 0, "fused_conv2d_add_relu")
    sibling, sibling_candidates, _ = _candidates(storage, target, 1, "fused_conv2d7_add4_relu3")
    other, other_candidates, _ = _candidates(storage, target, 2, "fused_matmul_add")
    backwards, model = _backwards_model(first, candidates, costs)
    np.random.seed(0)
    model.update(first, candidates, _results(costs))
    decision = model.guard_log[-1]
    assert decision.family == "fused_conv2d_add_relu" and decision.uses_cold
    # MetaSchedule's XGBModel is still in its warm-up (random): credited with exactly 0.5.
    assert decision.cold_accuracy == 0.5 and decision.transfer_accuracy < 0.5
    expected_other = predict(backwards, candidate_features(other, other_candidates))
    np.testing.assert_allclose(model.predict(other, other_candidates), expected_other)
    # The sibling, never measured in this run, now gets the cold model's (random) scores.
    expected_sibling = predict(backwards, candidate_features(sibling, sibling_candidates))
    assert not np.allclose(model.predict(sibling, sibling_candidates), expected_sibling)


@pytest.mark.slow
def test_guard_falls_back_to_cold_model_when_transfer_ranks_backwards(tuned) -> None:
    storage, target, _, _ = tuned
    context, candidates, costs = _candidates(storage, target)
    assert np.isfinite(costs).sum() >= 3
    _, model = _backwards_model(context, candidates, costs)
    results = _results(costs)
    np.random.seed(0)
    model.update(context, candidates, results)
    decision = model.guard_log[-1]
    assert decision.transfer_accuracy < 0.5 and decision.uses_cold
    # Predictions for that workload now come from MetaSchedule's cold model.
    assert len(model.predict(context, candidates)) == len(candidates)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        cwd=REPO,
        text=True,
        capture_output=True,
        env={**os.environ},
        timeout=600,
    )


@pytest.mark.slow
def test_cli_train_and_refusals(tuned, tmp_path, example_model) -> None:
    _, _, url, _ = tuned
    done = _cli("cost-model", "train", "--db", url, "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["records"] > 0 and summary["model_id"] > 0
    # Evaluation needs several workloads with enough records: a clear refusal, exit 2.
    done = _cli("cost-model", "eval", "--db", url, "--min-records", "1000")
    assert done.returncode == 2 and "workloads with at least 1000 records" in done.stderr
    # A database without a trained model cannot tune with --cost-model transfer.
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    db.open_storage(empty, upgrade=True).close()
    done = _cli(
        "tune",
        str(example_model("mlp", "onnx")),
        "--trials",
        "4",
        "--db",
        empty,
        "--cost-model",
        "transfer",
    )
    assert done.returncode == 2 and "no trained cost model" in done.stderr
    assert db.open_storage(empty).count_jobs() == 0


@pytest.mark.slow
def test_no_base_booster_learns_from_the_run_alone(tuned) -> None:
    """Without a transferred booster: random scores until the first fit, then the run's order."""
    storage, target, _, work = tuned
    context, candidates, costs = _candidates(storage, target)
    finite = np.isfinite(costs)
    assert finite.sum() >= 3
    # Guard off: it could hand this workload to the cold model (both rank at random at first).
    model = TransferCostModel(None, BoosterConfig(rounds=30), guard_min_pairs=10**9)
    np.random.seed(0)
    before = model.predict(context, candidates)
    assert before.shape == (len(candidates),) and model.booster is None
    with pytest.raises(ValueError, match="nothing to save"):
        model.save(str(work / "none.bin"))
    results = _results(costs)
    for _ in range(max(1, -(-16 // len(candidates)))):  # at least 16 samples: the first fit
        model.update(context, candidates, results)
    assert model.booster is not None and model.base_booster is None
    assert model.booster.num_boosted_rounds() == 30  # trained from scratch, full rounds
    expected = predict(model.booster, candidate_features(context, candidates))
    assert np.allclose(model.predict(context, candidates), expected)
