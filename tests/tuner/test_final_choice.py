"""A tuned build is never slower end to end than the zero-trial build it replaces (issue 35):
the final build times both whole models side by side and publishes the faster, saying so in the
manifest's ``final_choice`` (tuner/final_build/final_choice.py, tuner/final_build/finalize.py). Real
TVM builds and timings; the slow tuned build is a real, valid schedule (the task's unscheduled
loops)."""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path

import pytest
import tvm
from tvm.s_tir import meta_schedule as ms

from compiler.build.runner import LoadedLibrary, Timing
from compiler.build.verify import verify
from compiler.prepare import PreparedModel, prepare_model
from compiler.target import cpu_target
from tuner.final_build.final_choice import (
    CHOICES,
    MARGIN,
    ROUNDS_ENV,
    TUNED,
    ZERO_TRIAL,
    CompareConfig,
    FinalChoice,
    decide,
)
from tuner.final_build.finalize import (
    TaskOutcome,
    build_zero_trial_of,
    publish_tuned,
    publish_zero_trial,
    zero_trial_outcomes,
)


@pytest.fixture(scope="module")
def mlp(example_model) -> PreparedModel:
    return prepare_model(example_model("mlp", "onnx"), cpu_target())


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _timings(*medians_ms: float) -> list[Timing]:
    """One :class:`Timing` a round, as :meth:`LoadedLibrary.time` returns them."""
    return [Timing(m / 1e3, 0.9 * m / 1e3, 1.1 * m / 1e3, 5) for m in medians_ms]


def _outcomes(prepared: PreparedModel) -> list[TaskOutcome]:
    return [
        TaskOutcome(t.key, t.name, "tune", "", t.weight, t.flops, 1, None)
        for t in prepared.partition.tasks
    ]


def _slow_database(prepared: PreparedModel) -> tuple[ms.database.MemoryDatabase, str]:
    """A database whose only record is a deliberately poor but valid schedule of the model's
    heaviest task: its unscheduled PrimFunc (an empty trace replays to the naive loops: no
    tiling, no vectorization, no parallelism). The task's key is returned with it."""
    task, extracted = max(
        zip(prepared.partition.tasks, prepared.partition.extracted), key=lambda p: p[0].flops
    )
    mod = extracted.dispatched[0]
    database = ms.database.MemoryDatabase()
    workload = database.commit_workload(mod)
    infos = ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True)
    record = ms.database.TuningRecord(
        tvm.s_tir.Schedule(mod).trace, workload, [1e-3], prepared.target.tvm_target(), list(infos)
    )
    database.commit_tuning_record(record)
    return database, task.key


def test_the_rule_over_rounds_of_timings() -> None:
    """The zero-trial library is published only when its median over the rounds is more than
    2 % below the tuned one's; one outlier round decides nothing; ties go to the tuned build."""
    assert MARGIN == 0.02
    clear = decide(_timings(1.00, 1.01, 0.99, 1.00, 1.02), _timings(0.95, 0.96, 0.94, 0.95, 0.96))
    assert clear.published == ZERO_TRIAL and clear.compared
    assert clear.tuned_secs == pytest.approx(1.00e-3)
    assert clear.zero_trial_secs == pytest.approx(0.95e-3)
    within_noise = decide(_timings(1.00, 1.00, 1.00), _timings(0.99, 0.985, 0.99))
    assert within_noise.published == TUNED
    tie = decide(_timings(1.0, 1.0), _timings(1.0, 1.0))
    assert tie.published == TUNED
    slower = decide(_timings(1.0, 1.0, 1.0), _timings(1.2, 1.3, 1.1))
    assert slower.published == TUNED
    # One lucky round of the zero-trial library (0.5) does not move its median (1.1).
    outlier = decide(_timings(1.0, 1.0, 1.0), _timings(0.5, 1.1, 1.1))
    assert outlier.published == TUNED
    as_json = clear.to_json()
    assert as_json["rounds"] == 5 and as_json["decided_by"] == "measurement"
    assert as_json["tuned_ms"] == pytest.approx(1.0)
    assert as_json["zero_trial_ms"] == pytest.approx(0.95)
    assert as_json["rule"].startswith("zero_trial when its median")
    with pytest.raises(ValueError, match="as many rounds"):
        decide(_timings(1.0, 1.0), _timings(1.0))
    with pytest.raises(ValueError, match="as many rounds"):
        decide([], [])


def test_a_workers_choice_is_read_back_with_care() -> None:
    """What a server reads from a worker's manifest: only the choice and finite, positive round
    times of equal count; anything else is dropped or refused."""
    sent = decide(_timings(2.0, 2.1), _timings(1.0, 1.1)).to_json()
    back = FinalChoice.from_json(sent)
    assert back is not None and back.published == ZERO_TRIAL and back.decided_by == "worker"
    assert back.to_json()["tuned_ms"] == pytest.approx(sent["tuned_ms"])
    assert FinalChoice.from_json({"published": "fastest"}) is None
    assert FinalChoice.from_json("zero_trial") is None and FinalChoice.from_json(None) is None
    for bad in ([1.0, -2.0], [float("nan")], ["1"], [True], [1.0] * 101, []):
        read = FinalChoice.from_json({**sent, "zero_trial_rounds_ms": bad})
        assert read is not None and read.published == ZERO_TRIAL and not read.compared
    not_compared = FinalChoice.from_json({"published": "tuned", "why_not": "x" * 900})
    assert not_compared is not None and len(not_compared.why_not or "") == 500
    with pytest.raises(ValueError, match="published"):
        FinalChoice("fastest")


def test_setting(monkeypatch) -> None:
    monkeypatch.setenv(ROUNDS_ENV, "x")
    with pytest.raises(ValueError, match=ROUNDS_ENV):
        CompareConfig.from_env()
    monkeypatch.setenv(ROUNDS_ENV, "0")
    assert not CompareConfig.from_env().enabled
    monkeypatch.delenv(ROUNDS_ENV)
    assert CompareConfig.from_env() == CompareConfig(rounds=5)


@pytest.mark.slow
def test_a_tuned_job_says_which_library_it_published(tuned_mlp) -> None:
    """The session's tuned MLP job (tests/conftest.py) timed its tuned build against the
    zero-trial build and published the one the rule picks; the published library verifies from
    disk, and the job's summary says the same as the manifest."""
    manifest = json.loads((tuned_mlp.artifact_dir / "manifest.json").read_text())
    choice = manifest["final_choice"]
    rounds = CompareConfig.from_env().rounds
    assert choice["compared"] is True and choice["decided_by"] == "measurement"
    assert choice["published"] in CHOICES and choice["rounds"] == rounds
    assert len(choice["tuned_rounds_ms"]) == len(choice["zero_trial_rounds_ms"]) == rounds
    assert all(value > 0 for value in choice["tuned_rounds_ms"] + choice["zero_trial_rounds_ms"])
    assert choice["tuned_ms"] == pytest.approx(statistics.median(choice["tuned_rounds_ms"]))
    assert choice["zero_trial_ms"] == pytest.approx(
        statistics.median(choice["zero_trial_rounds_ms"])
    )
    expected = decide(
        _timings(*choice["tuned_rounds_ms"]), _timings(*choice["zero_trial_rounds_ms"])
    )
    assert choice["published"] == expected.published
    # The manifest describes the library it ships.
    prepared = prepare_model(tuned_mlp.model, cpu_target())
    if choice["published"] == ZERO_TRIAL:
        _, zero_keys = build_zero_trial_of(prepared)
        assert manifest["estimated_ms"] is None and "tuned_build" in choice
        assert sorted((manifest["peers"] or {}).get("tasks", [])) == sorted(zero_keys)
        assert {s["implementation"] for s in manifest["schedules"]} <= {"default", "openblas gemm"}
    else:
        assert "tuned_build" not in choice and manifest["estimated_ms"] > 0
    assert manifest["verification"]["passed"]
    library = LoadedLibrary(tuned_mlp.artifact_dir / "model.so")
    assert verify(prepared.model, library.run_fresh).passed
    summary = tuned_mlp.summary.to_json()
    assert summary["final_choice"] == {k: v for k, v in choice.items() if k != "tuned_build"}


@pytest.mark.slow
def test_a_slower_tuned_build_publishes_the_zero_trial_library(mlp, tmp_path) -> None:
    """A tuned build whose heaviest task runs naive loops is slower end to end than the zero-trial
    build: the zero-trial executable is published (the same bytes ``tunehub compile`` writes),
    its manifest says what it runs, and it verifies. A server rebuilding the worker's artifact
    follows that choice without timing anything, to the same bytes."""
    database, slow_key = _slow_database(mlp)
    outcomes = _outcomes(mlp)
    manifest, timing = publish_tuned(
        mlp, database, tmp_path / "final", job_id=7, trials_measured=1, outcomes=outcomes
    )
    choice = manifest["final_choice"]
    assert choice["published"] == ZERO_TRIAL and choice["compared"] is True
    assert choice["zero_trial_ms"] < (1 - MARGIN) * choice["tuned_ms"]
    # What ships is the zero-trial library: the very bytes of the zero-trial build.
    zero = publish_zero_trial(mlp, tmp_path / "zero")
    assert _sha256(tmp_path / "final" / "model.so") == _sha256(tmp_path / "zero" / "model.so")
    assert manifest["peers"] == zero["peers"]
    _, zero_keys = build_zero_trial_of(mlp)
    expected = [o.to_json() for o in zero_trial_outcomes(mlp, outcomes, zero_keys)]
    assert manifest["schedules"] == expected and manifest["estimated_ms"] is None
    assert all(s["best_ms"] is None for s in manifest["schedules"])
    assert {s["implementation"] for s in manifest["schedules"]} == (
        {"openblas gemm"} if zero_keys else {"default"}
    )
    # The tuned build that lost is described, and marked as not what the library runs.
    tuned_build = choice["tuned_build"]
    assert {s["key"]: s["implementation"] for s in tuned_build["schedules"]}[slow_key] == (
        "schedule"
    )
    assert tuned_build["peers"] is None and manifest["tuned"] is True
    # Verified before publishing, and again here from disk; timed as the fast library. (Its
    # fastest run, not its median: on a loaded 2-core CI machine one median of 20 short runs
    # can land above the slow build's median taken seconds earlier.)
    assert manifest["verification"]["passed"]
    assert verify(mlp.model, LoadedLibrary(tmp_path / "final" / "model.so").run_fresh).passed
    assert timing is not None and manifest["measured"]["min_ms"] < choice["tuned_ms"]

    # The server's rebuild (tuner/final_build/rebuild.py) follows the worker's choice; here it
    # cannot run the target's code, so nothing is timed or verified, and the bytes match.
    followed = FinalChoice.from_json(choice)
    server, _ = publish_tuned(
        mlp,
        database,
        tmp_path / "server",
        job_id=7,
        trials_measured=1,
        outcomes=outcomes,
        not_run_because="the test says so",
        follow=followed,
    )
    assert server["final_choice"]["published"] == ZERO_TRIAL
    assert server["final_choice"]["decided_by"] == "worker"
    assert server["final_choice"]["tuned_ms"] == pytest.approx(choice["tuned_ms"])
    assert not server["verification"]["passed"]
    assert _sha256(tmp_path / "server" / "model.so") == _sha256(tmp_path / "final" / "model.so")


@pytest.mark.slow
def test_without_a_comparison_the_tuned_library_is_published_and_says_why(
    mlp, tmp_path, monkeypatch
) -> None:
    """Turned off (``TUNEHUB_FINAL_COMPARE_ROUNDS=0``) or where the target's code cannot run
    here, nothing is compared: the tuned library is published and ``final_choice`` says why."""
    database, _ = _slow_database(mlp)
    outcomes = _outcomes(mlp)
    monkeypatch.setenv(ROUNDS_ENV, "0")
    off, timing = publish_tuned(
        mlp, database, tmp_path / "off", job_id=1, trials_measured=1, outcomes=outcomes
    )
    assert off["final_choice"]["published"] == TUNED and off["final_choice"]["compared"] is False
    assert ROUNDS_ENV in off["final_choice"]["why_not"] and off["final_choice"]["rounds"] == 0
    assert off["final_choice"]["tuned_ms"] is None and off["verification"]["passed"]
    assert timing is not None and off["schedules"] == [o.to_json() for o in outcomes]
    monkeypatch.delenv(ROUNDS_ENV)
    not_run, timing = publish_tuned(
        mlp,
        database,
        tmp_path / "not-run",
        job_id=1,
        trials_measured=1,
        outcomes=outcomes,
        not_run_because="no such CPU here",
    )
    assert not_run["final_choice"]["published"] == TUNED
    assert "no such CPU here" in not_run["final_choice"]["why_not"]
    assert timing is None and not not_run["verification"]["passed"]
    # The same tuned bytes either way.
    assert _sha256(tmp_path / "off" / "model.so") == _sha256(tmp_path / "not-run" / "model.so")
