"""Measure callback of a lease worker: every measured batch goes to the server as it is.

Where a run on the SQL database commits each candidate through MetaSchedule's default callbacks,
a lease worker hands each task's batch (seeds included: :mod:`tuner.task_scheduler.seeds`
reports them to every callback) to ``on_batch`` as :class:`tuner.jobs.protocol.RecordUpload`
objects, failures with their error text (:func:`tuner.measuring.outcomes.outcome`); the worker
uploads it. When ``on_batch`` answers ``False`` (lease lost, job cancelled, worker stopping) tuning
stops at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from db.metaschedule_database import record_as_json
from db.types import measurement
from tuner.jobs.protocol import RecordUpload
from tuner.measuring.outcomes import outcome


@dataclass(frozen=True)
class MeasuredBatch:
    """One measured batch of one task: its records (in candidate order), its best valid mean
    latency, and the task's index in the search's task list."""

    records: tuple[RecordUpload, ...]
    best_secs: float | None
    task_index: int = 0


class StopTuning(BaseException):
    """Raised from the batch callback to end tuning (a BaseException: nothing in between may
    swallow it; MetaSchedule's FFI turns it into an error that aborts ``tune_tasks``)."""


@derived_object
class UploadBatches(ms.measure_callback.PyMeasureCallback):
    """Each batch's records go to ``on_batch``; ``False`` stops tuning (:attr:`stopped`).
    :attr:`artifacts` lists the build artifacts seen (for a worker measuring over RPC, which
    keeps them: MetaSchedule's ``RemoveBuildArtifact`` is left out there)."""

    def __init__(self, on_batch: Callable[[MeasuredBatch], bool]) -> None:
        super().__init__()
        self.on_batch = on_batch
        self.trials = 0
        self.stopped = False
        self.artifacts: list[str] = []

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        workload = ms.database.Workload(task_scheduler.tasks_[task_id].ctx.mod)
        records: list[RecordUpload] = []
        for candidate, built, ran in zip(
            measure_candidates, builder_results, runner_results, strict=False
        ):
            if built.artifact_path:
                self.artifacts.append(str(built.artifact_path))
            run_secs, error = outcome(built, ran)
            trace, _, _, args_info = record_as_json(
                ms.database.TuningRecord(
                    candidate.sch.trace, workload, None, None, list(candidate.args_info)
                )
            )
            records.append(
                RecordUpload(trace=trace, run_secs=run_secs, args_info=args_info, error_text=error)
            )
        self.trials += len(records)
        means = [m for r in records if (m := measurement(r.run_secs)[1]) is not None]
        best = min(means) if means else None
        if not self.on_batch(MeasuredBatch(tuple(records), best, int(task_id))):
            self.stopped = True
            raise StopTuning("tuning stopped by the worker")
