"""The database the evolutionary search reads: the run's, with sibling schedules in each task's
initial population.

MetaSchedule's evolutionary search starts every batch from ``population_size x
init_measured_ratio`` (512 x 0.2 = 102) of the task's best stored records, read through the
database's ``get_top_k``, and fills the rest with random samples of the design space. A task that
has few records yet starts almost entirely from random schedules, although its siblings (the same
fused operators on other shapes, :mod:`tuner.task_scheduler.sibling_seeds`) may hold many fast ones.

:class:`SiblingPrimedDatabase` is what the search strategy is given instead of the run's database
(:class:`tuner.search_strategy.skip_stored.SkipStoredSchedules` passes it to the strategy's
``pre_tuning``): its ``get_top_k`` returns the task's own best records plus, in up to ``share`` of
the slots, sibling schedules refitted to the task
(:meth:`tuner.task_scheduler.sibling_seeds.SiblingSeeds.population`). They are not measured and
never stored: the cost model scores them with the rest of the population, mutation explores around
them, and only the candidates the search then picks are measured (and counted as trials). Everything
else, commits included, goes to the run's database unchanged; the final build reads the run's
database, never this view.

Off by default (``SearchConfig.sibling_population``): in an A/B pair of warm ResNet-18 runs
(322 trials, batches of 8, sibling seeds in both) the run with primed populations ended at
98.6 ms and the one without at 74.7 ms (cold 2,000-trial final: 67.7 ms); on the MLP both
reached the goal in 113 trials. One run each, and the ResNet-18 runs parted on whether an early
batch found a fast convolution that the seeds then carried to every sibling, so this says
"no gain shown", not "harmful" (``bench/results/cost_model_2026-12-01.md``).
"""

from __future__ import annotations

from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from db.metaschedule_database import MetaScheduleDatabase
from tuner.task_scheduler.sibling_seeds import SiblingSeeds


@derived_object
class SiblingPrimedDatabase(ms.database.PyDatabase):
    """``database`` as the search sees it, its top records extended with ``seeds``' siblings.

    ``share`` (0 to 1) bounds the sibling schedules in one ``get_top_k`` answer; the task's own
    records fill the remaining slots (and any the siblings leave free).
    """

    def __init__(
        self, database: MetaScheduleDatabase, seeds: SiblingSeeds, share: float = 0.5
    ) -> None:
        super().__init__()
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"share must lie in [0, 1], got {share}")
        self.database = database
        self.seeds = seeds
        self.share = share

    def has_workload(self, mod: Any) -> bool:
        return self.database.has_workload(mod)

    def commit_workload(self, mod: Any) -> Any:
        return self.database.commit_workload(mod)

    def commit_tuning_record(self, record: Any) -> None:
        self.database.commit_tuning_record(record)

    def get_top_k(self, workload: Any, top_k: int) -> list[Any]:
        own = self.database.get_top_k(workload, top_k)
        workload_id = self.database.workload_id_of(workload)
        if workload_id is None or top_k <= 0:
            return own
        traces = self.seeds.population(workload_id, workload.mod, int(top_k * self.share))
        siblings = [ms.database.TuningRecord(trace, workload) for trace in traces]
        return own[: top_k - len(siblings)] + siblings

    def get_all_tuning_records(self) -> list[Any]:
        return self.database.get_all_tuning_records()

    def __len__(self) -> int:
        return len(self.database)
