"""Measure each GPU task's default schedule (DLight) and store it as a tuning record.

A CUDA library is compiled with the best record of each task and DLight's default GPU schedule
for tasks without records (``compile_relax``). Without a record of the default schedule, a short
search whose candidates are all slower than DLight would still replace it: tuning would make the
library slower. Each task's DLight schedule is built and timed with the same builder and
runner as the search and committed as an ordinary record, so the best record of a task is never
slower than its untuned schedule, and the evolutionary search starts from a known good measurement
(it seeds its population from the database's best records).
:class:`DefaultScheduleSeeds` offers it as a seed (:mod:`tuner.task_scheduler.seeds`) the first
time the scheduler picks the task, so it is measured, stored and reported (uploaded, by a lease
worker) like any candidate and counts as one trial. Tasks that already have a valid record for
this target are left alone (no new measurement).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import tvm
from tvm.s_tir import meta_schedule as ms

from db.types import mean_run_secs

logger = logging.getLogger(__name__)


def default_schedule(mod: tvm.IRModule, target: tvm.target.Target) -> Any | None:
    """DLight's default GPU schedule of the single-function workload ``mod`` (a ``Schedule`` with
    its trace), or ``None`` when no DLight rule applies or the schedule cannot be made."""
    from tvm.s_tir import dlight as dl  # noqa: PLC0415 - GPU targets only

    rules = (
        dl.gpu.Matmul(),
        dl.gpu.GEMV(),
        dl.gpu.Reduction(),
        dl.gpu.GeneralReduction(),
        dl.gpu.Fallback(),
    )
    ((gvar, func),) = mod.functions.items()
    if not isinstance(func, tvm.tirx.PrimFunc):
        return None
    with target:
        for rule in rules:
            try:
                sch = rule.apply(func.with_attr("global_symbol", gvar.name_hint), target, False)
            except Exception:  # noqa: BLE001 - a rule that fails on this workload is skipped
                logger.debug("DLight rule %s failed on %s", type(rule).__name__, gvar.name_hint)
                continue
            if isinstance(sch, list):
                sch = sch[0] if sch else None
            if sch is not None:
                return sch
    return None


class DefaultScheduleSeeds:
    """Seeder (:class:`tuner.task_scheduler.seeds.Seeder`) of each GPU task's default (DLight)
    schedule, offered once per task and only while ``database`` holds no valid record of the
    task for this target. ``measured`` counts the default schedules measured."""

    def __init__(self, database: Any) -> None:
        self.database = database
        self.measured = 0
        self._offered: set[int] = set()

    def candidates(self, task_index: int, context: Any) -> list[ms.MeasureCandidate]:
        if task_index in self._offered:
            return []
        self._offered.add(task_index)
        mod = context.mod
        if self.database.get_top_k(self.database.commit_workload(mod), 1):
            return []
        sch = default_schedule(mod, context.target)
        if sch is None:
            return []
        args = ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)
        return [ms.MeasureCandidate(sch, args)]

    def observe(self, task_index: int, results: Sequence[Any]) -> None:
        self.measured += len(results)
        for result in results:
            if mean_run_secs(result) is None:
                logger.warning(
                    "default schedule of task %d failed: %s",
                    task_index,
                    str(result.error_msg or "")[-300:],
                )
