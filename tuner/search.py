"""Run MetaSchedule's search over a set of extracted tasks, writing through a SQL database.

``run_search`` is a thin, explicit call of ``ms.tune_tasks``: evolutionary search (minus the
schedules the database already holds: :mod:`tuner.skip_stored`), the gradient
task scheduler (committing each batch before the next: :mod:`tuner.scheduler`), MetaSchedule's
default measure callbacks (which commit every measured candidate
to ``database``, failures included) plus TuneHub's own (error texts, progress).
"""
from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from tvm.s_tir import meta_schedule as ms

from tuner.intrinsics import load_tensor_intrinsics
from tuner.measure import MeasureConfig, make_builder, make_runner
from tuner.primed_database import SiblingPrimedDatabase
from tuner.scheduler import BatchCommittingGradient
from tuner.seed import measure_default_schedules
from tuner.sibling_seeds import SiblingSeeds
from tuner.skip_stored import SkipStoredSchedules
from tuner.space import design_space


@dataclass(frozen=True)
class SearchConfig:
    """Evolutionary-search settings; the defaults are MetaSchedule's own.

    Smaller populations trade search quality for speed (tests use them to tune in seconds).
    ``sibling_seeds`` (TuneHub's, not MetaSchedule's) lets a run that knows its tasks' database
    rows measure siblings' best schedules first (:mod:`tuner.sibling_seeds`);
    ``sibling_population`` (TuneHub's too; off: no gain shown in an A/B pair) puts siblings'
    refitted schedules in each batch's initial population (:mod:`tuner.primed_database`).
    """

    population_size: int = 512
    init_measured_ratio: float = 0.2
    init_min_unmeasured: int = 50
    genetic_num_iters: int = 4
    genetic_mutate_prob: float = 0.85
    eps_greedy: float = 0.05
    sibling_seeds: bool = True
    sibling_population: bool = False

    def strategy(self) -> ms.search_strategy.EvolutionarySearch:
        return ms.search_strategy.EvolutionarySearch(
            population_size=self.population_size,
            init_measured_ratio=self.init_measured_ratio,
            init_min_unmeasured=self.init_min_unmeasured,
            genetic_num_iters=self.genetic_num_iters,
            genetic_mutate_prob=self.genetic_mutate_prob,
            eps_greedy=self.eps_greedy,
        )


FAST_SEARCH = SearchConfig(population_size=64, init_min_unmeasured=16, genetic_num_iters=1)


def reset_metaschedule_logging() -> None:
    """Prepare MetaSchedule's loggers for a new run in this process.

    MetaSchedule re-runs ``logging.config.dictConfig`` for every tuning run, listing the handlers
    already attached to its logger by name; a handler left from an earlier run whose stream was
    closed or renamed (seen under pytest's output capture) makes that call fail. Each run gets
    fresh handlers, so the old ones are closed and removed. The console stays at WARNING:
    MetaSchedule prints a task table at INFO after every batch, and TuneHub shows progress itself.
    """
    for name in ("tvm.s_tir.meta_schedule", "tvm.meta_schedule"):
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()
        logger.setLevel(logging.WARNING)


def default_cost_model() -> str:
    """``"xgb"`` (MetaSchedule's XGBoost model) where the ``xgboost`` module is installed, else
    ``"random"`` (e.g. on a GPU host that only carries the TVM runtime stack). Below
    ``num_warmup_samples`` (100) measured candidates per task the XGBoost model ranks randomly
    too."""
    if importlib.util.find_spec("xgboost") is not None:
        return "xgb"
    logging.getLogger(__name__).warning("xgboost is not installed: using a random cost model")
    return "random"


def run_search(
    extracted_tasks: Sequence[Any],
    *,
    database: Any,
    target_kind: str,
    trials: int,
    batch_size: int,
    work_dir: str,
    measure: MeasureConfig,
    search: SearchConfig | None = None,
    callbacks: Sequence[Any] = (),
    cost_model: Any = None,
    space: Any = None,
    num_threads: int | None = None,
    seed: int | None = None,
    seeds: SiblingSeeds | None = None,
) -> None:
    """Tune ``extracted_tasks`` for at most ``trials`` (+ one batch, as MetaSchedule overshoots).

    ``callbacks`` run after MetaSchedule's default ones (database commit, artifact cleanup,
    cost-model update). On CUDA the default (DLight) schedule of each task is measured and stored
    first (:mod:`tuner.seed`). ``cost_model`` defaults to :func:`default_cost_model`, ``space`` to
    :func:`tuner.space.design_space` of the target. ``seeds`` (in the order of
    ``extracted_tasks``) offers each task its siblings' schedules: measured within ``trials``
    (``search.sibling_seeds``) and in the search's populations (``search.sibling_population``).
    Raises whatever MetaSchedule raises (e.g. ``ValueError`` for no tasks).
    """
    threads = num_threads or len(os.sched_getaffinity(0))
    load_tensor_intrinsics(target_kind)
    tasks = list(extracted_tasks)
    config = search or SearchConfig()
    strategy = config.strategy()
    if hasattr(database, "holds"):
        primed = (SiblingPrimedDatabase(database, seeds)
                  if seeds is not None and config.sibling_population else None)
        strategy = SkipStoredSchedules(strategy, database, primed)
    contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
        tasks,
        work_dir,
        space=space or design_space(target_kind, tasks[0].target if tasks else None),
        strategy=strategy,
        num_threads=threads,
        seed=seed,
    )
    measure_callbacks = [*ms.measure_callback.MeasureCallback.create("default"), *callbacks]
    builder, runner = make_builder(measure), make_runner(measure)
    if target_kind == "cuda":
        measure_default_schedules(tasks, database, builder, runner)
    ms.tune_tasks(
        tasks=contexts,
        task_weights=weights,
        work_dir=work_dir,
        max_trials_global=trials,
        num_trials_per_iter=batch_size,
        builder=builder,
        runner=runner,
        database=database,
        cost_model=cost_model or default_cost_model(),
        measure_callbacks=measure_callbacks,
        task_scheduler=BatchCommittingGradient(
            seed=seed,
            max_trials=trials,
            seeding=(partial(seeds.seed, builder=builder, runner=runner)
                     if seeds is not None and config.sibling_seeds else None),
        ),
    )
