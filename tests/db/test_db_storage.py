"""The storage contract on both backends: records, duplicates, top-k, jobs and the rest."""

from __future__ import annotations

import dataclasses

import pytest

import db
from db import JobStatus, NewJobTask, NewTuningRecord


@pytest.fixture
def ids(storage, target):
    t = storage.ensure_target(target)
    w = storage.ensure_workload("00000000000000aa", '{"nodes":[]}', flops=2.0, summary="wl a")
    return w.id, t.id


def rec(ids, name: str, run_secs, **kw) -> NewTuningRecord:
    return NewTuningRecord(ids[0], ids[1], f'[["{name}"]]', run_secs, **kw)


def test_targets_and_workloads_are_idempotent(storage, target, other_targets):
    first = storage.ensure_target(target)
    assert storage.ensure_target(target) == first
    assert first.key == target.key and first.spec() == target
    other = storage.ensure_target(other_targets["one_core"])
    assert other.id != first.id
    assert [t.key for t in storage.list_targets()] == [target.key, other_targets["one_core"].key]
    assert storage.get_target(target.key) == first
    assert storage.get_target("ffffffffffffffff") is None
    assert storage.get_target_by_id(first.id).key == target.key

    w = storage.ensure_workload("00000000000000aa", "{}", flops=3.0, summary="s")
    again = storage.ensure_workload("00000000000000aa", "{other}", flops=9.0)
    assert again == w and again.flops == 3.0  # first writer wins
    assert storage.get_workload("00000000000000aa") == w
    assert storage.get_workload_by_id(w.id) == w
    assert storage.workload_ids(["00000000000000aa", "nope"]) == {"00000000000000aa": w.id}
    assert dataclasses.is_dataclass(w)
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.key = "x"  # type: ignore[misc]


def test_top_k_is_best_first_valid_only(storage, ids):
    storage.commit_records(
        [
            rec(ids, "slow", [3e-3, 3e-3]),
            rec(ids, "fast", [1e-3, 1.2e-3]),
            rec(ids, "mid", [2e-3]),
            rec(ids, "broken", [1e10]),
            rec(ids, "none", None, error_text="build failed"),
        ]
    )
    top = storage.top_k(*ids, 10)
    assert [r.trace_json for r in top] == ['[["fast"]]', '[["mid"]]', '[["slow"]]']
    assert top[0].mean_secs == pytest.approx(1.1e-3)
    assert top[0].run_secs == (1e-3, 1.2e-3)
    assert [r.trace_json for r in storage.top_k(*ids, 2)] == ['[["fast"]]', '[["mid"]]']
    assert storage.top_k(*ids, 0) == []
    assert storage.best_record(*ids).trace_json == '[["fast"]]'
    assert storage.count_records() == 5
    assert storage.count_records(valid=True) == 3
    assert storage.count_records(valid=False) == 2
    failed = storage.get_record(*ids, db.trace_hash('[["none"]]'))
    assert failed.is_valid is False and failed.mean_secs is None
    assert failed.error_text == "build failed"
    every = list(storage.iter_records(batch_size=2))  # id order, fetched in batches
    assert [r.id for r in every] == sorted(r.id for r in every)
    assert {r.trace_json for r in every} == {
        '[["slow"]]',
        '[["fast"]]',
        '[["mid"]]',
        '[["broken"]]',
        '[["none"]]',
    }
    assert len(list(storage.iter_records(valid_only=True))) == 3


def test_duplicates_keep_the_better_measurement(storage, ids):
    storage.commit_record(rec(ids, "a", [5e-3], worker="w1"))
    storage.commit_record(rec(ids, "a", [7e-3], worker="w2"))  # worse: ignored
    row = storage.get_record(*ids, db.trace_hash('[["a"]]'))
    assert row.mean_secs == 5e-3 and row.worker == "w1"
    storage.commit_record(rec(ids, "a", [4e-3], worker="w3"))  # better: replaces
    row = storage.get_record(*ids, db.trace_hash('[["a"]]'))
    assert row.mean_secs == 4e-3 and row.worker == "w3"
    storage.commit_record(rec(ids, "a", [1e10]))  # a failure never replaces a measurement
    assert storage.get_record(*ids, db.trace_hash('[["a"]]')).mean_secs == 4e-3

    storage.commit_record(rec(ids, "b", [1e10]))
    storage.commit_record(rec(ids, "b", None, error_text="runner timeout"))  # annotates
    row = storage.get_record(*ids, db.trace_hash('[["b"]]'))
    assert not row.is_valid and row.error_text == "runner timeout"
    storage.commit_record(rec(ids, "b", [2e-3]))  # a retry that worked replaces the failure
    row = storage.get_record(*ids, db.trace_hash('[["b"]]'))
    assert row.is_valid and row.mean_secs == 2e-3

    # Duplicates inside one batch, and the same batch twice.
    batch = [rec(ids, "c", [9e-3]), rec(ids, "c", [8e-3]), rec(ids, "c", [1e10])]
    storage.commit_records(batch)
    storage.commit_records(batch)
    assert storage.get_record(*ids, db.trace_hash('[["c"]]')).mean_secs == 8e-3
    assert storage.count_records() == 3


def test_records_are_scoped_by_target(storage, ids, other_targets):
    other = storage.ensure_target(other_targets["one_core"])
    storage.commit_record(rec(ids, "x", [1e-3]))
    storage.commit_record(NewTuningRecord(ids[0], other.id, '[["x"]]', (5e-4,)))
    assert storage.count_records() == 2  # same trace, two targets: two rows
    assert storage.top_k(*ids, 5)[0].mean_secs == 1e-3
    assert storage.top_k(ids[0], other.id, 5)[0].mean_secs == 5e-4
    stats = storage.stats()
    assert stats.records_valid == 2 and stats.targets == 2 and stats.workloads == 1
    assert {(s.target.id, s.records_valid) for s in stats.per_target} == {
        (ids[1], 1),
        (other.id, 1),
    }
    assert [w.id for w in storage.list_workloads(target_id=other.id)] == [ids[0]]


def test_unknown_workload_is_a_conflict(storage, ids):
    with pytest.raises(db.ConflictError):
        storage.commit_record(NewTuningRecord(987654, ids[1], "[]", (1e-3,)))


def test_job_state_machine(storage, ids):
    job = storage.create_job(target_id=ids[1], trial_budget=64, owner="alice", priority=5)
    assert job.status == JobStatus.QUEUED and job.trials_done == 0 and job.started_at is None
    with pytest.raises(db.InvalidTransitionError):
        storage.transition_job(job.id, JobStatus.SUCCEEDED)  # queued -> succeeded: no
    running = storage.transition_job(job.id, JobStatus.RUNNING, expected=JobStatus.QUEUED)
    assert running.status == "running" and running.started_at is not None
    # A second claimer loses the compare-and-set.
    with pytest.raises(db.InvalidTransitionError) as info:
        storage.transition_job(job.id, JobStatus.RUNNING, expected=JobStatus.QUEUED)
    assert info.value.current == "running"
    assert storage.add_job_trials(job.id, 8).trials_done == 8
    assert storage.add_job_trials(job.id, 8).trials_done == 16
    requeued = storage.transition_job(job.id, JobStatus.QUEUED)  # worker died
    assert requeued.status == "queued"
    storage.transition_job(job.id, JobStatus.RUNNING)
    failed = storage.transition_job(job.id, JobStatus.FAILED, error="out of memory")
    assert failed.error == "out of memory" and failed.finished_at is not None
    for status in JobStatus.ALL:
        with pytest.raises(db.InvalidTransitionError):
            storage.transition_job(job.id, status)  # final
    with pytest.raises(db.NotFoundError):
        storage.transition_job(424242, JobStatus.RUNNING)
    with pytest.raises(db.StorageError):
        storage.transition_job(job.id, "paused")
    assert [j.id for j in storage.list_jobs(status="failed")] == [job.id]
    assert storage.get_job(job.id) == storage.list_jobs()[0]


def test_job_tasks_and_leases(storage, ids):
    job = storage.create_job(target_id=ids[1], trial_budget=10)
    (task,) = storage.add_job_tasks(
        job.id, [NewJobTask(workload_id=ids[0], name="fused_matmul", weight=2, trial_budget=10)]
    )
    assert task.status == "queued" and task.leased_by is None
    leased = storage.transition_job_task(task.id, "running", leased_by="w1", lease_seconds=60)
    assert leased.leased_by == "w1" and leased.lease_expires_at is not None
    progress = storage.update_job_task_progress(task.id, trials_done=4, best_mean_secs=2e-3)
    assert progress.trials_done == 4 and progress.best_mean_secs == 2e-3
    progress = storage.update_job_task_progress(task.id, best_mean_secs=3e-3)  # never worse
    assert progress.best_mean_secs == 2e-3
    done = storage.transition_job_task(task.id, "succeeded", expected="running")
    assert done.status == "succeeded" and done.leased_by is None
    assert storage.list_job_tasks(job.id) == [done]


def test_models_workers_artifacts_cost_models_tokens(storage, ids):
    m = storage.add_model(
        content_hash="ab" * 32, format="onnx", filename="m.onnx", size=10, owner="bob"
    )
    assert (
        storage.add_model(
            content_hash="ab" * 32, format="onnx", filename="again.onnx", size=10, owner="bob"
        )
        == m
    )
    storage.set_model_workloads(m.id, [db.ModelWorkload(m.id, ids[0], "fused_dense", 3)])
    assert storage.model_workloads(m.id) == [db.ModelWorkload(m.id, ids[0], "fused_dense", 3)]
    assert storage.list_models(owner="bob") == [m] and storage.get_model(m.id) == m

    w = storage.register_worker("w1", fingerprint_json='{"cores":2}', target_id=ids[1])
    assert w.last_heartbeat is not None and w.status == "idle"
    assert storage.register_worker("w1").id == w.id
    assert storage.heartbeat(w.id, status="busy").status == "busy"
    assert [x.name for x in storage.list_workers()] == ["w1"]

    job = storage.create_job(target_id=ids[1], trial_budget=1, model_id=m.id)
    a = storage.add_artifact(job_id=job.id, path="/x/model.so", sha256="cd" * 32, size=123)
    assert storage.list_artifacts(job.id) == [a] and a.verified is False

    storage.save_cost_model(
        target_id=ids[1], blob=b"old", feature_version="v1", tvm_version="t", n_samples=1
    )
    new = storage.save_cost_model(
        target_id=ids[1], blob=b"\x00new", feature_version="v1", tvm_version="t", n_samples=9
    )
    assert storage.latest_cost_model(ids[1]) == new and new.blob == b"\x00new"
    assert storage.latest_cost_model(ids[1], feature_version="v2") is None

    token = storage.add_api_token(name="ci", token_hash="h" * 64, kind="worker")
    assert storage.find_api_token("h" * 64) == token
    storage.revoke_api_token(token.id)
    assert storage.find_api_token("h" * 64) is None
    with pytest.raises(db.StorageError):
        storage.add_api_token(name="x", token_hash="y", kind="admin")
