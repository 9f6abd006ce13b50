"""The MetaSchedule PyDatabase adapter: the Database contract, scoped to one target."""

from __future__ import annotations

import pytest

tvm = pytest.importorskip("tvm")
from db_test_helpers import make_records, matmul_mod  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402

import db  # noqa: E402
from compiler.keys import workload_key  # noqa: E402

SECS = [[3e-4], [1e-4, 1.2e-4], [1e10], [2e-4], None]


@pytest.fixture
def adapter(storage, target):
    return db.MetaScheduleDatabase(storage, target)


def secs(records) -> list[float]:
    return [sum(float(x) for x in r.run_secs) / len(r.run_secs) for r in records]


def test_workloads(adapter, storage):
    mod = matmul_mod()
    assert not adapter.has_workload(mod)
    assert adapter.commit_workload(mod) is not None
    assert adapter.has_workload(mod)
    assert adapter.commit_workload(matmul_mod()) is not None
    row = storage.get_workload(workload_key(mod))
    assert row.flops == pytest.approx(2 * 64**3)
    assert "float32[64x64]" in row.summary and "blocks:C" in row.summary
    assert workload_key(tvm.ir.load_json(row.mod_json)) == workload_key(mod)
    # A fresh adapter (new process, empty cache) finds it in the database.
    assert db.MetaScheduleDatabase(storage, adapter.target_spec).has_workload(matmul_mod())
    assert not adapter.has_workload(matmul_mod(32))


def test_commit_top_k_len_and_all(adapter, storage, target):
    workload = adapter.commit_workload(matmul_mod())
    records = make_records(workload, target.tvm_target(), SECS)
    for record in records:
        adapter.commit_tuning_record(record)
    assert len(adapter) == 5
    top = adapter.get_top_k(workload, 10)
    assert secs(top) == pytest.approx([1.1e-4, 2e-4, 3e-4])  # best first, failures excluded
    assert secs(adapter.get_top_k(workload, 1)) == pytest.approx([1.1e-4])
    assert adapter.get_top_k(workload, 0) == []
    assert str(top[0].trace) == str(records[1].trace)
    assert len(adapter.get_all_tuning_records()) == 5
    assert storage.stats().records_failed == 2

    # A new adapter object reads the same records back (a second process would).
    fresh = db.MetaScheduleDatabase(storage, target)
    workload2 = fresh.commit_workload(matmul_mod())
    assert secs(fresh.get_top_k(workload2, 3)) == pytest.approx([1.1e-4, 2e-4, 3e-4])
    assert {str(r.trace) for r in fresh.get_all_tuning_records()} == {str(r.trace) for r in records}
    # Committing the same records again (a retried upload) adds nothing.
    fresh.commit_tuning_records(records)
    assert len(fresh) == 5


def test_top_k_sees_improved_measurements(adapter, storage, target):
    workload = adapter.commit_workload(matmul_mod())
    records = make_records(workload, target.tvm_target(), [[3e-4], [2e-4], [1e-4]])
    adapter.commit_tuning_records(records)
    assert secs(adapter.get_top_k(workload, 3)) == pytest.approx([1e-4, 2e-4, 3e-4])
    again = adapter.get_top_k(workload, 3)  # warm: served from the parsed-record cache
    assert [str(r.trace) for r in again] == [str(r.trace) for r in reversed(records)]
    # The slowest schedule is re-measured faster by another worker (another adapter object).
    other = db.MetaScheduleDatabase(storage, target)
    faster = make_records(other.commit_workload(matmul_mod()), None, [[5e-5]])[0]
    other.commit_tuning_record(
        tvm.s_tir.meta_schedule.database.TuningRecord(
            records[0].trace, faster.workload, [5e-5], None, records[0].args_info
        )
    )
    assert secs(adapter.get_top_k(workload, 3)) == pytest.approx([5e-5, 1e-4, 2e-4])
    assert len(adapter) == 3


def test_record_of_another_target_is_never_returned(adapter, storage, target, other_targets):
    mod = matmul_mod()
    workload = adapter.commit_workload(mod)
    adapter.commit_tuning_records(make_records(workload, target.tvm_target(), [[5e-4]]))
    for name, spec in other_targets.items():
        other = db.MetaScheduleDatabase(storage, spec)
        other_workload = other.commit_workload(mod)
        # TVM's built-in query ignores the target; ours must not.
        assert adapter.query_tuning_record(mod, spec.tvm_target(), "main") is None, name
        assert other.query_tuning_record(mod, spec.tvm_target(), "main") is None, name
        assert other.get_top_k(other_workload, 5) == [], name
        assert len(other) == 0
        assert ms.tir_integration.compile_tir(adapter, mod, spec.tvm_target()) is None, name
    # Faster records on another target do not change this target's answer.
    faster = db.MetaScheduleDatabase(storage, other_targets["one_core"])
    faster.commit_tuning_records(
        make_records(faster.commit_workload(mod), target.tvm_target(), [[1e-6], [2e-6]])
    )
    best = adapter.query_tuning_record(mod, target.tvm_target(), "main")
    assert [float(x) for x in best.run_secs] == [5e-4]
    # The same target with a host attached still matches.
    with_host = tvm.target.Target(target.tvm_target(), host=target.tvm_target())
    assert adapter.query_tuning_record(mod, with_host, "main") is not None
    assert adapter.query_tuning_record(matmul_mod(32), target.tvm_target(), "main") is None


def test_records_are_stored_under_the_adapter_target(adapter, storage, target, other_targets):
    workload = adapter.commit_workload(matmul_mod())
    # The record claims another target; the adapter stores it under its own.
    foreign = other_targets["other_mcpu"].tvm_target()
    adapter.commit_tuning_records(make_records(workload, foreign, [[1e-3]]))
    assert storage.count_records(target_id=adapter.target_record.id) == 1
    assert storage.get_target(other_targets["other_mcpu"].key) is None
    (record,) = adapter.get_top_k(workload, 1)
    from compiler.target import canonical_target_json

    assert canonical_target_json(record.target) == target.target_json


def test_context_and_failure_text(adapter, storage, target):
    job = storage.create_job(target_id=adapter.target_record.id, trial_budget=8)
    adapter.set_context(job_id=job.id, worker="worker-7")
    workload = adapter.commit_workload(matmul_mod())
    good, bad = make_records(workload, target.tvm_target(), [[1e-3], [1e10]])
    adapter.commit_tuning_records([good, bad])
    adapter.record_failure(workload, bad.trace, "LocalRunner: Timeout, killed after 30 seconds")
    rows = {r.is_valid: r for r in storage.iter_records()}
    assert rows[True].job_id == job.id and rows[True].worker == "worker-7"
    assert rows[False].error_text.startswith("LocalRunner: Timeout")
    assert len(adapter) == 2  # annotated in place, not a second row
    # A failure never seen before is stored with its text.
    (third,) = make_records(workload, target.tvm_target(), [[1.0]] * 3)[2:]
    adapter.record_failure(matmul_mod(), third.trace, "build failed: boom")
    assert storage.count_records(valid=False) == 2


def test_record_errors_callback(adapter, storage, target):
    workload = adapter.commit_workload(matmul_mod())
    (record,) = make_records(workload, target.tvm_target(), [[1e10]])
    adapter.commit_tuning_record(record)

    class Candidate:
        sch = tvm.s_tir.Schedule(matmul_mod())
        args_info = record.args_info

    # Replay the record's trace so the candidate carries the same schedule.
    record.trace.apply_to_schedule(Candidate.sch, remove_postproc=False)

    class Task:
        class ctx:  # noqa: N801
            mod = matmul_mod()

    class Scheduler:
        tasks_ = [Task]

    callback = db.RecordErrorsCallback(adapter)
    callback._inst.apply(  # the Python body, with stand-ins for the C++ objects
        Scheduler, 0, [Candidate], [ms.builder.BuilderResult(None, "build exploded")], [None]
    )
    (row,) = list(storage.iter_records())
    assert row.error_text == "build exploded" and not row.is_valid
