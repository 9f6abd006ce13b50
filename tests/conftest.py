"""Shared fixtures (example models exported once per test session, at run time; two tuning
databases written once per session, ``tuned_small_cnn`` and ``tuned_mlp``, that tests copy) and
the marks.

Marks (registered in ``pyproject.toml``): ``slow``, ``browser`` and ``gpu`` are written on the
tests; ``postgres`` is added here to every test that gets a PostgreSQL database (the
``postgresql`` case of ``tests/db``'s ``backend`` fixture, or a ``postgres_url`` fixture), and
``slow`` to the modules listed in :data:`SLOW_MODULES`. Under ``CI=true`` a skipped ``postgres``
test fails: CI runs ``scripts/run-tests.sh``, which starts PostgreSQL, so a skip there means those
tests did not run.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# Every job's final build re-measures its tasks' top records (tuner/remeasure.py; defaults top 3,
# 5 rounds, ~0.2 s a candidate a round). Tests tune a few trials: two candidates, two rounds are
# enough to exercise it everywhere (servers and CLI children started by tests inherit these).
os.environ.setdefault("TUNEHUB_REMEASURE_TOP", "2")
os.environ.setdefault("TUNEHUB_REMEASURE_ROUNDS", "2")

#: Test modules that tune whole models end to end through a server (marked ``slow`` as a whole).
SLOW_MODULES = frozenset({"tests/service/test_api_e2e.py", "tests/service/test_workers_remote.py"})


def _uses_postgres(item: pytest.Item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return params.get("backend") == "postgresql" or "postgres_url" in getattr(
        item, "fixturenames", ()
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _uses_postgres(item):
            item.add_marker(pytest.mark.postgres)
        if item.path.relative_to(config.rootpath).as_posix() in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("CI") == "true" and item.get_closest_marker("postgres"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (
            f"PostgreSQL test skipped under CI=true: {reason}\n"
            "CI must run the PostgreSQL tests: run them through scripts/run-tests.sh, which starts "
            "a server and sets TUNEHUB_TEST_POSTGRES_URL."
        )


@pytest.fixture(scope="session")
def example_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """``example_model(name, fmt)`` → path of the example network exported as ``onnx``/``pt2``."""
    from examples.export import export_onnx, export_pt2

    folder = tmp_path_factory.mktemp("examples")
    cache: dict[tuple[str, str], Path] = {}

    def get(name: str, fmt: str) -> Path:
        if (name, fmt) not in cache:
            path = folder / f"{name}.{fmt}"
            cache[(name, fmt)] = (
                export_onnx(name, path) if fmt == "onnx" else export_pt2(name, path)
            )
        return cache[(name, fmt)]

    return get


@dataclass(frozen=True)
class TunedDatabase:
    """A SQLite tuning database written once per session by a real tuning run, closed after it.

    Tests never open :attr:`path` itself: each takes its own :meth:`copy` (``shutil.copy`` of the
    file), so what one test writes never reaches another.
    """

    path: Path
    model: Path  # the model file that was tuned
    artifact_dir: Path
    summary: Any  # tuner.job.TuneSummary of the run

    def copy(self, dest: Path) -> str:
        """Copy the database to the file ``dest``; returns the copy's SQLite URL."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.path, dest)
        return f"sqlite:///{dest}"


def _tune_once(folder: Path, model: Path, **kwargs: Any) -> TunedDatabase:
    import db
    from compiler.prepare import prepare_model
    from compiler.target import cpu_target
    from tuner.job import tune_model

    path = folder / "tuned.db"
    storage = db.open_storage(f"sqlite:///{path}", upgrade=True)
    try:
        prepared = prepare_model(model, cpu_target())
        summary = tune_model(storage, prepared, output_dir=folder / "artifact", **kwargs)
    finally:
        storage.close()
    return TunedDatabase(path, model, folder / "artifact", summary)


@pytest.fixture(scope="session")
def tuned_small_cnn(tmp_path_factory, example_model) -> TunedDatabase:
    """The small CNN (ONNX) tuned once, cold, 24 trials (one batch for each of its 6 tasks),
    sibling seeds off: the database of tests/tuner/test_one_engine.py,
    tests/tuner/test_sibling_seeds.py and tests/cost_model/test_transfer.py."""
    from tuner.search import FAST_SEARCH

    return _tune_once(
        tmp_path_factory.mktemp("tuned-small-cnn"), example_model("small_cnn", "onnx"),
        trials=24, seed=0, cost_model="cold",
        search=dataclasses.replace(FAST_SEARCH, sibling_seeds=False, sibling_population=False),
    )


@pytest.fixture(scope="session")
def tuned_mlp(tmp_path_factory, example_model) -> TunedDatabase:
    """The MLP (ONNX) tuned once, 12 trials with FAST_SEARCH, seed 3 (each of its 3 tasks gets
    at least two valid records): the first run of tests/tuner/test_tune_job.py's reuse and
    continue tests and tests/tuner/test_skip_stored.py, and what tests/tuner/test_remeasure.py
    checks."""
    from tuner.search import FAST_SEARCH

    return _tune_once(
        tmp_path_factory.mktemp("tuned-mlp"), example_model("mlp", "onnx"),
        trials=12, search=FAST_SEARCH, seed=3,
    )
