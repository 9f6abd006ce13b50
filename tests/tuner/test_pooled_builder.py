"""The tuner's builder keeps its popen workers across batches
(:class:`tuner.measuring.builder_runner.PooledBuilder`)."""

from __future__ import annotations

import os

import psutil
import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms

from tuner.measuring.builder_runner import MeasureConfig, make_builder


def _add_one() -> tvm.IRModule:
    a = te.placeholder((64,), name="a")
    b = te.compute((64,), lambda i: a[i] + 1.0, name="b")
    return tvm.IRModule({"main": te.create_prim_func([a, b])})


def _worker_pids(builder) -> set[int]:
    return {worker._proc.pid for worker in builder._pool._worker_map.values()}  # noqa: SLF001


def test_workers_survive_batches_and_close_ends_them() -> None:
    builder = make_builder(MeasureConfig(builder_workers=1))
    try:
        target = tvm.target.Target("llvm")
        first = builder.build([ms.builder.BuilderInput(_add_one(), target)])
        pids = _worker_pids(builder)
        second = builder.build([ms.builder.BuilderInput(_add_one(), target)] * 2)
        assert [r.error_msg for r in first + second] == [None] * 3
        assert all(os.path.exists(r.artifact_path) for r in first + second)
        # The same worker built both batches: no fresh process (and TVM import) per batch.
        assert len(pids) == 1 and _worker_pids(builder) == pids
    finally:
        builder.close()
    (pid,) = pids
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_one_builder_and_one_runner_worker_per_process() -> None:
    """A search, a re-measure and the next lease ask for a builder and a runner: they get the
    process's own, whose workers already run (no fresh process and TVM import each time). Runners
    with other evaluator settings share the worker of their run timeout, and time as they say."""
    import numpy as np

    from tuner.measuring.builder_runner import make_runner

    config = MeasureConfig(builder_workers=1)
    builder = make_builder(config)
    assert make_builder(config) is builder
    target = tvm.target.Target("llvm")
    (built,) = builder.build([ms.builder.BuilderInput(_add_one(), target)])
    args = ms.arg_info.ArgInfo.from_prim_func(_add_one()["main"])
    one, three = make_runner(config), make_runner(MeasureConfig(repeat=3))
    assert one.pool is three.pool
    pids = {w._proc.pid for w in one.pool._worker_map.values()}  # noqa: SLF001
    timed = []
    for runner in (one, three, make_runner(config)):
        (future,) = runner.run([ms.runner.RunnerInput(built.artifact_path, "cpu", args)])
        result = future.result()
        assert result.error_msg is None
        timed.append(len(result.run_secs))
        assert np.all(np.asarray([float(s) for s in result.run_secs]) > 0)
    assert timed == [5, 3, 5]
    assert {w._proc.pid for w in one.pool._worker_map.values()} == pids  # noqa: SLF001
