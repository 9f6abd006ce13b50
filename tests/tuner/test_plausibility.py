# ruff: noqa: N805, N806, N812 - TVMScript spells buffers and its dialects this way
"""Issue 31 (cases 3 and 4): the one plausibility rule (:mod:`tuner.jobs.plausibility`) and the
bytes a task must write (:mod:`tuner.jobs.workload_bytes`), read off real TIR: a reshape, a matmul,
a function with two outputs, and the cases that must count less (a slice written in place, a
conditional store, a symbolic shape, a diagonal)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import tvm
from tvm import te
from tvm.script import ir as I
from tvm.script import tirx as T

from tuner.jobs import plausibility
from tuner.jobs.plausibility import Limits, TaskBounds, check
from tuner.jobs.workload_bytes import function_output_bytes, output_bytes, workload_output_bytes


def _module(*tensors) -> tvm.IRModule:
    func = te.create_prim_func(list(tensors)).with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func})


def reshape_mod(rows: int = 64, cols: int = 128) -> tvm.IRModule:
    a = te.placeholder((rows, cols), name="A")
    out = te.compute(
        (cols, rows),
        lambda i, j: a[(i * rows + j) // cols, (i * rows + j) % cols],
        name="T_reshape",
    )
    return _module(a, out)


def matmul_mod(m: int = 64, k: int = 32, n: int = 16) -> tvm.IRModule:
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return _module(a, b, c)


def split_mod() -> tvm.IRModule:
    """A tuple output: one float16 input split into two outputs."""
    x = te.placeholder((8, 10), name="X", dtype="float16")
    y1 = te.compute((8, 4), lambda i, j: x[i, j], name="Y1")
    y2 = te.compute((8, 6), lambda i, j: x[i, j + 4], name="Y2")
    return _module(x, y1, y2)


@I.ir_module
class AppendInPlace:
    @T.prim_func(s_tir=True)
    def main(
        cache: T.Buffer((1024, 64), "float32"), new: T.Buffer((4, 64), "float32"), pos: T.int64
    ):
        for i, j in T.grid(4, 64):
            with T.sblock("append"):
                vi, vj = T.axis.remap("SS", [i, j])
                cache[pos + T.int64(vi), vj] = new[vi, vj]


@I.ir_module
class Conditional:
    @T.prim_func(s_tir=True)
    def main(a: T.Buffer((16,), "float32"), b: T.Buffer((16,), "float32")):
        for i in range(16):
            if i < 8:
                b[i] = a[i]


@I.ir_module
class Symbolic:
    @T.prim_func(s_tir=True)
    def main(a: T.handle, b: T.handle):
        n = T.int64()
        A = T.match_buffer(a, (n, 8), "float32")
        B = T.match_buffer(b, (n, 8), "float32")
        for i, j in T.grid(n, 8):
            with T.sblock("copy"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = A[vi, vj]


@I.ir_module
class Diagonal:
    @T.prim_func(s_tir=True)
    def main(a: T.Buffer((32,), "float32"), d: T.Buffer((32, 32), "float32")):
        for i in range(32):
            with T.sblock("diag"):
                vi, vj = T.axis.remap("SS", [i, i])
                d[vi, vj] = a[vi]


# -- the bytes a task must write -------------------------------------------------------------
def test_a_reshape_writes_its_whole_output():
    assert output_bytes(reshape_mod(64, 128)) == 128 * 64 * 4


def test_a_matmul_writes_its_output_not_its_reduction():
    assert output_bytes(matmul_mod(64, 32, 16)) == 64 * 16 * 4


def test_a_tuple_output_counts_every_output():
    assert output_bytes(split_mod()) == (8 * 4 + 8 * 6) * 2


def test_a_reshape_task_as_the_server_stores_it():
    """The reshape task of an ONNX model, through the partition and its stored JSON: 0 FLOPs,
    and its output's bytes."""
    import numpy as np
    import onnx
    from onnx import helper
    from tvm.relax.frontend.onnx import from_onnx

    from compiler.frontends.importer import normalize
    from compiler.partition import partition
    from compiler.target import cpu_target
    from tests.onnx_factory import float_input, make_model

    shape = onnx.numpy_helper.from_array(np.array([128, 64], dtype="int64"), "s")
    model = make_model(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        [float_input("x", [64, 128])],
        [float_input("y", [128, 64])],
        [shape],
    )
    parts = partition(normalize(from_onnx(model, keep_params_in_input=False)), cpu_target(1))
    [task] = parts.tasks
    assert "reshape" in task.name and task.flops == 0.0
    mod_json = tvm.ir.save_json(parts.extracted[0].dispatched[0])
    assert workload_output_bytes(987_001, mod_json) == 128 * 64 * 4


def test_what_is_not_surely_written_counts_less():
    assert output_bytes(AppendInPlace) == 4 * 64 * 4  # the slice, not the 256 KiB cache
    assert output_bytes(Conditional) == 0
    assert output_bytes(Symbolic) == 8 * 4  # a symbolic dimension counts as 1
    assert output_bytes(Diagonal) == 32 * 4  # one loop: 32 elements, not 32 x 32


def test_a_function_that_writes_no_parameter_writes_nothing():
    a = te.placeholder((4,), name="A")
    assert function_output_bytes(te.create_prim_func([a])) == 0
    assert output_bytes(tvm.IRModule({})) == 0


def test_workload_bytes_are_computed_once_and_unreadable_modules_are_unknown(monkeypatch):
    mod_json = tvm.ir.save_json(matmul_mod())
    assert workload_output_bytes(987_002, mod_json) == 64 * 16 * 4
    monkeypatch.setattr(tvm.ir, "load_json", lambda _: pytest.fail("loaded twice"))
    assert workload_output_bytes(987_002, mod_json) == 64 * 16 * 4
    monkeypatch.undo()
    assert workload_output_bytes(987_003, '{"nodes": []}') is None


# -- the rule -------------------------------------------------------------------------------
def test_a_zero_flop_task_is_bounded_by_its_bytes_and_the_call_floor():
    bounds = TaskBounds("cpu", flops=0.0, min_bytes=32768)
    hold = check(1e-300, bounds)
    assert hold is not None and hold.limit == "call"  # 32 KiB at 100e12 B/s: 0.33 ns < 1 ns
    assert "least time of any cpu kernel call" in hold.reason
    assert check(1e-6, bounds) is None


def test_a_memory_bound_task_is_held_by_its_bytes():
    bounds = TaskBounds("cpu", flops=0.0, min_bytes=16 * 2**20)  # 16 MiB of output
    least = 16 * 2**20 / plausibility.PEAK_BYTES_PER_SEC["cpu"]
    hold = check(1e-8, bounds)
    assert hold is not None and hold.limit == "bytes"
    assert hold.least_secs == pytest.approx(least) and "output bytes" in hold.reason
    assert check(least * 1.01, bounds) is None


def test_a_compute_bound_task_is_held_by_its_flops():
    bounds = TaskBounds("cuda", flops=2e12, min_bytes=4096)  # 1 ms at the CUDA ceiling
    hold = check(1e-4, bounds)
    assert hold is not None and hold.limit == "flops" and "FLOP/s" in hold.reason
    assert check(2e-3, bounds) is None


def test_the_binding_limit_is_the_one_that_allows_the_most_time():
    bounds = TaskBounds("cpu", flops=5e9, min_bytes=10**9)  # 0.1 ms compute, 10 us memory
    assert check(1e-12, bounds).limit == "flops"
    assert check(1e-12, TaskBounds("cpu", flops=5e6, min_bytes=10**9)).limit == "bytes"


@pytest.mark.parametrize("secs", [0.0, -1.0, math.nan, math.inf, -math.inf])
def test_what_is_not_a_time_is_held_never_raises(secs):
    hold = check(secs, TaskBounds("cpu"))
    assert hold is not None and hold.limit == "time"


def test_unknown_bounds_leave_the_call_floor():
    assert check(1e-12, TaskBounds("cpu")).limit == "call"
    assert check(2e-9, TaskBounds("cpu", flops=None, min_bytes=None)) is None
    assert check(5e-8, TaskBounds("cuda")).limit == "call"  # a kernel launch takes us


def test_an_unknown_kind_gets_the_most_generous_limits():
    limits = Limits.for_kind("vulkan")
    assert limits.peak_flops == max(plausibility.PEAK_FLOPS.values())
    assert limits.peak_bytes_per_sec == max(plausibility.PEAK_BYTES_PER_SEC.values())
    assert limits.min_call_secs == min(plausibility.MIN_CALL_SECS.values())


def test_the_rule_is_tvm_free():
    """The API process imports the rule (and the manifest's store) without TVM."""
    code = (
        "import sys, tuner.jobs.plausibility, tuner.final_build.remeasure_store; "
        "sys.exit(1 if 'tvm' in sys.modules else 0)"
    )
    repo = Path(__file__).resolve().parents[2]
    assert subprocess.run([sys.executable, "-c", code], cwd=repo, check=False).returncode == 0
