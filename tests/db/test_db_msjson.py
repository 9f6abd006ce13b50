"""Interop with MetaSchedule JSON databases: export -> import gives identical best records;
imports merge best-of without duplicates; TVM's own JSONDatabase reads our export."""

from __future__ import annotations

import json

import pytest

tvm = pytest.importorskip("tvm")
from db_test_helpers import make_records, matmul_mod  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402

import db  # noqa: E402
from compiler.keys import workload_key  # noqa: E402

SECS = [[4e-4], [1e-4], [3e-4, 3.2e-4], [1e10], [2e-4], [5e-4]]


def best_records(storage, target) -> dict:
    """{workload key: [(trace_hash, run_secs), ...] best first} for one target."""
    t = storage.get_target(target.key)
    out = {}
    for w in storage.list_workloads(target_id=t.id):
        out[w.key] = [(r.trace_hash, r.run_secs) for r in storage.top_k(w.id, t.id, 100)]
    return out


@pytest.fixture
def filled(storage, target):
    adapter = db.MetaScheduleDatabase(storage, target)
    for n, secs in ((64, SECS), (32, SECS[:3])):
        workload = adapter.commit_workload(matmul_mod(n))
        adapter.commit_tuning_records(make_records(workload, target.tvm_target(), secs))
    return storage


def test_export_import_round_trip(filled, target, tmp_path, backend):
    report = db.export_json_database(filled, tmp_path / "msdb", target)
    assert (report.workloads, report.records) == (2, 9)
    # TVM itself reads the export and finds the same best schedule.
    tvm_db = ms.database.JSONDatabase(work_dir=str(tmp_path / "msdb"))
    assert len(tvm_db) == 9
    best = tvm_db.query_tuning_record(matmul_mod(), target.tvm_target(), "main")
    assert [float(x) for x in best.run_secs] == [1e-4]

    with db.open_storage(f"sqlite:///{tmp_path / 'empty.db'}", upgrade=True) as empty:
        got = db.import_json_database(empty, tmp_path / "msdb", target)
        assert (got.workloads_new, got.records_read, got.records_new) == (2, 9, 9)
        assert best_records(empty, target) == best_records(filled, target)
        assert empty.count_records(valid=False) == 1
        again = db.import_json_database(empty, tmp_path / "msdb", target)
        assert (again.workloads_new, again.records_new) == (0, 0)
        assert best_records(empty, target) == best_records(filled, target)
        assert empty.count_records() == 9


def test_import_merges_best_of(filled, target, tmp_path):
    # A TVM-written database: same schedules (after a JSON round trip through TVM, which writes
    # booleans as 0/1), some measured faster, some slower, plus one new schedule.
    (tmp_path / "theirs").mkdir()
    tvm_db = ms.database.JSONDatabase(work_dir=str(tmp_path / "theirs"))
    workload = tvm_db.commit_workload(matmul_mod())
    theirs = make_records(
        workload, target.tvm_target(), [[9e-5], [9e-4], [1e10], [7e-4], [1e10], [5e-4], [6e-5]]
    )
    for record in theirs:
        tvm_db.commit_tuning_record(record)
    before = filled.count_records()
    report = db.import_json_database(filled, tmp_path / "theirs", target)
    assert report.records_read == 7 and report.records_new == 1  # only the 7th is new
    assert filled.count_records() == before + 1
    t = filled.get_target(target.key)
    w = filled.get_workload(workload_key(matmul_mod()))
    means = [r.mean_secs for r in filled.top_k(w.id, t.id, 100)]
    # 4e-4 -> 9e-5 (better), 1e-4 kept (theirs 9e-4 worse), 3.1e-4 kept (theirs failed),
    # failure -> 7e-4 (a measurement beats a failure), 2e-4 kept, 5e-4 same, 6e-5 new.
    assert means == pytest.approx(sorted([9e-5, 1e-4, 3.1e-4, 7e-4, 2e-4, 5e-4, 6e-5]))
    assert db.import_json_database(filled, tmp_path / "theirs", target).records_new == 0


def test_records_of_another_target_are_skipped(storage, target, other_targets, tmp_path):
    (tmp_path / "other").mkdir()
    tvm_db = ms.database.JSONDatabase(work_dir=str(tmp_path / "other"))
    workload = tvm_db.commit_workload(matmul_mod())
    one_core = other_targets["one_core"].tvm_target()
    for record in make_records(workload, one_core, [[1e-4], [2e-4]]):
        tvm_db.commit_tuning_record(record)
    report = db.import_json_database(storage, tmp_path / "other", target)
    assert (report.records_read, report.records_new, report.records_other_target) == (2, 0, 2)
    forced = db.import_json_database(storage, tmp_path / "other", target, any_target=True)
    assert forced.records_new == 2


def test_bad_input_is_reported(storage, target, tmp_path):
    with pytest.raises(FileNotFoundError):
        db.import_json_database(storage, tmp_path / "nothing", target)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "database_workload.json").write_text("not json\n")
    (bad / "database_tuning_record.json").write_text("")
    with pytest.raises(ValueError, match="database_workload.json:1"):
        db.import_json_database(storage, bad, target)


def test_cli_import_export(filled, db_url, tmp_path, capsys):
    from service.cli import main

    out = tmp_path / "cli-export"
    assert main(["db", "export", str(out), "--db", db_url, "--num-cores", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["records"] == 9
    other_db = f"sqlite:///{tmp_path / 'cli.db'}"
    assert main(["db", "upgrade", "--db", other_db]) == 0
    assert main(["db", "import", str(out), "--db", other_db, "--num-cores", "2"]) == 0
    assert "9 new" in capsys.readouterr().out
    assert main(["db", "import", str(out), "--db", other_db, "--num-cores", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["records_new"] == 0
    assert main(["db", "import", str(tmp_path / "missing"), "--db", other_db]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["db", "export", str(out), "--db", other_db, "--target", "tpu"]) == 2
