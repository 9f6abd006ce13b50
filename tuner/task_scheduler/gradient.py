"""MetaSchedule's gradient task scheduler, with every batch committed before the next is made.

MetaSchedule's ``GradientBased`` scheduler (``gradient_based.cc``) first sends one batch of every
task to the runner without collecting any result, then joins them all: the database commit (a
measure callback) happens at that join. On MobileNetV2's 33 tasks at 12 candidates a batch that
first round was 384 measurements and 17 minutes on two cores with nothing in the database, so a
``kill -9`` in it lost all of them, and progress stayed at zero until it ended.

``BatchCommittingGradient`` keeps MetaSchedule's policy (a round robin over the tasks first, then
the task whose weighted latency gradient is largest, ``alpha`` 0.2, window 3, random among ties)
and joins every batch in flight before choosing the next task. It promises that at any moment at
most one batch, the one just sent, is measured but not yet committed, so a killed run loses at
most one batch, and that progress (measure callbacks) follows each batch. The price: the
measurement of one batch no longer overlaps the search for the next (on a machine whose cores
all serve the search, the two competed anyway; throughput in ``bench/results/models_*.md``).

With ``seeding`` (:meth:`tuner.task_scheduler.sibling_seeds.SiblingSeeds.seed`), the task chosen is
first offered its siblings' best schedules, measured and committed before its batch is made, so that
the batch's population can start from them. Seeds count as trials: with ``max_trials`` the scheduler
stops once batches and seeds together reach it (MetaSchedule's own limit counts batches only), and
makes no batch after seeds that reach it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from db.types import mean_run_secs

_INVALID_MS = 1e9  # MetaSchedule's latency for a failed candidate (``task_scheduler.cc``)


@derived_object
class BatchCommittingGradient(ms.task_scheduler.PyTaskScheduler):
    """See the module docstring. ``seed`` makes the choice among equal gradients reproducible.

    One object serves one ``ms.tune_tasks`` call. Joins go through the base class (overriding
    ``join_running_task`` or ``tune`` would make MetaSchedule's FFI entry call back into Python).
    """

    def __init__(
        self,
        *,
        alpha: float = 0.2,
        window_size: int = 3,
        seed: int | None = None,
        max_trials: int | None = None,
        seeding: Callable[[Any, int], list[Any]] | None = None,
    ):
        super().__init__()
        self.alpha = alpha
        self.window_size = window_size
        self.max_trials = max_trials
        self.seeding = seeding
        self.trials = 0  # candidates measured: joined batches plus seeds
        self._rng = random.Random(seed)
        self._round_robin = 0
        self._history: list[list[float]] = []  # best latency (ms) after each joined batch

    def _join(self, task_id: int) -> None:
        """Join ``task_id``'s batch (MetaSchedule's join: measure callbacks, database commit)
        and extend its best-latency history as ``GradientBased`` does."""
        self._extend_history(task_id, self._outer().join_running_task(task_id))

    def _extend_history(self, task_id: int, results: list[Any]) -> None:
        if results:
            self.trials += len(results)
            history = self._history[task_id]
            latencies = [
                _INVALID_MS if (secs := mean_run_secs(r)) is None else secs * 1e3 for r in results
            ]
            history.append(min([*history[-1:], *latencies]))

    def _seed(self, task_id: int) -> None:
        """Measure the sibling seeds of the task about to be searched, while the budget lasts."""
        if self.seeding is None or (self.max_trials is not None and self.trials >= self.max_trials):
            return
        self._extend_history(task_id, self.seeding(self._outer(), task_id))

    def _gradient(self, task_id: int, weight: float) -> float:
        history = self._history[task_id]
        if not history or history[-1] >= _INVALID_MS:
            return -_INVALID_MS  # no valid measurement yet: MetaSchedule skips such a task
        best, n, w = history[-1], len(history), self.window_size
        backward = (history[n - 1 - w] - best) / w if n >= 1 + w else 0.0
        return (self.alpha * backward + (1 - self.alpha) * best / n) * weight

    def next_task_id(self) -> int:
        tasks = self._outer().tasks_
        if self._round_robin == 0:  # a new tuning run (MetaSchedule's own ``Tune`` loop)
            self._history = [[] for _ in tasks]
        for task_id, task in enumerate(tasks):
            if task.runner_futures is not None:
                self._join(task_id)
        if self.max_trials is not None and self.trials >= self.max_trials:
            return -1
        task_id = self._choose(tasks)
        if task_id != -1:
            self._seed(task_id)
            if self.max_trials is not None and self.trials >= self.max_trials:
                return -1  # the seeds spent the budget: no batch after them (a lease refuses it)
        return task_id

    def _choose(self, tasks) -> int:
        if self._round_robin < len(tasks):
            self._round_robin += 1
            return self._round_robin - 1
        alive = [i for i, task in enumerate(tasks) if not task.is_terminated]
        if not alive:
            return -1
        grads = [self._gradient(i, float(tasks[i].task_weight)) for i in alive]
        if max(grads) == min(grads):
            return self._rng.choice(alive)
        return alive[grads.index(max(grads))]
