"""Issue 31 (case 4) on both backends: a finalize manifest's library records and
re-measurements are checked against their task's physical limits (:mod:`tuner.jobs.plausibility`)
when stored (:func:`tuner.final_build.remeasure_store.store_remeasurements`, what the server runs
when it accepts a worker's artifact); a held library record is never a best; library records are
listed in pages with a count; migration 0012 holds what was stored before it."""

from __future__ import annotations

import dataclasses

import pytest
import tvm
from sqlalchemy import text
from tvm import te

import db
from db import NewLibraryRecord, NewRemeasurement, NewTuningRecord
from db.engine import create_storage_engine
from tuner.final_build.remeasure_store import store_remeasurements

WA, WB = "00000000000000aa", "00000000000000bb"
CALL = {"kind": "gemm", "function": "tunehub.peer.gemm"}
DEFAULT = {"library": "tvm", "package": "apache-tvm", "version": "0.27.0", "kind": "default"}
PEER = {
    "library": "openblas",
    "package": "scipy-openblas32",
    "version": "0.3.34",
    "kind": "gemm",
    "function": "tunehub.peer.gemm",
}


@dataclasses.dataclass(frozen=True)
class _Spec:
    """What ``ensure_target`` reads of a ``compiler.target.TargetSpec``."""

    key: str
    kind: str = "cpu"
    target_json: str = '{"kind":"llvm"}'
    fingerprint_json: str = "{}"
    tvm_version: str = "test"


def _reshape_json(rows: int = 64, cols: int = 128) -> str:
    a = te.placeholder((rows, cols), name="A")
    out = te.compute(
        (cols, rows), lambda i, j: a[(i * rows + j) // cols, (i * rows + j) % cols], name="R"
    )
    func = te.create_prim_func([a, out]).with_attr("global_symbol", "main")
    return tvm.ir.save_json(tvm.IRModule({"main": func}))


@pytest.fixture
def task(storage):
    """A reshape-like workload (0 FLOPs, 32 KiB of output) and a 16 MiB transpose-like one, on
    a CPU target, with a job; ``(target, job, workload ids by key)``."""
    wa = storage.ensure_workload(WA, _reshape_json(64, 128), flops=0.0)
    wb = storage.ensure_workload(WB, _reshape_json(2048, 2048), flops=0.0)
    target = storage.ensure_target(_Spec("000000000000c0c0"))
    job = storage.create_job(target_id=target.id, trial_budget=8)
    return target, job, {WA: wa.id, WB: wb.id}


def _candidate(kind: str, implementation: dict, rounds_ms: list[float]) -> dict:
    return {kind: implementation, "rounds_ms": rounds_ms, "chosen": False}


def _store(storage, task, entries) -> int:
    target, job, ids = task
    return store_remeasurements(
        storage, entries, target_id=target.id, job_id=job.id, workload_ids=ids, worker="w1"
    )


def test_an_implausible_default_record_is_stored_held_and_never_the_best(storage, task):
    """The case of the issue: a "tvm default" library record of 1e-12 s next to a plausible
    peer of 1 ms: stored held, and the best library record is the peer."""
    target, job, _ = task
    entries = [
        {
            "key": WA,
            "candidates": [
                _candidate("default", DEFAULT, [1e-9, 1e-9, 1e-9]),  # 1e-12 s
                _candidate("peer", PEER, [1.0, 1.1, 0.9]),
            ],
        }
    ]
    assert _store(storage, task, entries) == 2
    stored = storage.list_library_records(workload_key=WA)
    held = [r for r in stored if r.quarantined]
    assert len(held) == 1 and held[0].library == "tvm" and held[0].median_secs == 1e-12
    assert held[0].held_reason.startswith("held: ") and "kernel call" in held[0].held_reason
    best = storage.best_library_records(target.key, [WA])
    assert best[WA].library == "openblas" and best[WA].median_secs == pytest.approx(1e-3)

    # only an implausible one: stored, and no best at all
    _store(storage, task, [{"key": WB, "candidates": [_candidate("default", DEFAULT, [1e-9])]}])
    assert storage.count_library_records(workload_key=WB, quarantined=True) == 1
    assert storage.best_library_records(target.key, [WA, WB]) == {WA: best[WA]}
    assert {r.job_id for r in storage.list_library_records()} == {job.id}


def test_a_library_record_faster_than_its_output_bytes_allow_is_held(storage, task):
    """16 MiB of output in 10 ns (1.7e15 B/s): above the memory ceiling, though above the call
    floor and with no FLOPs to bound it."""
    target, _, _ = task
    entries = [{"key": WB, "candidates": [_candidate("peer", PEER, [1e-5])]}]
    _store(storage, task, entries)
    [row] = storage.list_library_records(workload_key=WB)
    assert row.quarantined and "output bytes" in row.held_reason
    assert storage.best_library_records(target.key, [WB]) == {}


def test_implausible_re_measurements_are_dropped(storage, task):
    target, job, ids = task
    record = NewTuningRecord.from_metaschedule_json(
        ids[WA], target.id, [[[], []], [2e-4], None, []], worker="w0"
    )
    storage.commit_records([record])
    entries = [
        {
            "key": WA,
            "candidates": [
                {"trace_hash": record.trace_hash, "rounds_ms": [1e-10], "chosen": True},
                {"trace_hash": record.trace_hash, "rounds_ms": [0.2, 0.21], "chosen": False},
            ],
        }
    ]
    assert _store(storage, task, entries) == 1
    [kept] = storage.list_remeasurements(job_id=job.id)
    assert kept.median_secs == pytest.approx(2.05e-4) and not kept.chosen


def test_a_task_s_second_entry_in_a_manifest_is_dropped(storage, task):
    """One entry per task: a manifest cannot plant more than 16 candidates of one task."""
    entry = {"key": WA, "candidates": [_candidate("peer", PEER, [1.0])] * 16}
    assert _store(storage, task, [entry] * 50) == 16
    assert storage.count_library_records(workload_key=WA) == 16


def test_held_records_are_listed_and_counted_never_best(storage, task):
    target, _, _ = task
    rows = storage.add_library_records(
        [
            NewLibraryRecord(WA, target.key, "tvm", "x", CALL, (1e-12,), held_reason="held: x"),
            NewLibraryRecord(WA, target.key, "openblas", "1", CALL, (2e-3,)),
            NewLibraryRecord(WA, target.key, "openblas", "2", CALL, (3e-3,)),
        ]
    )
    assert [r.quarantined for r in rows] == [True, False, False]
    assert rows[0].held_reason == "held: x" and rows[1].held_reason is None
    assert storage.best_library_records(target.key, [WA]) == {WA: rows[1]}
    assert storage.list_library_records(workload_key=WA) == rows
    assert storage.list_library_records(quarantined=True) == rows[:1]
    assert storage.list_library_records(quarantined=False) == rows[1:]
    assert storage.count_library_records(workload_key=WA, quarantined=False) == 2
    with pytest.raises(ValueError, match="held_reason"):
        NewLibraryRecord(WA, target.key, "tvm", "x", CALL, (1e-3,), held_reason="")


def test_library_records_are_listed_in_pages_with_a_limit_in_the_query(storage, task):
    target, _, _ = task
    rows = storage.add_library_records(
        [
            NewLibraryRecord(WA, target.key, "openblas", "1", CALL, (1e-3 + i * 1e-6,))
            for i in range(25)
        ]
    )
    statements: list[str] = []

    def seen(conn, cursor, statement, *args) -> None:
        statements.append(statement)

    from sqlalchemy import event

    event.listen(storage.engine, "before_cursor_execute", seen)
    try:
        page = storage.list_library_records(workload_key=WA, limit=10)
    finally:
        event.remove(storage.engine, "before_cursor_execute", seen)
    assert page == rows[:10]
    assert any("LIMIT" in s.upper() for s in statements)
    assert (
        storage.list_library_records(workload_key=WA, after_id=rows[9].id, limit=10) == rows[10:20]
    )
    assert (
        storage.list_library_records(workload_key=WA, after_id=rows[19].id, limit=10) == rows[20:]
    )
    assert storage.list_library_records(workload_key=WA, limit=0) == []
    assert storage.count_library_records(workload_key=WA) == 25
    assert storage.count_library_records(workload_key=WB) == 0
    assert len(storage.list_library_records(limit=10**9)) == 25  # lowered to the largest page


def test_re_measurements_shown_per_record_are_bounded(storage, task):
    target, job, ids = task
    record = NewTuningRecord.from_metaschedule_json(
        ids[WA], target.id, [[[], []], [2e-4], None, []]
    )
    storage.commit_records([record])
    stored = storage.get_record(ids[WA], target.id, record.trace_hash)
    storage.add_remeasurements(
        [NewRemeasurement(stored.id, (1e-3 + i * 1e-6,), job_id=job.id) for i in range(40)]
    )
    everything = storage.list_remeasurements(record_ids=[stored.id])
    latest = storage.list_remeasurements(record_ids=[stored.id], latest=16)
    assert len(everything) == 40 and latest == everything[-16:]
    assert storage.list_remeasurements(record_ids=[stored.id], latest=0) == []


def test_migration_0012_holds_what_was_stored_before_it(db_url):
    engine = create_storage_engine(db_url)
    try:
        db.upgrade(engine, "0011_one_lease_per_worker")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO workloads (id, key, mod_json, flops) VALUES "
                    "(1, :a, '{}', 0.0), (2, :b, '{}', 1e12)"
                ),
                {"a": WA, "b": WB},
            )
            conn.execute(
                text(
                    "INSERT INTO targets (id, key, kind, target_json, fingerprint_json, "
                    "tvm_version) VALUES (1, 'c0', 'cpu', '{}', '{}', 't'), "
                    "(2, 'g0', 'cuda', '{}', '{}', 't')"
                )
            )
            rows = [  # (workload, target, median): held?
                (1, 1, 1e-12),  # below the CPU call floor
                (1, 1, 1e-6),  # plausible
                (2, 1, 1e-3),  # 1e15 FLOP/s on a CPU
                (2, 1, 1e-1),  # 1e13 FLOP/s: plausible
                (1, 2, 5e-8),  # below the CUDA launch floor
                (1, 2, 1e-5),  # plausible
            ]
            for i, (w, t, median) in enumerate(rows, start=1):
                conn.execute(
                    text(
                        "INSERT INTO library_records (id, workload_id, target_id, library, "
                        "version, call_json, run_secs_json, median_secs, spread) VALUES "
                        "(:i, :w, :t, 'tvm', 'x', '{}', '[]', :m, 0.0)"
                    ),
                    {"i": i, "w": w, "t": t, "m": median},
                )
        assert db.upgrade(engine, "0012_library_record_holds") == "0012_library_record_holds"
        with engine.connect() as conn:
            held = conn.execute(
                text("SELECT id, quarantined, held_reason FROM library_records ORDER BY id")
            ).all()
        assert [bool(h[1]) for h in held] == [True, False, True, False, True, False]
        assert all(("migration 0012" in (h[2] or "")) == bool(h[1]) for h in held)
        db.schema.downgrade(engine, "0011_one_lease_per_worker")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM library_records")).scalar_one() == 6
        assert db.upgrade(engine) == db.head_revision()
    finally:
        engine.dispose()
