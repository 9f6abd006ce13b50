"""tuner.search_strategy.cold_start: no genetic generations while the cost model warms up."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from tvm import te
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

import db
from compiler.target import cpu_target
from tuner.engine.search import FAST_SEARCH, reset_metaschedule_logging, run_search
from tuner.measuring.builder_runner import MeasureConfig
from tuner.search_strategy.cold_start import warming_up


@derived_object
class ScoresByLength(ms.cost_model.PyCostModel):
    """A cost model that ranks by trace length: deterministic, so the search must evolve by it."""

    def load(self, path: str) -> None:
        pass

    def save(self, path: str) -> None:
        pass

    def update(self, context, candidates, results) -> None:
        pass

    def predict(self, context, candidates) -> np.ndarray:
        return np.asarray([float(len(c.sch.trace.insts)) for c in candidates])


def test_which_models_are_warming_up() -> None:
    from cost_model.booster import BoosterConfig
    from cost_model.transfer import TransferCostModel

    fresh = ms.cost_model.XGBModel(num_warmup_samples=100)
    assert warming_up(fresh)  # below its warm-up it returns uniform random scores
    assert warming_up(TransferCostModel(None, BoosterConfig()))  # nothing learned yet
    assert not warming_up(ms.cost_model.RandomModel())  # never learns: searched as configured
    assert not warming_up(ScoresByLength())  # an unknown model is trusted


def _matmul_task():
    a = te.placeholder((64, 64), name="A")
    b = te.placeholder((64, 64), name="B")
    k = te.reduce_axis((0, 64), name="k")
    c = te.compute((64, 64), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    return ms.ExtractedTask(
        task_name="matmul", mod=mod, target=cpu_target(2).tvm_target(), dispatched=[mod], weight=1
    )


@pytest.mark.parametrize(
    ("cold_population", "model", "expect_cold"),
    [(64, None, True), (0, None, False), (64, ScoresByLength, False)],
    ids=["cold-model", "cold-start-off", "trusted-model"],
)
def test_batches_come_from_the_cheap_search_only_while_the_model_warms_up(
    tmp_path, cold_population, model, expect_cold
) -> None:
    storage = db.open_storage(f"sqlite:///{tmp_path / 'cold.db'}", upgrade=True)
    try:
        database = db.MetaScheduleDatabase(storage, cpu_target(2))
        reset_metaschedule_logging()
        report = run_search(
            [_matmul_task()],
            database=database,
            target_kind="cpu",
            trials=8,
            batch_size=4,
            work_dir=str(tmp_path / "work"),
            measure=MeasureConfig(builder_workers=1),
            search=dataclasses.replace(
                FAST_SEARCH, cold_population=cold_population, sibling_seeds=False
            ),
            cost_model=model() if model else None,
            seed=0,
        )
        records = database.get_all_tuning_records()
    finally:
        storage.close()
    assert len(records) == 8 and all(r.run_secs for r in records)
    batches = report.cold_batches + report.evolved_batches
    assert batches >= 2  # two batches of 4 at least (a batch can come out empty)
    if expect_cold:
        # The fresh XGBoost model holds 8 < 100 samples all along: no batch was evolved.
        assert report.cold_batches == batches and report.evolved_batches == 0
    else:
        assert report.evolved_batches == batches and report.cold_batches == 0
