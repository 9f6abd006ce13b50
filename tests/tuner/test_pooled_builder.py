"""The tuner's builder keeps its popen workers across batches (tuner/measure.PooledBuilder)."""

from __future__ import annotations

import os

import psutil
import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms

from tuner.measure import MeasureConfig, make_builder


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
