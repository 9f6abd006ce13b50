"""tuner.search_strategy.skip_stored: a run never measures again a schedule the database already
holds."""

from __future__ import annotations

import pytest

import db


@pytest.mark.slow
def test_a_continued_run_measures_only_new_schedules(tmp_path, tuned_mlp, continued_mlp) -> None:
    # The first run: the session's MLP tuned 16 trials (tuned_mlp); the second, continued_mlp
    # (tests/conftest.py): tuned_mlp's database continued 12 trials with the first run's seed (its
    # random samples come again, and must be skipped too), cold, without seeds (they are checked
    # against the database separately: tuner.task_scheduler.sibling_seeds).
    first, again = tuned_mlp.summary, continued_mlp.summary
    stored = continued_mlp.observed["records_before"]
    assert stored >= first.trials_measured >= 16
    storage = db.open_storage(continued_mlp.copy(tmp_path / "skip.db"))
    try:
        # The second run starts its populations from the first run's best records (MetaSchedule
        # does that) but measures none of them again: every trial it counts is a new record.
        job = storage.get_job(again.job_id)
        assert job.trials_done >= 12
        assert storage.count_records(job_id=again.job_id) == job.trials_done
        assert storage.count_records() == stored + job.trials_done
        assert first.job_id != again.job_id and again.verification["passed"]
    finally:
        storage.close()
