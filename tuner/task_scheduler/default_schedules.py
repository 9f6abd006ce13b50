"""Measure each GPU task's default schedule (DLight) and store it as a tuning record.

A CUDA library is compiled with the best record of each task and DLight's default GPU schedule
for tasks without records (``compile_relax``). Without a record of the default schedule, a short
search whose candidates are all slower than DLight would still replace it: tuning would make the
library slower. :func:`measure_default_schedules` builds and times the DLight schedule of each
task with the same builder and runner as the search and commits it as an ordinary record, so the
best record of a task is never slower than its untuned schedule, and the evolutionary search
starts from a known good measurement (it seeds its population from the database's best records).
Tasks that already have a valid record for this target are left alone (no new measurement).

The cost is one measurement per task, on top of the trial budget.
"""
from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tvm
from tvm.s_tir import meta_schedule as ms

logger = logging.getLogger(__name__)


def default_schedule(mod: tvm.IRModule, target: tvm.target.Target) -> Any | None:
    """DLight's default GPU schedule of the single-function workload ``mod`` (a ``Schedule`` with
    its trace), or ``None`` when no DLight rule applies or the schedule cannot be made."""
    from tvm.s_tir import dlight as dl

    rules = (dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
             dl.gpu.Fallback())
    (gvar, func), = mod.functions.items()
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


def measure_default_schedules(
    extracted_tasks: Sequence[Any], database: Any, builder: Any, runner: Any
) -> int:
    """Build, run and commit the default schedule of every task that has no valid record yet.

    Failures are committed too (``run_secs = [1e10]``), like any failed candidate. Returns the
    number of records committed. Never raises for a schedule that fails to build or run.
    """
    pending = []
    for task in extracted_tasks:
        mod = task.dispatched[0]
        target = task.target
        workload = database.commit_workload(mod)
        if database.get_top_k(workload, 1):
            continue
        sch = default_schedule(mod, target)
        if sch is None:
            continue
        args_info = ms.arg_info.ArgInfo.from_entry_func(mod)
        pending.append((workload, sch, target, args_info))
    if not pending:
        return 0
    built = builder.build([ms.builder.BuilderInput(sch.mod, target) for _, sch, target, _ in pending])
    runs: list[Any] = [None] * len(pending)
    inputs, where = [], []
    for index, ((_, _, target, args_info), result) in enumerate(zip(pending, built)):
        if result.error_msg is None:
            inputs.append(ms.runner.RunnerInput(result.artifact_path, target.kind.name, args_info))
            where.append(index)
    for index, future in zip(where, runner.run(inputs)):
        runs[index] = future.result()
    for (workload, sch, target, args_info), result, ran in zip(pending, built, runs):
        ok = ran is not None and ran.error_msg is None and ran.run_secs
        run_secs = list(ran.run_secs) if ok else [1e10]
        if not ok:
            logger.warning("default schedule failed: %s",
                           (result.error_msg or (ran.error_msg if ran else "") or "")[-300:])
        database.commit_tuning_record(
            ms.database.TuningRecord(sch.trace, workload, run_secs, target, args_info)
        )
        if result.artifact_path:
            shutil.rmtree(Path(result.artifact_path).parent, ignore_errors=True)
    return len(pending)
