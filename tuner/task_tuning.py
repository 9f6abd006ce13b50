"""Tune one workload for a lease: the one search (:func:`tuner.search.run_search`) on a lease's
view.

A distributed worker does not hold the tuning database. :func:`tune_workload` runs the same
search as ``tunehub tune``, with the lease's roles: a :class:`tuner.database.lease.LeaseDatabase`
holding the server's best records for the task and the keys of every schedule it holds (so the
search skips them), sibling seeds from the server's siblings of the task
(:class:`tuner.task_scheduler.sibling_seeds.LeaseSiblings`), default-schedule seeds on GPU, and
:class:`tuner.measure_callback.upload_batches.UploadBatches` handing every measured batch to
``on_batch`` (the worker uploads it); when ``on_batch`` answers ``False`` tuning stops at once.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm
from tvm.s_tir import meta_schedule as ms

from compiler.target import TargetSpec
from compiler.task_family import workload_family
from tuner.database.lease import LeaseDatabase
from tuner.measure import MeasureConfig, RpcConfig
from tuner.measure_callback.upload_batches import MeasuredBatch, UploadBatches
from tuner.reports import SearchReport
from tuner.search import SearchConfig, reset_metaschedule_logging, run_search, search_report
from tuner.task_scheduler.sibling_seeds import LeaseSiblings, SeedTask, SiblingSeeds
from tuner.work import LeaseContext

logger = logging.getLogger(__name__)

__all__ = ["LeaseTuning", "MeasuredBatch", "tune_workload"]


@dataclass(frozen=True)
class LeaseTuning:
    """How a lease's search ended: candidates measured (seeds included), whether ``on_batch``
    stopped it, and what its search features did."""

    trials: int
    stopped: bool
    report: SearchReport


def tune_workload(
    mod: tvm.IRModule,
    target: TargetSpec,
    *,
    task_name: str,
    trials: int,
    batch_size: int,
    on_batch: Callable[[MeasuredBatch], bool],
    context: LeaseContext,
    measure: MeasureConfig | None = None,
    search: SearchConfig | None = None,
    rpc: RpcConfig | None = None,
    seed: int | None = None,
    num_threads: int | None = None,
    cost_model: Any | None = None,
) -> LeaseTuning:
    """Measure up to ``trials`` candidates of ``mod`` in batches of ``batch_size``.

    ``trials`` measured below ``trials`` without ``stopped`` means the search ran out of new
    candidates. ``cost_model``: a MetaSchedule cost model (e.g. the target's transferred
    :class:`cost_model.transfer.TransferCostModel`, kept by the worker across the task's
    leases); default MetaSchedule's cold XGBModel. Either is first updated with the seed
    records. Raises what MetaSchedule raises for a task it cannot tune.
    """
    measure = measure or MeasureConfig.for_target(target.kind)
    reset_metaschedule_logging()
    tvm_target = target.tvm_target()
    database = LeaseDatabase(mod, target, context)
    config = search or SearchConfig()
    seeds = None
    if config.sibling_seeds or config.sibling_population:
        task = SeedTask(context.workload_id, workload_family(task_name), context.flops)
        seeds = SiblingSeeds(database, [task], source=LeaseSiblings(context))
    callback = UploadBatches(on_batch)
    task = ms.ExtractedTask(
        task_name=task_name, mod=mod, target=tvm_target, dispatched=[mod], weight=1
    )
    work_dir = tempfile.mkdtemp(prefix="tunehub-lease-")
    report = SearchReport()
    try:
        try:
            report = run_search(
                [task],
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
