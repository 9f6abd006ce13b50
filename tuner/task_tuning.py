"""Tune one workload for a lease: MetaSchedule's evolutionary search from the records known so far.

A distributed worker does not hold the tuning database. :func:`tune_workload` builds a local
in-memory MetaSchedule database seeded with the records the server already has for the task (so
a resumed task continues from its best schedules instead of starting over), warms the XGBoost
cost model with them, and runs ``ms.tune_tasks`` on that single task. After every measured batch
:class:`BatchCallback` turns the batch into :class:`tuner.work.RecordUpload` objects (failures
with their error text) and hands them to ``on_batch`` (the worker uploads them); when
``on_batch`` answers ``False`` (lease lost, job cancelled, worker stopping) tuning stops at once.
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from compiler.target import TargetSpec
from tuner.intrinsics import load_tensor_intrinsics
from tuner.measure import MeasureConfig, RpcConfig, make_builder, make_runner
from tuner.search import SearchConfig, reset_metaschedule_logging
from tuner.space import design_space
from tuner.work import RecordUpload

logger = logging.getLogger(__name__)

FAILED_RUN_SECS = 1e10


@dataclass(frozen=True)
class MeasuredBatch:
    """One measured batch: its records (in candidate order) and its best valid mean latency."""

    records: tuple[RecordUpload, ...]
    best_secs: float | None


class StopTuning(BaseException):
    """Raised from the batch callback to end tuning (a BaseException: nothing in between may
    swallow it; MetaSchedule's FFI turns it into an error that aborts ``tune_tasks``)."""


@derived_object
class BatchCallback(ms.measure_callback.PyMeasureCallback):
    """Measure callback: each batch's records go to ``on_batch``; ``False`` stops tuning."""

    def __init__(self, workload: ms.database.Workload, on_batch: Callable[[MeasuredBatch], bool]):
        super().__init__()
        self.workload = workload
        self.on_batch = on_batch
        self.trials = 0
        self.stopped = False
        self.artifacts: list[str] = []

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        records: list[RecordUpload] = []
        means: list[float] = []
        for candidate, built, ran in zip(measure_candidates, builder_results, runner_results, strict=False):
            if built.artifact_path:
                self.artifacts.append(str(built.artifact_path))
            error = built.error_msg or (ran.error_msg if ran is not None else None)
            run_secs: tuple[float, ...]
            if error or ran is None or not ran.run_secs:
                run_secs = (FAILED_RUN_SECS,)
            else:
                run_secs = tuple(float(x) for x in ran.run_secs)
                if all(math.isfinite(v) and 0 < v < 1e9 for v in run_secs):
                    means.append(sum(run_secs) / len(run_secs))
            trace, _, _, args_info = ms.database.TuningRecord(
                candidate.sch.trace, self.workload, None, None, list(candidate.args_info)
            ).as_json()
            records.append(RecordUpload(trace, run_secs, args_info, str(error) if error else None))
        self.trials += len(records)
        if not self.on_batch(MeasuredBatch(tuple(records), min(means) if means else None)):
            self.stopped = True
            raise StopTuning("tuning stopped by the worker")


def _seed_database(mod: tvm.IRModule, seeds: Sequence[Sequence[Any]]):
    database = ms.database.MemoryDatabase()
    workload = database.commit_workload(mod)
    records = []
    for entry in seeds:
        try:
            record = ms.database.TuningRecord.from_json(list(entry), workload)
        except Exception as err:  # noqa: BLE001 - a bad seed must not stop tuning
            logger.warning("skipped a seed record that does not replay: %s", err)
            continue
        database.commit_tuning_record(record)
        records.append(record)
    return database, workload, records


def _warm_cost_model(
    context: ms.TuneContext, records: Sequence[Any], model: Any | None = None
) -> ms.cost_model.CostModel:
    """``model`` (default: a cold XGBoost) updated with the seed records (STACK.md: ``update``
    with measure candidates and runner results built from database records), so a resumed
    task's first batch is chosen by a model instead of at random."""
    from tuner.search import default_cost_model

    given = model is not None
    if not given and default_cost_model() == "random":  # no xgboost on this host
        return ms.cost_model.RandomModel()
    model = model if given else ms.cost_model.XGBModel(num_warmup_samples=100)
    if not records:
        return model
    try:
        model.update(
            context,
            [r.as_measure_candidate() for r in records],
            [ms.runner.RunnerResult([float(x) for x in r.run_secs], None) for r in records],
        )
    except Exception as err:  # noqa: BLE001 - warm start is an optimization
        logger.warning("cost model warm start failed: %s", err)
        return model if given else ms.cost_model.XGBModel(num_warmup_samples=100)
    return model


def tune_workload(
    mod: tvm.IRModule,
    target: TargetSpec,
    *,
    task_name: str,
    trials: int,
    batch_size: int,
    on_batch: Callable[[MeasuredBatch], bool],
    seeds: Sequence[Sequence[Any]] = (),
    measure: MeasureConfig | None = None,
    search: SearchConfig | None = None,
    rpc: RpcConfig | None = None,
    seed: int | None = None,
    num_threads: int | None = None,
    cost_model: Any | None = None,
) -> tuple[int, bool]:
    """Measure up to ``trials`` candidates of ``mod`` in batches of ``batch_size``.

    Returns ``(trials measured, stopped)``: ``stopped`` is true when ``on_batch`` ended tuning.
    ``trials measured`` below ``trials`` without ``stopped`` means the search ran out of new
    candidates. ``cost_model``: a MetaSchedule cost model to use (e.g. the target's transferred
    :class:`cost_model.transfer.TransferCostModel`); default MetaSchedule's cold XGBModel. Either
    is first updated with the seed records. Raises what MetaSchedule raises for a task it cannot
    tune.
    """
    measure = measure or MeasureConfig.for_target(target.kind)
    threads = num_threads or len(os.sched_getaffinity(0))
    load_tensor_intrinsics(target.kind)
    reset_metaschedule_logging()
    tvm_target = target.tvm_target()
    database, workload, records = _seed_database(mod, seeds)
    callback = BatchCallback(workload, on_batch)
    work_dir = tempfile.mkdtemp(prefix="tunehub-lease-")
    try:
        (logger_,) = ms.logging.get_loggers_from_work_dir(work_dir, [task_name])
        context = ms.TuneContext(
            mod=mod,
            target=tvm_target,
            space_generator=design_space(target.kind, tvm_target),
            search_strategy=(search or SearchConfig()).strategy(),
            task_name=task_name,
            rand_state=-1 if seed is None else seed,
            num_threads=threads,
            logger=logger_,
        ).clone()
        defaults = list(ms.measure_callback.MeasureCallback.create("default"))
        if rpc is not None:  # STACK.md: it removes whole directories; remote runs keep theirs
            defaults = [c for c in defaults
                        if not isinstance(c, ms.measure_callback.RemoveBuildArtifact)]
        try:
            ms.tune_tasks(
                tasks=[context],
                task_weights=[1.0],
                work_dir=work_dir,
                max_trials_global=trials,
                max_trials_per_task=trials,
                num_trials_per_iter=max(1, min(batch_size, trials)),
                builder=make_builder(measure),
                runner=make_runner(measure, rpc),
                database=database,
                cost_model=_warm_cost_model(context, records, cost_model),
                measure_callbacks=[*defaults, callback],
                task_scheduler="round-robin",
            )
        except BaseException:
            if not callback.stopped:
                raise
        return callback.trials, callback.stopped
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
        for artifact in callback.artifacts:  # what RemoveBuildArtifact would have removed
            parent = Path(artifact).parent
            if parent.name.startswith("tmp") and parent != Path(tempfile.gettempdir()):
                shutil.rmtree(parent, ignore_errors=True)
