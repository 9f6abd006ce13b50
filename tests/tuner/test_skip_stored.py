"""tuner.search_strategy.skip_stored: a run never measures again a schedule the database already
holds."""
from __future__ import annotations

import dataclasses

import pytest

import db
from compiler.prepare import prepare_model
from compiler.target import cpu_target
from tuner.job import tune_model
from tuner.search import FAST_SEARCH


@pytest.mark.slow
def test_a_continued_run_measures_only_new_schedules(tmp_path, tuned_mlp) -> None:
    # The first run: the session's MLP tuned 12 trials (tests/conftest.py), copied here.
    storage = db.open_storage(tuned_mlp.copy(tmp_path / "skip.db"))
    try:
        prepared = prepare_model(tuned_mlp.model, cpu_target())
        first = tuned_mlp.summary
        # No seeds: they are checked against the database separately
        # (tuner.task_scheduler.sibling_seeds).
        search = dataclasses.replace(FAST_SEARCH, sibling_seeds=False, sibling_population=False)
        stored = storage.count_records()
        assert stored >= first.trials_measured >= 12
        # The first run's seed: its random samples come again, and must be skipped too.
        again = tune_model(storage, prepared, trials=12, output_dir=tmp_path / "b",
                           search=search, seed=3, cost_model="cold", continue_tuning=True)
        # The second run starts its populations from the first run's best records (MetaSchedule
        # does that) but measures none of them again: every trial it counts is a new record.
        job = storage.get_job(again.job_id)
        assert job.trials_done >= 12
        assert storage.count_records(job_id=again.job_id) == job.trials_done
        assert storage.count_records() == stored + job.trials_done
        assert first.job_id != again.job_id and again.verification["passed"]
    finally:
        storage.close()
