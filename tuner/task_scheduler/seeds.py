"""Seeds: schedules measured for a task right before its batch, like a small batch of their own.

A *seeder* offers, for the task the scheduler just picked, a few ``MeasureCandidate`` objects
that the search would not find by itself soon: the default GPU schedule
(:mod:`tuner.task_scheduler.default_schedules`), the best schedules of faster siblings
(:mod:`tuner.task_scheduler.sibling_seeds`). :func:`measure_seeds` measures them with the run's
builder and runner and reports them exactly as MetaSchedule reports a batch: every measure
callback of the scheduler sees them (database commit, upload, progress, error texts) and the cost
model learns from them, so the task's next batch can start from them. They count as trials
(:class:`tuner.task_scheduler.gradient.BatchCommittingGradient`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from tvm.s_tir import meta_schedule as ms


class Seeder(Protocol):
    """Something that offers seeds for a task of the run."""

    def candidates(self, task_index: int, context: Any) -> list[ms.MeasureCandidate]:
        """Seeds for task ``task_index`` (MetaSchedule's ``TuneContext`` ``context``); empty
        when there is nothing (more) to offer. Must never raise for a seed it cannot make."""

    def observe(self, task_index: int, results: Sequence[Any]) -> None:
        """The ``RunnerResult`` of each candidate it just offered, in order (for its counts)."""


def measure_seeds(
    scheduler: Any,
    task_id: int,
    candidates: Sequence[ms.MeasureCandidate],
    builder: Any,
    runner: Any,
    device: str,
) -> list[Any]:
    """Build and run ``candidates`` of ``task_id`` on ``device``, then report them to
    ``scheduler``'s measure callbacks and cost model as a batch of that task.

    ``scheduler`` is the running ``TaskScheduler``. MetaSchedule's ``UpdateCostModel`` callback
    only accepts the batch in flight, so the cost model's ``update`` is called directly instead.
    Returns the ``RunnerResult`` of each candidate; one that fails to build gets a failed
    result with the builder's error.
    """
    if not candidates:
        return []
    context = scheduler.tasks_[task_id].ctx
    built = builder.build([ms.builder.BuilderInput(c.sch.mod, context.target) for c in candidates])
    results = []
    for candidate, result in zip(candidates, built, strict=True):
        if result.error_msg is not None:
            results.append(ms.runner.RunnerResult(run_secs=None, error_msg=result.error_msg))
            continue
        (future,) = runner.run(
            [ms.runner.RunnerInput(result.artifact_path, device, candidate.args_info)]
        )
        results.append(future.result())
    for callback in scheduler.measure_callbacks_:
        if not isinstance(callback, ms.measure_callback.UpdateCostModel):
            callback.apply(scheduler, task_id, list(candidates), built, results)
    if scheduler.cost_model_ is not None:
        kept = [
            (c, r)
            for c, b, r in zip(candidates, built, results, strict=True)
            if b.error_msg is None
        ]
        if kept:
            scheduler.cost_model_.update(context, [c for c, _ in kept], [r for _, r in kept])
    return results


class SeedChain:
    """The scheduler's ``seeding`` hook: each seeder's candidates for the task, measured in
    turn (:func:`measure_seeds`) while ``budget_left()`` allows. Returns every result."""

    def __init__(self, seeders: Sequence[Seeder], *, builder: Any, runner: Any, device: str):
        self.seeders = list(seeders)
        self.builder = builder
        self.runner = runner
        self.device = device

    def __call__(self, scheduler: Any, task_id: int) -> list[Any]:
        results: list[Any] = []
        context = scheduler.tasks_[task_id].ctx
        for seeder in self.seeders:
            candidates = seeder.candidates(task_id, context)
            measured = measure_seeds(
                scheduler, task_id, candidates, self.builder, self.runner, self.device
            )
            if measured:
                seeder.observe(task_id, measured)
            results.extend(measured)
        return results
