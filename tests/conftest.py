"""Shared fixtures (example models exported once per test session, at run time; tuning databases
written once per session, ``tuned_small_cnn``, ``tuned_mlp`` and ``continued_mlp`` (a continued
run on a copy of ``tuned_mlp``), that tests copy) and the marks.

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

# Every job's final build re-measures its tasks' top records (tuner/final_build/remeasure.py;
# defaults top 3, 5 rounds, ~0.2 s a candidate a round). Tests tune a few trials: two candidates,
# one round is enough to exercise it everywhere (servers and CLI children started by tests inherit
# these; tests/tuner/test_remeasure.py sets its own rounds).
os.environ.setdefault("TUNEHUB_REMEASURE_TOP", "2")
os.environ.setdefault("TUNEHUB_REMEASURE_ROUNDS", "1")
# The final build's whole-model comparison with the zero-trial build
# (tuner/final_build/final_choice.py): two rounds exercise it (the rule's own test sets its
# timings).
os.environ.setdefault("TUNEHUB_FINAL_COMPARE_ROUNDS", "2")

#: Test modules that tune whole models end to end through a server (marked ``slow`` as a whole).
SLOW_MODULES = frozenset({"tests/service/test_api_e2e.py", "tests/service/test_workers_remote.py"})


def _uses_postgres(item: pytest.Item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return params.get("backend") == "postgresql" or "postgres_url" in getattr(
        item, "fixturenames", ()
    )


#: The session's tuning databases, by fixture, and the xdist group of the tests that use each:
#: a session fixture is made once per xdist worker, so the tests that share one run on one
#: worker (``--dist loadgroup`` in scripts/run-tests.sh) and it is tuned once, not on each.
SHARED_DATABASES = {
    "tuned_small_cnn": "tuned_small_cnn",
    "tuned_mlp": "tuned_mlp",
    "continued_mlp": "tuned_mlp",  # a continued run on a copy of tuned_mlp
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _uses_postgres(item):
            item.add_marker(pytest.mark.postgres)
        if item.path.relative_to(config.rootpath).as_posix() in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        groups = {SHARED_DATABASES[f] for f in item.fixturenames if f in SHARED_DATABASES}
        if len(groups) == 1:
            item.add_marker(pytest.mark.xdist_group(groups.pop()))


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
    file), so what one test writes never reaches another. ``observed``: what the fixture watched
    during the run (see each fixture).
    """

    path: Path
    model: Path  # the model file that was tuned
    artifact_dir: Path
    summary: Any  # tuner.jobs.job.TuneSummary of the run
    observed: dict[str, Any] = dataclasses.field(default_factory=dict)

    def copy(self, dest: Path) -> str:
        """Copy the database to the file ``dest``; returns the copy's SQLite URL."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.path, dest)
        return f"sqlite:///{dest}"


def _tune_once(
    folder: Path,
    model: Path,
    *,
    start_from: Path | None = None,
    listeners: Callable[[Any], list[Any]] = lambda storage: [],
    before: Callable[[Any, dict[str, Any]], None] | None = None,
    **kwargs: Any,
) -> TunedDatabase:
    """Tune ``model`` into ``folder/tuned.db`` (a copy of ``start_from`` if given);
    ``listeners(storage)``: progress listeners of the run; ``before(storage, observed)`` runs
    before it."""
    import db
    from compiler.prepare import prepare_model
    from compiler.target import cpu_target
    from tuner.jobs.job import tune_model

    path = folder / "tuned.db"
    if start_from is not None:
        shutil.copy(start_from, path)
    storage = db.open_storage(f"sqlite:///{path}", upgrade=True)
    try:
        observed: dict[str, Any] = {"records_before": storage.count_records()}
        if before is not None:
            before(storage, observed)
        prepared = prepare_model(model, cpu_target())
        summary = tune_model(
            storage,
            prepared,
            output_dir=folder / "artifact",
            listeners=listeners(storage),
            **kwargs,
        )
    finally:
        storage.close()
    return TunedDatabase(path, model, folder / "artifact", summary, observed)


def _counting_runner(sent: list[int]) -> Callable[[Any], Any]:
    """A runner wrapper for ``tuner.engine.search.make_runner``: delegates to the real runner and
    notes the size of every batch sent to it in ``sent``."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    @derived_object
    class CountingRunner(ms.runner.PyRunner):
        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner

        def run(self, runner_inputs):
            sent.append(len(runner_inputs))
            return self.inner.run(runner_inputs)

    return CountingRunner


@pytest.fixture(scope="session")
def tuned_small_cnn(tmp_path_factory, example_model) -> TunedDatabase:
    """The small CNN (ONNX) tuned once, cold, 24 trials (one batch for each of its 6 tasks),
    sibling seeds off: the database of tests/tuner/test_one_engine.py,
    tests/tuner/test_sibling_seeds.py and tests/cost_model/test_transfer.py."""
    from tuner.engine.search import FAST_SEARCH

    return _tune_once(
        tmp_path_factory.mktemp("tuned-small-cnn"),
        example_model("small_cnn", "onnx"),
        trials=24,
        seed=0,
        cost_model="cold",
        search=dataclasses.replace(FAST_SEARCH, sibling_seeds=False, sibling_population=False),
    )


@pytest.fixture(scope="session")
def tuned_mlp(tmp_path_factory, example_model) -> TunedDatabase:
    """The MLP (ONNX) tuned once, 16 trials with FAST_SEARCH, seed 3 (each of its 3 tasks gets
    at least two valid records; four batches of 4 or more: a round, then more): the first run of
    tests/tuner/test_tune_job.py's reuse test and of ``continued_mlp``, and what
    tests/tuner/test_remeasure.py and tests/tuner/test_scheduler.py check.

    ``observed["sent"]``: the size of every batch sent to the runner (the real runner, wrapped);
    ``observed["seen"]``: at each progress update, ``(batches sent so far, the run's total trials,
    records in the database)``: what tests/tuner/test_scheduler.py checks.
    """
    import tuner.engine.search
    from tuner.engine.search import FAST_SEARCH

    sent: list[int] = []
    seen: list[tuple[int, int, int]] = []

    class Watch:
        def __init__(self, storage) -> None:
            self.storage = storage

        def on_batch(self, update) -> None:
            seen.append((len(sent), update.total_trials, self.storage.count_records()))

    make_runner = tuner.engine.search.make_runner
    counting = _counting_runner(sent)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            tuner.engine.search,
            "make_runner",
            lambda measure, rpc=None: counting(make_runner(measure, rpc)),
        )
        tuned = _tune_once(
            tmp_path_factory.mktemp("tuned-mlp"),
            example_model("mlp", "onnx"),
            listeners=lambda storage: [Watch(storage)],
            trials=16,
            search=FAST_SEARCH,
            seed=3,
        )
    tuned.observed.update(sent=sent, seen=seen)
    return tuned


@pytest.fixture(scope="session")
def continued_mlp(tmp_path_factory, tuned_mlp) -> TunedDatabase:
    """``tuned_mlp`` continued (``continue_tuning``) on a copy of its database: 12 more trials,
    the first run's seed again (its random samples come again), cold cost model, no sibling
    seeds (checked against the database separately). Checked by
    tests/tuner/test_skip_stored.py and tests/tuner/test_tune_job.py's continue test;
    ``observed["records_before"]``: the records of the copy before the run."""
    from tuner.engine.search import FAST_SEARCH

    return _tune_once(
        tmp_path_factory.mktemp("continued-mlp"),
        tuned_mlp.model,
        start_from=tuned_mlp.path,
        trials=12,
        seed=3,
        cost_model="cold",
        continue_tuning=True,
        search=dataclasses.replace(FAST_SEARCH, sibling_seeds=False, sibling_population=False),
    )


@pytest.fixture(scope="session")
def mlp_on_small_cnn(tmp_path_factory, tuned_small_cnn, example_model) -> TunedDatabase:
    """The MLP (ONNX) tuned 16 trials, seed 0, on a copy of ``tuned_small_cnn``'s database, with
    the cost model trained from that database (20 rounds, saved there first) transferred
    (``cost_model="transfer"``) and FAST_SEARCH with ``sibling_population`` on: the MLP's last
    layer (``matmul + add``) is a sibling of the CNN's classifier, so it is seeded from the
    database, and its two ``matmul + add + relu`` layers seed each other within the run. What
    tests/cost_model/test_transfer.py (the transferred model) and
    tests/tuner/test_sibling_seeds.py (seeds within the budget) check.

    Meanwhile, in the background, ``tunehub tune --continue --no-sibling-seeds`` (8 trials, cold)
    of the MLP on another copy of the same CNN database: ``observed["no_seeds_cli"]`` is its
    ``(returncode, stdout, stderr)``. ``observed["model_id"]``: the saved cost model's id.
    """
    import os
    import signal
    import subprocess
    import sys

    from cost_model.booster import BoosterConfig
    from cost_model.dataset import extend_training_set
    from cost_model.store import save_model, train
    from tuner.engine.search import FAST_SEARCH

    folder = tmp_path_factory.mktemp("mlp-on-small-cnn")
    mlp = example_model("mlp", "onnx")

    def train_and_save(storage, observed) -> None:
        from compiler.target import cpu_target

        target = cpu_target()
        model = train(
            extend_training_set(storage, storage.get_target(target.key)), BoosterConfig(rounds=20)
        )
        observed["model_id"] = save_model(storage, target, model)

    off = folder / "off"
    off_db = tuned_small_cnn.copy(off / "seeds.db")
    with open(off / "out", "wb") as out, open(off / "err", "wb") as err:
        cli = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "service.cli",
                "tune",
                str(mlp),
                "--trials",
                "8",
                "--population",
                "16",
                "--continue",
                "--no-sibling-seeds",
                "--cost-model",
                "cold",
                "--db",
                off_db,
                "-o",
                str(off / "mlp"),
                "--json",
            ],
            cwd=Path(__file__).resolve().parents[1],
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    try:
        tuned = _tune_once(
            folder,
            mlp,
            start_from=tuned_small_cnn.path,
            before=train_and_save,
            trials=16,
            seed=0,
            cost_model="transfer",
            search=dataclasses.replace(FAST_SEARCH, sibling_population=True),
        )
        cli.wait(timeout=600)
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
            cli.wait()
    tuned.observed["no_seeds_cli"] = (
        cli.returncode,
        (off / "out").read_text(),
        (off / "err").read_text(),
    )
    return tuned
