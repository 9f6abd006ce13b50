"""MetaSchedule's search strategy, minus the candidates the database already holds.

MetaSchedule's evolutionary search starts each batch's population from the task's best stored
records and keeps from measurement only what it measured itself in this run (its
``measured_workloads_``; the source says "TODO: add records from the database to avoid
re-measuring"). A cost model that ranks well scores those stored best schedules first, so they
are measured again: in a ``--continue`` run of ResNet-18 with the transferred model, 25 of 40
trials re-measured stored schedules, and a sibling seed (:mod:`tuner.task_scheduler.sibling_seeds`)
was measured a second time by the search in 27 of 31 cases.

:class:`SkipStoredSchedules` wraps the strategy and drops, from each batch it generates, every
candidate of which the database holds a record (:meth:`MetaScheduleDatabase.holds
<db.metaschedule_database.MetaScheduleDatabase.holds>`: same trace). The wrapped strategy
still learns about them through its own state (it marked them measured when it picked them), so
the next batch differs. A batch can come out empty; the scheduler then simply picks again.
"""

from __future__ import annotations

from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms


@derived_object
class SkipStoredSchedules(ms.search_strategy.PySearchStrategy):
    """``inner`` (a MetaSchedule ``SearchStrategy``) without the schedules ``database`` holds.

    ``database`` is a :class:`db.metaschedule_database.MetaScheduleDatabase` (anything with its
    ``holds(mod, candidates)``). ``search_database``, when given, is the database ``inner`` reads
    instead of the scheduler's (a :class:`tuner.database.primed.SiblingPrimedDatabase`).
    :attr:`skipped` counts the candidates dropped by this strategy and its clones (MetaSchedule
    gives each task a clone).
    """

    def __init__(
        self,
        inner: Any,
        database: Any,
        search_database: Any = None,
        counts: dict[str, int] | None = None,
    ) -> None:
        super().__init__()
        self.inner = inner
        self.database = database
        self.search_database = search_database
        self.counts = counts if counts is not None else {"skipped": 0}
        self._mod = None

    @property
    def skipped(self) -> int:
        return self.counts["skipped"]

    def _initialize_with_tune_context(self, context: Any) -> None:
        self._mod = context.mod
        self.inner._initialize_with_tune_context(context)  # noqa: SLF001 - MetaSchedule's hook

    def pre_tuning(
        self, max_trials, num_trials_per_iter, design_spaces, database=None, cost_model=None
    ) -> None:
        self.inner.pre_tuning(
            max_trials,
            num_trials_per_iter,
            design_spaces,
            database if self.search_database is None else self.search_database,
            cost_model,
        )  # not ``or``: a database with no records is falsy

    def post_tuning(self) -> None:
        self.inner.post_tuning()

    def generate_measure_candidates(self) -> list[Any] | None:
        candidates = self.inner.generate_measure_candidates()
        if not candidates:
            return candidates
        held = self.database.holds(self._mod, candidates)
        self.counts["skipped"] += sum(held)
        return [c for c, stored in zip(candidates, held, strict=True) if not stored]

    def notify_runner_results(self, measure_candidates, results) -> None:
        self.inner.notify_runner_results(measure_candidates, results)

    def clone(self) -> Any:
        return SkipStoredSchedules(
            self.inner.clone(), self.database, self.search_database, self.counts
        )
