"""The one tuning engine: MetaSchedule's search over a set of tasks, with TuneHub's roles plugged
in.

``run_search`` is an explicit call of ``ms.tune_tasks``, composed the way MetaSchedule composes
``tune_tasks`` itself, from roles (see its docstring): the database the search reads, the
search-strategy wrapper (:mod:`tuner.search_strategy`), the task scheduler and its seeds
(:mod:`tuner.task_scheduler`), the cost model, the measure callbacks (:mod:`tuner.measure_callback`
and :mod:`db`). Every way a job runs calls it: ``tunehub tune`` and the service's in-process runs
(:mod:`tuner.jobs.job`) on the SQL database, lease workers (:mod:`tuner.engine.task_tuning`) on a
lease's.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tvm.s_tir import meta_schedule as ms

from compiler.lowering.intrinsics import load_tensor_intrinsics
from tuner.database.primed import SiblingPrimedDatabase
from tuner.engine.reports import SearchReport
from tuner.engine.search_time import SearchTime, profiled
from tuner.engine.space import design_space
from tuner.measuring.builder_runner import MeasureConfig, RpcConfig, make_builder, make_runner
from tuner.search_strategy.cold_start import ColdStartSearch, warming_up
from tuner.search_strategy.skip_stored import SkipStoredSchedules
from tuner.task_scheduler.default_schedules import DefaultScheduleSeeds
from tuner.task_scheduler.gradient import BatchCommittingGradient
from tuner.task_scheduler.seeds import SeedChain
from tuner.task_scheduler.sibling_seeds import SiblingSeeds


@dataclass(frozen=True)
class SearchConfig:
    """Evolutionary-search settings; the defaults are MetaSchedule's own but the population.

    ``population_size`` is 128 (MetaSchedule's is 512): on the 2-core Xeon a whole ResNet-18 at
    300 equal trials searched at 0.67 trials/s against 0.23 and took 579 s against 1,487, with
    the tuned build as fast against its zero-trial build (1.036x against 1.045x); on three
    single tasks, two seeds each, 160 trials, the best schedules found were as fast
    (``bench/results/search_rate_2026-12-07_resnet18_300.md``, ``_warm.md``, ``_warm2.md``).
    :meth:`of_population` sets another (``tunehub tune --population``,
    ``TUNEHUB_SEARCH_POPULATION``). Smaller populations trade search quality for speed (tests use
    them to tune in seconds).
    ``sibling_seeds`` (TuneHub's, not MetaSchedule's) lets a run that knows its tasks' database
    rows measure siblings' best schedules first (:mod:`tuner.task_scheduler.sibling_seeds`);
    ``sibling_population`` (TuneHub's too; off: no gain shown in an A/B pair) puts siblings'
    refitted schedules in each batch's initial population (:mod:`tuner.database.primed`).
    ``cold_population`` (TuneHub's): while a learning cost model still ranks at random (below its
    warm-up), batches come from a population of this size (at least twice the batch) without
    genetic generations (:mod:`tuner.search_strategy.cold_start`); 0 evolves every batch.
    """

    population_size: int = 128
    init_measured_ratio: float = 0.2
    init_min_unmeasured: int = 50
    genetic_num_iters: int = 4
    genetic_mutate_prob: float = 0.85
    eps_greedy: float = 0.05
    sibling_seeds: bool = True
    sibling_population: bool = False
    cold_population: int = 64

    @staticmethod
    def of_population(population: int) -> SearchConfig:
        """The default settings with ``population`` schedules per generation: as many of its
        first population drawn at random as the default's (50), or half of a smaller one."""
        return SearchConfig(
            population_size=population, init_min_unmeasured=min(50, population // 2)
        )

    def evolutionary(
        self, population_size: int | None = None, genetic_num_iters: int | None = None
    ) -> ms.search_strategy.EvolutionarySearch:
        """MetaSchedule's evolutionary search with these settings (or the two overridden)."""
        population = self.population_size if population_size is None else population_size
        return ms.search_strategy.EvolutionarySearch(
            population_size=population,
            init_measured_ratio=self.init_measured_ratio,
            init_min_unmeasured=min(self.init_min_unmeasured, population),
            genetic_num_iters=self.genetic_num_iters
            if genetic_num_iters is None
            else genetic_num_iters,
            genetic_mutate_prob=self.genetic_mutate_prob,
            eps_greedy=self.eps_greedy,
        )

    def strategy(self, cost_model: Any = None) -> Any:
        """The search strategy: :meth:`evolutionary`, inside a
        :class:`tuner.search_strategy.cold_start.ColdStartSearch` when ``cost_model`` is given
        (with ``cold_population`` 0 it evolves every batch and only counts them)."""
        if cost_model is None:
            return self.evolutionary()
        cold = self.cold_population > 0
        return ColdStartSearch(
            self.evolutionary(),
            (lambda population: self.evolutionary(population, genetic_num_iters=0))
            if cold
            else None,
            min(self.cold_population, self.population_size),
            lambda: warming_up(cost_model),
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


#: Records of each task the cost model is updated with before the first batch (the database's
#: best: a resumed task's or a lease's first batch is then chosen by a model, not at random).
WARM_START_RECORDS = 256


def make_cost_model(model: Any = None) -> Any:
    """``model`` itself, or a new default one (:func:`default_cost_model`) as an object."""
    if model is not None:
        return model
    if default_cost_model() == "random":
        return ms.cost_model.RandomModel()
    return ms.cost_model.XGBModel(num_warmup_samples=100)


def warm_start(model: Any, contexts: Sequence[Any], database: Any) -> int:
    """Update ``model`` with each task's best records in ``database``, as MetaSchedule updates
    it with a measured batch (STACK.md: measure candidates and runner results rebuilt from the
    records). Returns the records used. A failed update is logged, never raised: the warm
    start is an optimization."""
    used = 0
    for context in contexts:
        records = database.get_top_k(database.commit_workload(context.mod), WARM_START_RECORDS)
        if not records:
            continue
        try:
            model.update(
                context,
                [r.as_measure_candidate() for r in records],
                [ms.runner.RunnerResult([float(x) for x in r.run_secs], None) for r in records],
            )
            used += len(records)
        except Exception as err:  # noqa: BLE001 - warm start is an optimization
            logging.getLogger(__name__).warning("cost model warm start failed: %s", err)
    return used


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
    rpc: RpcConfig | None = None,
    on_time: Callable[[SearchTime], None] | None = None,
) -> SearchReport:
    """Tune ``extracted_tasks`` for at most ``trials`` (seeds included) with MetaSchedule.

    The one search of every tuning run: ``tunehub tune`` and the service's in-process runs call it
    with the SQL adapter as ``database`` and its commit callbacks; a lease worker with a
    :class:`tuner.database.lease.LeaseDatabase` and
    :class:`tuner.measure_callback.upload_batches.UploadBatches`. Both get the same roles:

    - search strategy: evolutionary search minus the schedules ``database`` holds
      (:class:`tuner.search_strategy.skip_stored.SkipStoredSchedules`; any database with a
      ``holds`` method), reading sibling-primed populations with ``search.sibling_population``;
    - task scheduler: :class:`tuner.task_scheduler.gradient.BatchCommittingGradient`, which
      measures seeds before a task's batch (:mod:`tuner.task_scheduler.seeds`): on CUDA the
      default (DLight) schedule of each task without a valid record, and with
      ``search.sibling_seeds`` the ``seeds``' sibling schedules (in the order of
      ``extracted_tasks``);
    - cost model: ``cost_model`` (default :func:`default_cost_model`), first updated with each
      task's best records in ``database`` (:func:`warm_start`);
    - measure callbacks: MetaSchedule's defaults (database commit, artifact removal but over
      ``rpc``, cost-model update) plus ``callbacks``; runner: local, or ``rpc``'s tracker.

    ``space`` defaults to :func:`tuner.engine.space.design_space` of the target. ``on_time`` is
    called with where the search's time went (:class:`tuner.engine.search_time.SearchTime`,
    MetaSchedule's profiler; trials not counted) when it ends without raising. Returns what the
    search features did (``cost_model`` left ``cold``: the caller knows which model it passed).
    Raises whatever MetaSchedule raises (e.g. ``ValueError`` for no tasks), and whatever a callback
    raises to stop tuning.
    """
    threads = num_threads or len(os.sched_getaffinity(0))
    load_tensor_intrinsics(target_kind)
    tasks = list(extracted_tasks)
    config = search or SearchConfig()
    model = make_cost_model(cost_model)
    strategy = evolutionary = config.strategy(model)
    skip = None
    if hasattr(database, "holds"):
        primed = (
            SiblingPrimedDatabase(database, seeds)
            if seeds is not None and config.sibling_population
            else None
        )
        strategy = skip = SkipStoredSchedules(strategy, database, primed)
    contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
        tasks,
        work_dir,
        space=space or design_space(target_kind, tasks[0].target if tasks else None),
        strategy=strategy,
        num_threads=threads,
        seed=seed,
    )
    defaults = list(ms.measure_callback.MeasureCallback.create("default"))
    if rpc is not None:  # STACK.md: it removes whole directories; remote runs keep theirs
        defaults = [
            c for c in defaults if not isinstance(c, ms.measure_callback.RemoveBuildArtifact)
        ]
    seeders: list[Any] = []
    defaults_seeder = DefaultScheduleSeeds(database) if target_kind == "cuda" else None
    if defaults_seeder is not None:
        seeders.append(defaults_seeder)
    if seeds is not None and config.sibling_seeds:
        seeders.append(seeds)
    warm_start(model, contexts, database)
    device = "cuda" if target_kind == "cuda" else "cpu"
    builder, runner = make_builder(measure), make_runner(measure, rpc)
    with profiled() as scopes:
        ms.tune_tasks(
            tasks=contexts,
            task_weights=weights,
            work_dir=work_dir,
            max_trials_global=trials,
            num_trials_per_iter=max(1, min(batch_size, trials)),
            builder=builder,
            runner=runner,
            database=database,
            cost_model=model,
            measure_callbacks=[*defaults, *callbacks],
            task_scheduler=BatchCommittingGradient(
                seed=seed,
                max_trials=trials,
                seeding=SeedChain(seeders, builder=builder, runner=runner, device=device)
                if seeders
                else None,
            ),
        )
    if on_time is not None:  # the profiler's Total is set when it exits
        on_time(SearchTime.from_scopes(scopes()))
    batches = evolutionary.batches if isinstance(evolutionary, ColdStartSearch) else None
    return search_report(seeds, skip, defaults_seeder, batches)


def search_report(
    seeds: SiblingSeeds | None,
    skip: SkipStoredSchedules | None,
    defaults: DefaultScheduleSeeds | None,
    batches: dict[str, int] | None = None,
) -> SearchReport:
    """The :class:`tuner.engine.reports.SearchReport` of a run's seeders and strategy wrappers
    (``batches``: :attr:`tuner.search_strategy.cold_start.ColdStartSearch.batches`)."""
    counts = seeds.summary() if seeds is not None else {}
    batches = batches or {}
    return SearchReport(
        seeds_measured=counts.get("measured", 0),
        seeds_valid=counts.get("valid", 0),
        seeds_did_not_replay=counts.get("did_not_replay", 0),
        seeds_already_stored=counts.get("already_stored", 0),
        skipped_stored=skip.skipped if skip is not None else 0,
        default_schedules=defaults.measured if defaults is not None else 0,
        cold_batches=batches.get("cold", 0),
        evolved_batches=batches.get("evolved", 0),
    )
