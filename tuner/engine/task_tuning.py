"""Tune a lease's workloads: the one search (:func:`tuner.engine.search.run_search`) on a lease's
view.

A distributed worker does not hold the tuning database. :func:`tune_workloads` runs the same
search as ``tunehub tune``, over the lease's tasks (one or several workloads of a job:
MetaSchedule's gradient task scheduler spreads the trials over them), with the lease's roles: a
:class:`tuner.database.lease.LeaseDatabase` holding the server's best records for each task and
the keys of every schedule it holds (so the search skips them), sibling seeds from the server's
siblings of each task (:class:`tuner.task_scheduler.sibling_seeds.LeaseSiblings`),
default-schedule seeds on GPU, and :class:`tuner.measure_callback.upload_batches.UploadBatches`
handing every measured batch to ``on_batch`` (the worker uploads it); when ``on_batch`` answers
``False`` tuning stops at once.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm
from tvm.s_tir import meta_schedule as ms

from compiler.target import TargetSpec
from compiler.task_family import workload_family
from tuner.database.lease import LeaseDatabase
from tuner.engine.reports import SearchReport
from tuner.engine.search import SearchConfig, reset_metaschedule_logging, run_search, search_report
from tuner.jobs.protocol import LeaseContext
from tuner.measure_callback.upload_batches import MeasuredBatch, UploadBatches
from tuner.measuring.builder_runner import MeasureConfig, RpcConfig
from tuner.task_scheduler.sibling_seeds import LeaseSiblings, SeedTask, SiblingSeeds

logger = logging.getLogger(__name__)

__all__ = ["LeaseTuning", "LeasedWorkload", "MeasuredBatch", "tune_workloads"]


@dataclass(frozen=True)
class LeasedWorkload:
    """One workload of a lease: its TIR module, its task name and the server's context for it."""

    mod: tvm.IRModule
    task_name: str
    context: LeaseContext


@dataclass(frozen=True)
class LeaseTuning:
    """How a lease's search ended: candidates measured (seeds included), whether ``on_batch``
    stopped it, and what its search features did."""

    trials: int
    stopped: bool
    report: SearchReport


def tune_workloads(
    workloads: Sequence[LeasedWorkload],
    target: TargetSpec,
    *,
    trials: int,
    batch_size: int,
    on_batch: Callable[[MeasuredBatch], bool],
    measure: MeasureConfig | None = None,
    search: SearchConfig | None = None,
    rpc: RpcConfig | None = None,
    seed: int | None = None,
    num_threads: int | None = None,
    cost_model: Any | None = None,
) -> LeaseTuning:
    """Measure up to ``trials`` candidates of ``workloads`` (together: the gradient task
    scheduler chooses which task each batch of ``batch_size`` measures) and hand each batch to
    ``on_batch`` (:attr:`MeasuredBatch.task_index` is the workload's index in ``workloads``).

    ``trials`` measured below ``trials`` without ``stopped`` means the search ran out of new
    candidates. ``cost_model``: a MetaSchedule cost model (e.g. the target's transferred
    :class:`cost_model.transfer.TransferCostModel`, kept by the worker across the task's
    leases); default MetaSchedule's cold XGBModel. Either is first updated with the seed
    records. Raises ``ValueError`` for no workloads, and what MetaSchedule raises for a task
    it cannot tune.
    """
    if not workloads:
        raise ValueError("a lease's search needs at least one workload")
    measure = measure or MeasureConfig.for_target(target.kind)
    reset_metaschedule_logging()
    tvm_target = target.tvm_target()
    database = LeaseDatabase(target, [(w.mod, w.context) for w in workloads])
    config = search or SearchConfig()
    seeds = None
    if config.sibling_seeds or config.sibling_population:
        tasks = [
            SeedTask(w.context.workload_id, workload_family(w.task_name), w.context.flops)
            for w in workloads
        ]
        source = LeaseSiblings(
            [w.context for w in workloads],
            database,
            [(task, tvm.ir.save_json(w.mod)) for task, w in zip(tasks, workloads, strict=True)],
        )
        seeds = SiblingSeeds(database, tasks, source=source)
    callback = UploadBatches(on_batch)
    extracted = [
        ms.ExtractedTask(
            task_name=w.task_name, mod=w.mod, target=tvm_target, dispatched=[w.mod], weight=1
        )
        for w in workloads
    ]
    work_dir = tempfile.mkdtemp(prefix="tunehub-lease-")
    report = SearchReport()
    try:
        try:
            report = run_search(
                extracted,
                database=database,
                target_kind=target.kind,
                trials=trials,
                batch_size=batch_size,
                work_dir=work_dir,
                measure=measure,
                search=config,
                callbacks=[callback],
                cost_model=cost_model,
                num_threads=num_threads,
                seed=seed,
                seeds=seeds,
                rpc=rpc,
            )
        except BaseException:
            if not callback.stopped:
                raise
            report = search_report(seeds, None, None)  # what a stopped run counted of its seeds
        kind = "transfer" if cost_model is not None else "cold"
        return LeaseTuning(callback.trials, callback.stopped, report.with_cost_model(kind))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
        for artifact in callback.artifacts:  # what RemoveBuildArtifact would have removed
            parent = Path(artifact).parent
            if parent.name.startswith("tmp") and parent != Path(tempfile.gettempdir()):
                shutil.rmtree(parent, ignore_errors=True)
