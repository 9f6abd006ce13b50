"""MetaSchedule's evolutionary search, without evolution while the cost model ranks at random.

Each batch of the evolutionary search samples a population (512 schedules by default), mutates it
for four generations guided by the cost model's scores, and measures the best-scored few. Below
its warm-up (``num_warmup_samples``, 100 measured candidates) MetaSchedule's ``XGBModel``
returns uniform random scores: the generations then select at random, and the batch is a random
draw that cost ~2,500 trace replays. In a 96-trial cold run of ResNet-18 (batches of 4) mutation
and sampling took 483 of 561 s (``tunehub tune``'s ``search_time``).

:class:`ColdStartSearch` holds two evolutionary searches of one configuration: the ``warm`` one
as configured, and a ``cold`` one with a small population (the larger of ``cold_population`` and
twice the batch) and no genetic generations. Each batch comes from ``cold`` while
``warming_up(model)`` is true, from ``warm`` after. Both are told every batch's results, so
their trial counts agree. What ``cold`` measured is not in ``warm``'s own list of measured
schedules; the database wrapper around it (:mod:`tuner.search_strategy.skip_stored`) drops a
stored schedule picked again.

MetaSchedule's ``RandomModel`` never learns, so a search with it keeps its configuration: it is
the model of the GPU host (no xgboost), where few random CUDA candidates are valid and mutating
the valid ones may matter; cold batches were measured on the CPU only
(``bench/results/search_rate_2026-12-07_cold.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms


def warming_up(model: Any) -> bool:
    """Whether ``model`` is a learning cost model whose scores are still random, so that evolving
    a population by them is wasted.

    True for MetaSchedule's ``XGBModel`` (and anything with a ``num_warmup_samples``) while it
    holds fewer samples than that or has no booster, and for a
    :class:`cost_model.transfer.TransferCostModel` without a booster yet. False for
    ``RandomModel`` (it never learns: see the module docstring) and for any other model (an
    unknown model is trusted).
    """
    if isinstance(model, ms.cost_model.RandomModel):
        return False
    warmup = getattr(model, "num_warmup_samples", None)
    if warmup is not None:
        return getattr(model, "data_size", 0) < warmup or getattr(model, "booster", None) is None
    if hasattr(model, "base_booster"):  # TransferCostModel: random until its first fit
        return model.booster is None
    return False


@derived_object
class ColdStartSearch(ms.search_strategy.PySearchStrategy):
    """``warm`` (a configured ``EvolutionarySearch``), with batches drawn by a cheap ``cold``
    search while ``is_cold()`` is true (see the module docstring).

    ``make_cold(population)`` returns the cold search for a population size; it is called in
    :meth:`pre_tuning`, when the batch size is known (``None``: every batch is evolved).
    :attr:`batches` counts the batches each generated (``"cold"``, ``"evolved"``), over this
    strategy and its clones (MetaSchedule gives each task a clone).
    """

    def __init__(
        self,
        warm: Any,
        make_cold: Callable[[int], Any] | None,
        cold_population: int,
        is_cold: Callable[[], bool],
        batches: dict[str, int] | None = None,
    ) -> None:
        super().__init__()
        self.warm = warm
        self.make_cold = make_cold
        self.cold_population = cold_population
        self.is_cold = is_cold
        self.batches = batches if batches is not None else {"cold": 0, "evolved": 0}
        self.cold: Any = None
        self._context: Any = None

    def _searches(self) -> list[Any]:
        return [self.warm] if self.cold is None else [self.warm, self.cold]

    def _initialize_with_tune_context(self, context: Any) -> None:
        self._context = context
        self.warm._initialize_with_tune_context(context)  # noqa: SLF001 - MetaSchedule's hook

    def pre_tuning(
        self, max_trials, num_trials_per_iter, design_spaces, database=None, cost_model=None
    ) -> None:
        if self.make_cold is not None:
            self.cold = self.make_cold(max(self.cold_population, 2 * num_trials_per_iter))
            self.cold._initialize_with_tune_context(self._context)  # noqa: SLF001
        for search in self._searches():
            search.pre_tuning(max_trials, num_trials_per_iter, design_spaces, database, cost_model)

    def post_tuning(self) -> None:
        for search in self._searches():
            search.post_tuning()

    def generate_measure_candidates(self) -> list[Any] | None:
        if self.cold is not None and self.is_cold():
            self.batches["cold"] += 1
            return self.cold.generate_measure_candidates()
        self.batches["evolved"] += 1
        return self.warm.generate_measure_candidates()

    def notify_runner_results(self, measure_candidates, results) -> None:
        for search in self._searches():
            search.notify_runner_results(measure_candidates, results)

    def clone(self) -> Any:
        return ColdStartSearch(
            self.warm.clone(), self.make_cold, self.cold_population, self.is_cold, self.batches
        )
