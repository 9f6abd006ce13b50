"""A tiny, fast MetaSchedule tuning run for the database tests (and the benchmark's traces).

Builds and runs in-process (no popen worker pools: each would import TVM, seconds apiece on a
2-core machine) with a small evolutionary search, so 8 trials take seconds, not a minute.
"""

from __future__ import annotations

import itertools
import logging
import tempfile
import threading

import numpy as np
import tvm
from tvm import te
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

_BUILT: dict[str, object] = {}
_BUILT_LOCK = threading.Lock()
_COUNTER = itertools.count()


def matmul_mod(n: int = 64) -> tvm.IRModule:
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    func = te.create_prim_func([a, b, c]).with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func})


def build(mod, target):
    """MetaSchedule's default build without importing tvm.s_tir.tensor_intrin."""
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock  # noqa: PLC0415

    return tvm.tirx.build(
        RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target
    )


@derived_object
class InProcessBuilder(ms.builder.PyBuilder):
    """Builds in this process; the 'artifact path' is a key into an in-memory table."""

    def build(self, build_inputs):
        results = []
        for item in build_inputs:
            try:
                built = build(item.mod, item.target)
                path = f"inproc-{next(_COUNTER)}"
                with _BUILT_LOCK:
                    _BUILT[path] = built
                results.append(ms.builder.BuilderResult(path, None))
            except Exception as err:  # noqa: BLE001 - failures travel as error_msg
                results.append(ms.builder.BuilderResult(None, f"build failed: {err}"))
        return results


@derived_object
class InProcessRunner(ms.runner.PyRunner):
    """Times each built module on the CPU in this process."""

    def run(self, runner_inputs):
        futures = []
        dev = tvm.cpu()
        for item in runner_inputs:
            try:
                with _BUILT_LOCK:
                    built = _BUILT.pop(item.artifact_path)
                mod = getattr(built, "mod", built)
                args = [
                    tvm.runtime.tensor(
                        np.random.rand(*[int(d) for d in info.shape]).astype(str(info.dtype)), dev
                    )
                    for info in item.args_info
                ]
                timer = mod.time_evaluator(mod.entry_name, dev, number=3, repeat=1)
                futures.append(ms.runner.LocalRunnerFuture(res=list(timer(*args).results)))
            except Exception as err:  # noqa: BLE001
                futures.append(ms.runner.LocalRunnerFuture(error_message=f"run failed: {err}"))
        return futures


def small_search() -> ms.search_strategy.EvolutionarySearch:
    return ms.search_strategy.EvolutionarySearch(
        population_size=32, init_min_unmeasured=8, genetic_num_iters=1
    )


def default_callbacks() -> list:
    """MetaSchedule's default callbacks less RemoveBuildArtifact (nothing on disk to remove)."""
    return [ms.measure_callback.AddToDatabase(), ms.measure_callback.UpdateCostModel()]


def tune_matmul(database, target, *, trials: int = 8, per_iter: int = 4, callbacks=None, seed=0):
    """Tune ``matmul_mod()`` for ``trials`` trials, committing through ``database``.

    ``callbacks`` defaults to :func:`default_callbacks` (the first import of
    ``tvm.s_tir.tensor_intrin`` by TuneContext costs 10-40 s on this machine, once a process).
    """
    # MetaSchedule re-configures logging on each run and crashes (AttributeError in
    # _parameterize_config) if its logger holds a handler without a name, which pytest's
    # LogCaptureHandler is after a first run in the same process.
    ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    for handler in list(ms_logger.handlers):
        if handler.get_name() is None:
            ms_logger.removeHandler(handler)
    with tempfile.TemporaryDirectory() as work_dir:
        ms.tir_integration.tune_tir(
            matmul_mod(),
            target,
            work_dir,
            max_trials_global=trials,
            num_trials_per_iter=per_iter,
            builder=InProcessBuilder(),
            runner=InProcessRunner(),
            database=database,
            cost_model="random",
            strategy=small_search(),
            measure_callbacks=callbacks if callbacks is not None else default_callbacks(),
            num_tuning_cores=1,
            seed=seed,
        )


def args_info_of(mod: tvm.IRModule) -> list:
    return list(ms.arg_info.ArgInfo.from_entry_func(mod))


def split_traces(mod: tvm.IRModule, n: int) -> list:
    """``n`` distinct, valid schedule traces of the matmul (no tuning needed; at most 343)."""
    from tvm import s_tir  # noqa: PLC0415

    traces = []
    sizes = (1, 2, 4, 8, 16, 32, 64)
    factors = [(fi, fj, fk) for fk in sizes for fi in sizes for fj in sizes]
    for fi, fj, fk in factors[:n]:
        sch = s_tir.Schedule(mod)
        block = sch.get_sblock("C")
        i, j, k = sch.get_loops(block)
        sch.split(i, factors=[None, fi])
        sch.split(j, factors=[None, fj])
        if fk != 1:
            sch.split(k, factors=[None, fk])
        traces.append(sch.trace)
    assert len(traces) == n, f"at most {len(factors)} traces"
    return traces


def make_records(workload, target, run_secs: list) -> list:
    """One MetaSchedule TuningRecord per entry of ``run_secs`` (a list of lists or None)."""
    traces = split_traces(workload.mod, len(run_secs))
    args = args_info_of(workload.mod)
    return [
        ms.database.TuningRecord(trace, workload, secs, target, args)
        for trace, secs in zip(traces, run_secs, strict=True)
    ]
