"""The search's default population is one number wherever a job is started: the CLI's
``--population`` default, the service's ``TUNEHUB_SEARCH_POPULATION`` and ``SearchConfig``'s
(128: the evidence is in ``tuner/engine/search.py``'s ``SearchConfig`` docstring); another
population keeps the other defaults."""

from __future__ import annotations

from service.cli.tune_commands import DEFAULT_POPULATION
from service.settings import Settings
from tuner.engine.search import SearchConfig


def test_one_default_population_everywhere(monkeypatch) -> None:
    monkeypatch.delenv("TUNEHUB_SEARCH_POPULATION", raising=False)
    assert DEFAULT_POPULATION == SearchConfig.population_size == Settings().search_population == 128
    assert SearchConfig.of_population(DEFAULT_POPULATION) == SearchConfig()


def test_another_population_keeps_the_other_defaults() -> None:
    small = SearchConfig.of_population(16)
    assert (small.population_size, small.init_min_unmeasured) == (16, 8)
    assert small.genetic_num_iters == SearchConfig().genetic_num_iters
    assert small.cold_population == SearchConfig().cold_population
    large = SearchConfig.of_population(512)
    assert (large.population_size, large.init_min_unmeasured) == (512, 50)
    search = large.evolutionary()
    assert search.population_size == 512
