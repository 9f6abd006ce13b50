"""Progress of a tuning run: a MetaSchedule measure callback feeding listeners.

:class:`ProgressCallback` runs once per measured batch in MetaSchedule's tuning thread. It turns
the batch into a :class:`BatchUpdate` (trials, valid measurements, the task's best latency so far)
and hands it to each listener: the job-row writer (so the service and dashboard see progress) and
the CLI's rich progress bar. An exception in a MetaSchedule hook aborts tuning, so the callback
logs listener failures and never raises.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from compiler.partition import TaskInfo
from db.types import mean_run_secs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchUpdate:
    """One measured batch of one task, with the run's totals after it."""

    task: TaskInfo
    batch_trials: int
    batch_valid: int
    task_trials: int
    task_best_secs: float | None
    total_trials: int
    elapsed_secs: float
    estimated_model_secs: float | None


class ProgressListener(Protocol):
    def on_batch(self, update: BatchUpdate) -> None: ...


class RunState:
    """Best latency and trials per task key, shared by the callback and the final summary.

    ``known_best`` seeds tasks whose latency is already known (reused from the database), so the
    estimated model latency counts them from the start.
    """

    def __init__(self, tasks: Sequence[TaskInfo], known_best: dict[str, float]) -> None:
        self.tasks = {task.key: task for task in tasks}
        self.best: dict[str, float] = dict(known_best)
        self.trials: dict[str, int] = {task.key: 0 for task in tasks}
        self.total_trials = 0
        self.started = time.monotonic()
        self.lock = threading.Lock()

    def estimated_model_secs(self) -> float | None:
        """Sum of weight × best latency over all tasks, or ``None`` while any task is unmeasured."""
        if any(key not in self.best for key in self.tasks):
            return None
        return sum(
            self.tasks[key].weight * secs for key, secs in self.best.items() if key in self.tasks
        )

    def record(self, key: str, latencies: list[float | None]) -> BatchUpdate:
        with self.lock:
            valid = [s for s in latencies if s is not None]
            if valid:
                self.best[key] = min([*valid, self.best.get(key, math.inf)])
            self.trials[key] = self.trials.get(key, 0) + len(latencies)
            self.total_trials += len(latencies)
            return BatchUpdate(
                task=self.tasks[key],
                batch_trials=len(latencies),
                batch_valid=len(valid),
                task_trials=self.trials[key],
                task_best_secs=self.best.get(key),
                total_trials=self.total_trials,
                elapsed_secs=time.monotonic() - self.started,
                estimated_model_secs=self.estimated_model_secs(),
            )


@derived_object
class ProgressCallback(ms.measure_callback.PyMeasureCallback):
    """Measure callback: ``task_keys[i]`` is the key of MetaSchedule task ``i``."""

    def __init__(
        self, state: RunState, task_keys: Sequence[str], listeners: Sequence[ProgressListener]
    ) -> None:
        super().__init__()
        self.state = state
        self.task_keys = list(task_keys)
        self.listeners = list(listeners)

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        try:
            key = self.task_keys[int(task_id)]
            latencies = [
                None if built.error_msg else mean_run_secs(ran)
                for built, ran in zip(builder_results, runner_results, strict=False)
            ]
            update = self.state.record(key, latencies)
        except Exception:  # noqa: BLE001 - never abort tuning from a callback
            logger.exception("progress callback failed")
            return
        for listener in self.listeners:
            try:
                listener.on_batch(update)
            except Exception:  # noqa: BLE001
                logger.exception("progress listener %r failed", listener)
