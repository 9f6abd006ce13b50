"""Tuning jobs end to end on real MetaSchedule measurements (a few trials each).

Covers: every candidate lands in the SQL database tagged with the job; the artifact is verified
and runs in a fresh process; a second model (the other format of the same network) reuses every
task with zero measurements (the first run is the session's ``tuned_mlp``, tests/conftest.py);
``kill -9`` mid-run and the same command resumes within budget + one batch; bad budgets are
refused.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import db
from compiler.prepare import prepare_model
from compiler.target import cpu_target
from tuner.engine.search import FAST_SEARCH
from tuner.jobs.job import tune_model

REPO = Path(__file__).resolve().parents[2]
TUNEHUB = [sys.executable, "-m", "service.cli"]


def _cli(*args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [*TUNEHUB, *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


@pytest.fixture
def storage(tmp_path):
    store = db.open_storage(f"sqlite:///{tmp_path / 'tune.db'}", upgrade=True)
    yield store
    store.close()


@pytest.fixture
def mlp_storage(tuned_mlp, tmp_path):
    """A copy of the session's ``tuned_mlp`` database (tests/conftest.py): the MLP's ONNX export
    tuned 16 trials with FAST_SEARCH in one run, shared by the tests that start from it."""
    store = db.open_storage(tuned_mlp.copy(tmp_path / "tune.db"))
    yield store
    store.close()


@pytest.mark.slow
def test_tune_then_reuse_across_models(tuned_mlp, mlp_storage, example_model, tmp_path) -> None:
    storage = mlp_storage
    target = cpu_target()
    onnx_model = prepare_model(tuned_mlp.model, target)
    first = tuned_mlp.summary  # tune_model(..., trials=16, search=FAST_SEARCH, seed=3)
    tuned = [t for t in first.tasks if t.action == "tune"]
    assert len(tuned) == len(onnx_model.partition.tasks) == 3
    # Every measured candidate is stored, tagged with the job; the budget holds (+ one batch).
    assert first.trials_measured == storage.count_records(job_id=first.job_id)
    assert 16 <= first.trials_measured <= 16 + 4
    assert all(t.best_secs is not None and t.best_secs > 0 for t in first.tasks)
    assert first.verification["passed"]
    assert first.estimated_secs is not None and first.measured is not None
    job = storage.get_job(first.job_id)
    assert job.status == "succeeded" and job.trials_done >= first.trials_measured
    assert {t.status for t in storage.list_job_tasks(first.job_id)} == {"succeeded"}
    manifest = json.loads((tuned_mlp.artifact_dir / "manifest.json").read_text())
    assert manifest["tuned"] is True and manifest["trials_measured"] == first.trials_measured
    assert {s["key"] for s in manifest["schedules"]} == {t.key for t in onnx_model.partition.tasks}

    # The same network exported by torch shares every task: zero measurements.
    pt2_model = prepare_model(example_model("mlp", "pt2"), target)
    second = tune_model(
        storage, pt2_model, trials=12, output_dir=tmp_path / "b", search=FAST_SEARCH
    )
    assert second.tasks_reused == 3
    assert second.trials_this_run == 0 and second.trials_measured == 0
    assert second.verification["passed"] and second.verification["reference"] == "torch"

    # The artifact loads and runs in a fresh process.
    code = (
        "import sys, numpy as np; from compiler.build.runner import LoadedLibrary;"
        "lib = LoadedLibrary(sys.argv[1]);"
        "out = lib.run([np.ones((1, 784), 'float32')]); print(out[0].shape)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "b" / "model.so")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "(1, 10)"


@pytest.mark.slow
def test_continue_tunes_known_tasks_again(tuned_mlp, continued_mlp, tmp_path) -> None:
    # continued_mlp (tests/conftest.py): the MLP tuned 16 trials once already (tuned_mlp), then
    # 12 more with continue_tuning on a copy of that database.
    again = continued_mlp.summary
    assert again.tasks_reused == 0
    assert {t.action for t in again.tasks} == {"tune"}
    storage = db.open_storage(continued_mlp.copy(tmp_path / "tune.db"))
    try:
        # Every candidate measured counts on the job row; the records table keeps one row per
        # schedule, so a schedule re-measured by the second job may stay attributed to the first.
        assert storage.get_job(again.job_id).trials_done >= 12
        assert again.trials_this_run > 0
        assert storage.get_job(tuned_mlp.summary.job_id).status == "succeeded"
    finally:
        storage.close()


@pytest.mark.slow
def test_kill_minus_nine_then_resume(tmp_path, example_model) -> None:
    # The MLP's 3 tasks, batches of 4: the kill lands after two of the four batches (with a
    # budget of 12 the rerun's few remaining trials can all be schedules stored before the kill).
    model_path = example_model("mlp", "onnx")
    url = f"sqlite:///{tmp_path / 'resume.db'}"
    budget, batch = 16, 4
    args = [
        "tune",
        str(model_path),
        "--trials",
        str(budget),
        "--db",
        url,
        "--population",
        "16",
        "-o",
        str(tmp_path / "out"),
        "--json",
    ]
    subprocess.run([*TUNEHUB, "db", "upgrade", "--db", url], cwd=REPO, check=True, timeout=120)
    proc = _cli(*args, start_new_session=True)
    storage = db.open_storage(url)
    try:
        deadline = time.monotonic() + 600
        while storage.count_records() < 2 * batch:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no batch was measured in time"
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        before = storage.count_records()
        assert before < budget
        job = storage.list_jobs()[0]
        assert job.status == "running"

        rerun = _cli(*args)
        out, err = rerun.communicate(timeout=900)
        assert rerun.returncode == 0, err
        summary = json.loads(out)
        assert summary["job_id"] == job.id and summary["resumed"] is True
        # Records are keyed by schedule, and the resumed search may measure again a schedule
        # stored before the kill, so distinct schedules can fall short of the budget by those.
        assert before < summary["trials_measured"] <= budget + batch
        # The job row counts every candidate of each finished batch: only the batch in flight at
        # the kill can go uncounted, and the rerun measures no more than what remained.
        assert budget - batch <= storage.get_job(job.id).trials_done <= budget + batch
        assert summary["trials_measured"] == storage.count_records(job_id=job.id)
        assert summary["verification"]["passed"]
        assert storage.get_job(job.id).status == "succeeded"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        storage.close()


def test_cli_refuses_bad_budget_and_nonempty_output(tmp_path, example_model) -> None:
    model_path = example_model("mlp", "onnx")
    url = f"sqlite:///{tmp_path / 'x.db'}"
    subprocess.run([*TUNEHUB, "db", "upgrade", "--db", url], cwd=REPO, check=True, timeout=120)
    proc = _cli("tune", str(model_path), "--trials", "-5", "--db", url)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "--trials must be >= 0" in err
    out_dir = tmp_path / "busy"
    out_dir.mkdir()
    (out_dir / "keep.txt").write_text("user data")
    proc = _cli("tune", str(model_path), "--trials", "4", "--db", url, "-o", str(out_dir))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2 and "not empty" in err
    assert sorted(p.name for p in out_dir.iterdir()) == ["keep.txt"]


@pytest.mark.slow
def test_the_small_cnn_tunes_in_both_formats(storage, example_model, tmp_path) -> None:
    """A few trials per format: ONNX tunes the heaviest task, the .pt2 export reuses it and tunes
    the next; both compile from the database and verify against their own framework.

    Tuned here: the small CNN's convolutions. A transformer's tasks (matmuls, attention, layer
    norm) are tuned end to end by tests/service/test_api_programs.py (a decoder's prefill and
    decode as one job). Every example in both formats compiles and verifies in
    tests/service/cli/test_cli_models.py (test_compile_verifies_every_example), and its two exports
    share their convolution and matmul task keys (test_onnx_and_pt2_share_conv_and_matmul_keys);
    the MLP's cross-format reuse is test_tune_then_reuse_across_models."""
    target = cpu_target()
    summaries = []
    for fmt in ("onnx", "pt2"):
        prepared = prepare_model(example_model("small_cnn", fmt), target)
        summary = tune_model(
            storage, prepared, trials=4, output_dir=tmp_path / fmt, search=FAST_SEARCH, seed=0
        )
        assert summary.verification["passed"], summary.verification
        assert summary.trials_this_run >= 4
        assert (tmp_path / fmt / "model.so").is_file()
        # Where the search's time went (MetaSchedule's profiler): candidates were sampled, built
        # and run, and the phases add up to the run's time.
        timed = summary.to_json()["search_time"]
        phases = timed["phases_secs"]
        assert timed["trials"] == summary.trials_this_run and timed["trials_per_sec"] > 0
        assert all(phases[p] > 0 for p in ("sample", "build", "run", "record"))
        assert sum(phases.values()) == pytest.approx(timed["total_secs"], abs=0.01)
        summaries.append(summary)
    onnx_run, torch_run = summaries
    tuned_first = {t.key for t in onnx_run.tasks if t.action == "tune"}
    assert tuned_first and tuned_first <= {t.key for t in torch_run.tasks if t.action == "reuse"}
