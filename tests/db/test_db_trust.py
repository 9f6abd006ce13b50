"""Issue 18 on the storage side: a poisoned best record never fails a build (the SQL adapter's
query skips a record that does not replay), quarantine and delete by worker, job or id with the
best recomputed, held records never a best record, and a deleted model's id never reused."""

from __future__ import annotations

import pytest

tvm = pytest.importorskip("tvm")
from db_test_helpers import make_records, matmul_mod  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402

import db  # noqa: E402
from compiler.keys import workload_key  # noqa: E402

POISON = [["garbage"], []]  # not a trace: it does not parse


def _stored(storage, target, run_secs, worker: str):
    """Commit ``make_records`` records (as a worker would) and return the workload id."""
    database = db.MetaScheduleDatabase(storage, target)
    workload = database.commit_workload(matmul_mod())
    records = make_records(workload, target.tvm_target(), run_secs)
    workload_id = storage.workload_ids([workload_key(matmul_mod())])[workload_key(matmul_mod())]
    target_id = storage.ensure_target(target).id
    storage.commit_records(
        [
            db.NewTuningRecord.from_metaschedule_json(
                workload_id, target_id, r.as_json(), worker=worker
            )
            for r in records
        ]
    )
    return workload_id, target_id


def test_poisoned_best_record_is_skipped_by_the_build_query(storage, target) -> None:
    workload_id, target_id = _stored(storage, target, [[2e-4], [3e-4]], "honest")
    good = storage.best_record(workload_id, target_id)
    # Straight into the database, past every upload check: the "best" record is garbage.
    storage.commit_records(
        [
            db.NewTuningRecord(
                workload_id=workload_id,
                target_id=target_id,
                trace_json=db.canonical_trace_json(POISON),
                run_secs=(1e-12,),
                args_info_json="[]",
                worker="evil",
            )
        ]
    )
    assert storage.best_record(workload_id, target_id).worker == "evil"
    adapter = db.MetaScheduleDatabase(storage, target)
    found = adapter.query_tuning_record(matmul_mod(), target.tvm_target(), "main")
    assert found is not None
    assert db.canonical_trace_json(found.as_json()[0]) == good.trace_json
    # And the build with it works (what `tunehub compile --tuned` and a finalize do).
    sch = ms.tir_integration.compile_tir(adapter, matmul_mod(), target.tvm_target())
    assert sch is not None
    tvm.compile(sch.mod, target=target.tvm_target())


def test_quarantine_by_worker_job_and_id_recomputes_the_best(storage, target) -> None:
    workload_id, target_id = _stored(storage, target, [[1e-4], [2e-4], [3e-4]], "w-a")
    rows = sorted(storage.top_k(workload_id, target_id, 10), key=lambda r: r.mean_secs)
    assert len(rows) == 3
    assert storage.quarantine_records(record_ids=[rows[0].id]) == 1
    best = storage.best_record(workload_id, target_id)
    assert best.id == rows[1].id
    held = storage.get_records([rows[0].id])[0]
    assert held.quarantined and not held.is_valid and held.run_secs == (1e-4,)
    assert held.error_text.startswith("quarantined")
    assert storage.quarantine_records(worker="w-a") == 2
    assert storage.best_record(workload_id, target_id) is None
    assert storage.count_records(workload_id=workload_id) == 3  # held, not gone
    assert storage.delete_records(worker="w-a") == 3
    assert storage.count_records(workload_id=workload_id) == 0
    with pytest.raises(ValueError):
        storage.quarantine_records()
    assert storage.quarantine_records(job_id=123456) == 0


def test_a_held_record_is_never_a_best_record(storage, target) -> None:
    workload_id, target_id = _stored(storage, target, [[2e-4]], "honest")
    database = db.MetaScheduleDatabase(storage, target)
    workload = database.commit_workload(matmul_mod())
    fast = make_records(workload, target.tvm_target(), [[5e-4], [1e-9]])[1]
    storage.commit_records(
        [
            db.NewTuningRecord.from_metaschedule_json(
                workload_id,
                target_id,
                fast.as_json(),
                worker="fast",
                quarantined=True,
                error_text="held: implausible",
            )
        ]
    )
    best = storage.best_record(workload_id, target_id)
    assert best.worker == "honest"
    held = [r for r in storage.iter_records(workload_id=workload_id) if r.quarantined]
    assert len(held) == 1 and held[0].run_secs == (1e-9,) and held[0].mean_secs is None


def test_a_deleted_model_id_is_never_reused(storage) -> None:
    first = storage.add_model(
        content_hash="a" * 64, format="onnx", filename="a.onnx", size=1, owner="alice"
    )
    second = storage.add_model(
        content_hash="b" * 64, format="onnx", filename="b.onnx", size=1, owner="alice"
    )
    storage.delete_model(second.id)
    third = storage.add_model(
        content_hash="c" * 64, format="onnx", filename="c.onnx", size=1, owner="alice"
    )
    assert third.id > second.id > first.id
    storage.delete_model(third.id)
    storage.delete_model(first.id)
    fourth = storage.add_model(
        content_hash="d" * 64, format="onnx", filename="d.onnx", size=1, owner="bob"
    )
    assert fourth.id > third.id
