"""Shared fixtures (example models exported once per test session, at run time) and the marks.

Marks (registered in ``pyproject.toml``): ``slow``, ``browser`` and ``gpu`` are written on the
tests; ``postgres`` is added here to every test that gets a PostgreSQL database (the
``postgresql`` case of ``tests/db``'s ``backend`` fixture, or a ``postgres_url`` fixture), and
``slow`` to the modules listed in :data:`SLOW_MODULES`. Under ``CI=true`` a skipped ``postgres``
test fails: CI runs ``scripts/run-tests.sh``, which starts PostgreSQL, so a skip there means those
tests did not run.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

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
