"""tuner.task_scheduler.sibling_seeds: a task's search starts from its siblings' best schedules,
refitted to its shapes and measured within the trial budget."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import tvm
from tvm.s_tir import meta_schedule as ms

import db
from compiler.lowering.intrinsics import load_tensor_intrinsics
from compiler.prepare import prepare_model
from compiler.target import cpu_target
from compiler.task_family import workload_family
from db.metaschedule_database import MetaScheduleDatabase, record_as_json
from tuner.task_scheduler.sibling_seeds import SeedTask, SiblingSeeds, refit_tiles

REPO = Path(__file__).resolve().parents[2]


def test_refit_tiles_keeps_the_extent_and_the_inner_factors_that_divide() -> None:
    assert refit_tiles(64, [2, 4, 8]) == [2, 4, 8]
    assert refit_tiles(56, [1, 8, 8]) == [1, 7, 8]  # 8 divides 56; then 7 is all that is left
    assert refit_tiles(7, [4, 4]) == [7, 1]
    assert refit_tiles(1, [16, 1, 4]) == [1, 1, 1]
    rng = random.Random(0)
    for _ in range(500):
        extent = rng.randint(1, 4096)
        factors = [rng.choice([1, 2, 3, 4, 8, 16, 32, 64]) for _ in range(rng.randint(1, 5))]
        fitted = refit_tiles(extent, factors)
        product = 1
        for factor in fitted:
            product *= factor
        assert product == extent and len(fitted) == len(factors)
        assert all(f <= max(old, 1) for f, old in zip(fitted[1:], factors[1:]))
    with pytest.raises(ValueError):
        refit_tiles(8, [])
    with pytest.raises(ValueError):
        refit_tiles(0, [2])


@pytest.fixture(scope="module")
def cnn_db(tmp_path_factory, tuned_small_cnn):
    """The small CNN tuned once without seeds (3 ``conv2d + add + relu`` tasks: siblings): this
    module's copy of the session's ``tuned_small_cnn`` (tests/conftest.py)."""
    work = tmp_path_factory.mktemp("seeds")
    storage = db.open_storage(tuned_small_cnn.copy(work / "seeds.db"))
    target = cpu_target()
    prepared = prepare_model(tuned_small_cnn.model, target)
    yield storage, target, prepared, work
    storage.close()


@pytest.mark.slow
def test_a_task_is_offered_each_faster_sibling_record_once(cnn_db) -> None:
    storage, target, prepared, _ = cnn_db
    target_id = storage.get_target(target.key).id
    convs = [
        t for t in prepared.partition.tasks if workload_family(t.name) == "fused_conv2d_add_relu"
    ]
    assert len(convs) == 3
    ids = storage.workload_ids([t.key for t in convs])
    rates = {t.key: t.flops / storage.best_record(ids[t.key], target_id).mean_secs for t in convs}
    convs.sort(key=lambda t: rates[t.key])  # the slowest first: it has faster siblings
    database = MetaScheduleDatabase(storage, target)
    seeds = SiblingSeeds(
        database, [SeedTask(ids[t.key], workload_family(t.name), t.flops) for t in convs]
    )
    load_tensor_intrinsics("cpu")
    task = convs[0]
    mod = tvm.ir.load_json(storage.get_workload(task.key).mod_json)
    context = ms.TuneContext(
        mod=mod, target=target.tvm_target(), space_generator="post-order-apply", task_name=task.name
    )
    faster = [t for t in convs[1:] if rates[t.key] > rates[task.key]]

    offered = []
    while candidates := seeds.candidates(0, context):
        (candidate,) = candidates
        # A schedule of this task's module, postprocessed, with its scheduled function's
        # arguments (a prepacked weight in the tiled layout its RewriteLayout chose).
        scheduled = ms.arg_info.ArgInfo.from_entry_func(candidate.sch.mod, remove_preproc=True)
        assert [str(a.as_json()) for a in candidate.args_info] == [
            str(a.as_json()) for a in scheduled
        ]
        assert len(candidate.args_info) == len(ms.arg_info.ArgInfo.from_entry_func(mod))
        assert "sch.enter_postproc()" in str(candidate.sch.trace)
        offered.append(candidate)
    assert len(offered) == len(faster) - seeds.failed >= 1
    assert seeds.offered == len(offered) and seeds.known == 0
    # A schedule stored since (here as a failed measurement) is not offered by a later run.
    stored = ms.database.TuningRecord(
        offered[0].sch.trace,
        ms.database.Workload(mod),
        None,
        target.tvm_target(),
        offered[0].args_info,
    )
    storage.commit_record(
        db.NewTuningRecord.from_metaschedule_json(ids[task.key], target_id, record_as_json(stored))
    )
    again = SiblingSeeds(database, seeds.tasks)
    while again.candidates(0, context):
        pass
    assert again.offered == seeds.offered - 1 and again.known == seeds.known + 1
    # A task without a FLOP count is never seeded.
    no_flops = SiblingSeeds(database, [SeedTask(ids[task.key], "fused_conv2d_add_relu", None)])
    assert no_flops.candidates(0, context) == []


@pytest.mark.slow
def test_tuning_measures_seeds_within_the_budget(mlp_on_small_cnn, tmp_path) -> None:
    """The MLP's last layer (``matmul + add``) is a sibling of the CNN's classifier: seeded from
    the database. Its two ``matmul + add + relu`` layers seed each other within the run.

    The run: the session's ``mlp_on_small_cnn`` (tests/conftest.py): 16 trials on a copy of the
    CNN's database, siblings' schedules in populations too (the cost model it transferred is
    tests/cost_model/test_transfer.py's business). The CLI turns seeds off: a run on another copy
    of the same CNN database (seeds on offer for the classifier's sibling and within the run),
    in the background meanwhile."""
    summary, budget = mlp_on_small_cnn.summary, 16
    seeded = summary.extra["sibling_seeds"]
    assert seeded["measured"] >= 1 and seeded["valid"] >= 1
    assert seeded["in_populations"] >= 1  # turned on here: siblings' schedules in populations
    storage = db.open_storage(mlp_on_small_cnn.copy(tmp_path / "seeds.db"))
    try:
        job = storage.get_job(summary.job_id)
    finally:
        storage.close()
    # Seeds are trials: the job's measurements stay within the budget plus one batch (4 here).
    assert seeded["measured"] < job.trials_done <= budget + 4
    assert summary.verification["passed"]

    returncode, out, err = mlp_on_small_cnn.observed["no_seeds_cli"]
    assert returncode == 0, err[-3000:]
    summary = json.loads(out)
    assert summary["trials_measured"] > 0 and summary["sibling_seeds"] is None


@pytest.mark.slow
def test_population_gives_siblings_refitted_schedules_through_the_search_database(cnn_db) -> None:
    """The primed view answers ``get_top_k`` with the task's own records plus its siblings' best
    schedules replayed on the task's own module (tiles refitted), unmeasured and never stored."""
    from tuner.database.primed import SiblingPrimedDatabase

    storage, target, prepared, _ = cnn_db
    target_id = storage.get_target(target.key).id
    convs = [
        t for t in prepared.partition.tasks if workload_family(t.name) == "fused_conv2d_add_relu"
    ]
    ids = storage.workload_ids([t.key for t in convs])
    database = MetaScheduleDatabase(storage, target)
    seeds = SiblingSeeds(
        database, [SeedTask(ids[t.key], workload_family(t.name), t.flops) for t in convs]
    )
    view = SiblingPrimedDatabase(database, seeds, share=0.5)
    task = convs[0]
    mod = tvm.ir.load_json(storage.get_workload(task.key).mod_json)
    workload = view.commit_workload(mod)
    records_before = storage.count_records(target_id=target_id)

    own = database.get_top_k(workload, 8)
    answer = view.get_top_k(workload, 8)
    siblings = [r for r in answer if r.run_secs is None]  # unmeasured: the siblings' schedules
    kept = answer[: len(answer) - len(siblings)]
    assert 1 <= len(siblings) <= 4  # half the slots at most
    assert [str(r.trace) for r in kept] == [str(r.trace) for r in own[: len(kept)]]
    assert len(answer) == min(8, len(own) + len(siblings))
    load_tensor_intrinsics("cpu")
    context = ms.TuneContext(
        mod=mod, target=target.tvm_target(), space_generator="post-order-apply", task_name=task.name
    )
    own_traces = {str(r.trace) for r in own}
    for record in siblings:
        assert str(record.trace) not in own_traces
        # What the evolutionary search does with a database record: replay it on the task's
        # module and postprocess it (tile sizes that do not fit the task's loops fail here).
        sch = tvm.s_tir.Schedule(mod)
        record.trace.apply_to_schedule(sch, remove_postproc=True)
        sch.enter_postproc()
        assert all(postproc.apply(sch) for postproc in context.space_generator.postprocs)
    assert seeds.populated == len(siblings)
    assert storage.count_records(target_id=target_id) == records_before  # nothing stored
    # A workload that is not one of the run's tasks gets its own records only.
    assert seeds.population(-1, mod, 4) == []
    with pytest.raises(ValueError):
        SiblingPrimedDatabase(database, seeds, share=1.5)
