"""Storage methods the service and the workers use, on both backends: owner filters, model
deletion, record and workload browsing."""

from __future__ import annotations

import pytest

import db
from db import JobStatus, ModelWorkload, NewTuningRecord


@pytest.fixture
def target_id(storage, target):
    return storage.ensure_target(target).id


def _job(storage, target_id, **kw):
    return storage.create_job(target_id=target_id, trial_budget=kw.pop("budget", 8), **kw)


def test_owner_filters_counts_and_pagination(storage, target_id):
    for i in range(5):
        _job(storage, target_id, owner="alice" if i % 2 == 0 else "bob")
    assert storage.count_jobs(owner="alice") == 3 and storage.count_jobs(owner="bob") == 2
    alice = storage.list_jobs(owner="alice")
    assert [j.owner for j in alice] == ["alice"] * 3
    assert [j.id for j in storage.list_jobs(owner="alice", limit=2, offset=1)] == [
        j.id for j in alice[1:]
    ]
    storage.transition_job(alice[0].id, JobStatus.RUNNING, expected=JobStatus.QUEUED)
    counts = storage.job_counts()
    assert counts == {"queued": 4, "running": 1, "succeeded": 0, "failed": 0, "cancelled": 0}
    assert storage.count_jobs(status="queued") == 4


def test_delete_model_refuses_active_jobs_and_keeps_finished_ones(storage, target_id):
    model = storage.add_model(
        content_hash="ab" * 32, format="onnx", filename="m", size=1, owner="u"
    )
    twin = storage.add_model(content_hash="ab" * 32, format="onnx", filename="m", size=1, owner="v")
    assert storage.find_model(owner="u", content_hash="ab" * 32) == model
    assert storage.find_model(owner="w", content_hash="ab" * 32) is None
    w = storage.ensure_workload("00000000000000aa", "{}")
    storage.set_model_workloads(model.id, [ModelWorkload(model.id, w.id, "dense", 1)])
    job = _job(storage, target_id, model_id=model.id, owner="u")
    with pytest.raises(db.ConflictError, match="not finished"):
        storage.delete_model(model.id)
    storage.transition_job(job.id, JobStatus.CANCELLED)
    assert storage.delete_model(model.id) == model
    assert storage.get_model(model.id) is None and storage.model_workloads(model.id) == []
    assert (
        storage.get_job(job.id).model_id is None and storage.get_job(job.id).status == "cancelled"
    )
    assert storage.model_content_in_use("ab" * 32)  # the other owner's row
    storage.delete_model(twin.id)
    assert not storage.model_content_in_use("ab" * 32)
    with pytest.raises(db.NotFoundError):
        storage.delete_model(model.id)


def test_record_pages_and_workload_browse(storage, target_id, other_targets):
    other = storage.ensure_target(other_targets["one_core"]).id
    wa = storage.ensure_workload("00000000000000aa", "{}", flops=2.0, summary="a")
    wb = storage.ensure_workload("00000000000000bb", "{}", flops=3.0, summary="b")
    storage.ensure_workload("00000000000000cc", "{}", summary="c (no records)")
    records = [NewTuningRecord(wa.id, target_id, f'[["a{i}"]]', [1e-3 * (i + 1)]) for i in range(5)]
    records.append(NewTuningRecord(wa.id, target_id, '[["bad"]]', None, error_text="x"))
    records.append(NewTuningRecord(wb.id, other, '[["b"]]', [5e-4]))
    storage.commit_records(records)

    first = storage.list_records(workload_id=wa.id, target_id=target_id, limit=4)
    assert len(first) == 4 and first == sorted(first, key=lambda r: r.id)
    rest = storage.list_records(workload_id=wa.id, target_id=target_id, after_id=first[-1].id)
    assert len(rest) == 2 and {r.is_valid for r in rest} == {True, False}
    assert len(storage.list_records(valid=False)) == 1
    assert storage.count_records(measured_within_secs=3600) == 7
    assert storage.count_records(measured_within_secs=-3600) == 0

    rows, total = storage.browse_workloads()
    assert total == 3 and [r.key for r in rows] == [
        "00000000000000aa",
        "00000000000000bb",
        "00000000000000cc",
    ]
    a = rows[0]
    assert (a.records_valid, a.records_failed) == (5, 1)
    assert a.best_mean_secs == pytest.approx(1e-3) and a.summary == "a"
    assert rows[2].records_valid == 0 and rows[2].best_mean_secs is None
    on_target, total = storage.browse_workloads(target_id=target_id)
    assert total == 1 and [r.key for r in on_target] == ["00000000000000aa"]
    page, total = storage.browse_workloads(limit=1, offset=1)
    assert total == 3 and [r.key for r in page] == ["00000000000000bb"]
    model = storage.add_model(
        content_hash="cd" * 32, format="onnx", filename="m", size=1, owner="u"
    )
    storage.set_model_workloads(model.id, [ModelWorkload(model.id, wb.id, "dense", 2)])
    by_model, total = storage.browse_workloads(model_id=model.id)
    assert total == 1 and by_model[0].key == "00000000000000bb" and by_model[0].records_valid == 1


def test_token_listing(storage):
    a = storage.add_api_token(name="alice", token_hash="1" * 64, kind="user")
    w = storage.add_api_token(name="w1", token_hash="2" * 64, kind="worker")
    storage.revoke_api_token(a.id)
    tokens = storage.list_api_tokens()
    assert [(t.name, t.kind, t.revoked) for t in tokens] == [
        ("alice", "user", True),
        ("w1", "worker", False),
    ]
    assert storage.find_api_token("1" * 64) is None and storage.find_api_token("2" * 64) == w


def test_job_progress_in_one_read(storage, target, target_id):
    model = storage.add_model(
        content_hash="ef" * 32, format="onnx", filename="m", size=1, owner="u"
    )
    wa = storage.ensure_workload("00000000000000aa", "{}")
    wb = storage.ensure_workload("00000000000000bb", "{}")
    storage.set_model_workloads(
        model.id, [ModelWorkload(model.id, wa.id, "a", 1), ModelWorkload(model.id, wb.id, "b", 2)]
    )
    job = _job(storage, target_id, model_id=model.id, owner="u")
    assert storage.job_progress(job.id + 100) is None
    empty = storage.job_progress(job.id)
    assert empty.job == job and empty.tasks == () and empty.artifacts == ()
    assert empty.target_key == target.key and empty.model_tasks == 2
    storage.add_job_tasks(job.id, [db.NewJobTask(wa.id, "a", trial_budget=4)])
    storage.add_artifact(job_id=job.id, path="/x", sha256="0" * 64, size=3, verified=True)
    full = storage.job_progress(job.id)
    assert [t.name for t in full.tasks] == ["a"] and full.artifacts[0].verified
    assert full.tasks == tuple(storage.list_job_tasks(job.id))
    assert full.artifacts == tuple(storage.list_artifacts(job.id))
    cli_job = _job(storage, target_id, owner="cli")
    assert storage.job_progress(cli_job.id).model_tasks is None
