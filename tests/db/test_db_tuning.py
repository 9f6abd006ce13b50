"""Must-show: a MetaSchedule tuning run writes through the adapter; a NEW process compiles from
the database alone and applies the best record's schedule; other targets get nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

tvm = pytest.importorskip("tvm")
from db_test_helpers import matmul_mod  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402

import db  # noqa: E402
from compiler.keys import workload_key  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def run_script(name: str, *args: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(HERE), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(HERE / name), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_tune_then_compile_in_a_new_process(db_url, target):
    # Tuning runs in its own process too: see tune_into_db.py for why (tensor intrinsics).
    with db.open_storage(db_url, upgrade=True):
        pass
    tuned = run_script("tune_into_db.py", db_url, "2")
    storage = db.open_storage(db_url)
    target_row = storage.get_target(target.key)
    workload = storage.get_workload(workload_key(matmul_mod()))
    assert workload is not None and workload.flops == pytest.approx(2 * 64**3)
    n_records = storage.count_records(target_id=target_row.id)
    assert 4 <= n_records <= 12  # the budget overshoots by at most one batch
    best = storage.best_record(workload.id, target_row.id)
    assert best is not None and best.is_valid and best.worker == "test-tuner"
    assert tuned["records"] == n_records
    storage.close()

    result = run_script("compile_from_db.py", db_url, "2")
    assert result["applied_trace"] == best.trace_json  # the top record's schedule was applied
    assert result["max_abs_err"] < 1e-3
    assert result["other"] == {"one_core": None, "one_core_own_db": None}


def test_tvm_builtin_query_ignores_target_but_ours_does_not(storage, target, other_targets):
    """Documents why the override exists: MetaSchedule's default query path ignores the target."""
    from db_test_helpers import make_records

    mem = ms.database.MemoryDatabase()
    workload = mem.commit_workload(matmul_mod())
    (record,) = make_records(workload, target.tvm_target(), [[1e-4]])
    mem.commit_tuning_record(record)
    other = other_targets["one_core"].tvm_target()
    assert mem.query_tuning_record(matmul_mod(), other, "main") is not None  # TVM: wrong answer

    ours = db.MetaScheduleDatabase(storage, target)
    ours.commit_tuning_record(record)
    assert ours.query_tuning_record(matmul_mod(), other, "main") is None
    assert ours.query_tuning_record(matmul_mod(), target.tvm_target(), "main") is not None
