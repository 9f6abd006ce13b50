"""tuner.task_scheduler.gradient: every batch is committed to the database before the next one is
sent, so a killed run loses at most the batch in flight (MetaSchedule's own gradient scheduler sends
a batch of every task before it commits any)."""
from __future__ import annotations

import pytest
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

import db
import tuner.search
from compiler.prepare import prepare_model
from compiler.target import cpu_target
from tuner.job import tune_model
from tuner.search import FAST_SEARCH


@derived_object
class _CountingRunner(ms.runner.PyRunner):
    """Delegates to the real runner and notes the size of every batch sent to it."""

    def __init__(self, inner, sent: list[int]) -> None:
        super().__init__()
        self.inner = inner
        self.sent = sent

    def run(self, runner_inputs):
        self.sent.append(len(runner_inputs))
        return self.inner.run(runner_inputs)


@pytest.fixture
def storage(tmp_path):
    store = db.open_storage(f"sqlite:///{tmp_path / 'sched.db'}", upgrade=True)
    yield store
    store.close()


@pytest.mark.slow
def test_each_batch_is_committed_before_the_next_is_sent(
    storage, example_model, tmp_path, monkeypatch
) -> None:
    sent: list[int] = []
    make_runner = tuner.search.make_runner
    monkeypatch.setattr(tuner.search, "make_runner",
                        lambda measure, rpc=None: _CountingRunner(make_runner(measure, rpc), sent))
    seen: list[tuple[int, int, int]] = []

    class Watch:
        def on_batch(self, update) -> None:
            seen.append((len(sent), update.total_trials, storage.count_records()))

    prepared = prepare_model(example_model("mlp", "onnx"), cpu_target())
    assert len(prepared.partition.tasks) == 3
    summary = tune_model(storage, prepared, trials=16, output_dir=tmp_path / "out",
                         search=FAST_SEARCH, listeners=[Watch()], seed=0)

    assert len(seen) == len(sent) >= 4  # one progress update per batch: a round, then more
    for batches_joined, (batches_sent, total_trials, committed) in enumerate(seen, start=1):
        assert batches_sent == batches_joined  # nothing else in flight while a batch is joined
        assert committed == total_trials == sum(sent[:batches_joined])
    assert summary.trials_measured == sum(sent) == storage.count_records()
