"""tuner.task_scheduler.gradient: every batch is committed to the database before the next one is
sent, so a killed run loses at most the batch in flight (MetaSchedule's own gradient scheduler sends
a batch of every task before it commits any).

Checked on the session's ``tuned_mlp`` run (tests/conftest.py): the MLP's 3 tasks tuned 16 trials
with the real runner wrapped to note every batch sent to it, and a progress listener that counts
the database's records at each batch.
"""

from __future__ import annotations

import pytest

import db


@pytest.mark.slow
def test_each_batch_is_committed_before_the_next_is_sent(tuned_mlp, tmp_path) -> None:
    sent, seen = tuned_mlp.observed["sent"], tuned_mlp.observed["seen"]
    summary = tuned_mlp.summary
    assert len(summary.tasks) == 3

    assert len(seen) == len(sent) >= 4  # one progress update per batch: a round, then more
    for batches_joined, (batches_sent, total_trials, committed) in enumerate(seen, start=1):
        assert batches_sent == batches_joined  # nothing else in flight while a batch is joined
        assert committed == total_trials == sum(sent[:batches_joined])
    storage = db.open_storage(tuned_mlp.copy(tmp_path / "sched.db"))
    try:
        assert summary.trials_measured == sum(sent) == storage.count_records()
    finally:
        storage.close()
