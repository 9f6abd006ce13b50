"""CUDA default schedules for decode steps (no GPU needed: lowering and scheduling only).

- :mod:`compiler.lowering.gpu_gemv`: a matmul of a few rows by a constant weight is legalized over
  the weight transposed to ``[N, K]``, so DLight's GEMV rule (inner reduction only on CUDA)
  schedules it; a matmul of many rows keeps TVM's legalization (and the ``matmul`` name library
  peers anchor on).
- :mod:`compiler.lowering.gpu_split_reduction`: a decode attention's probabilities × values (few
  rows, a long reduction) is split across threads; a prefill-sized one is left to the matmul rule.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, te
from tvm.s_tir import dlight as dl

from compiler.lowering.gpu_split_reduction import SplitReduction
from compiler.lowering.pipeline import fuse
from compiler.target import GpuInfo, cuda_target

H200 = GpuInfo("NVIDIA H200", "9.0", 132, 49152, 1024, 32, 150_754_820_096)


def _linear_module(rows: int, k: int = 256, n: int = 128) -> tuple[tvm.IRModule, np.ndarray]:
    weight = np.random.default_rng(0).standard_normal((k, n)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([rows, k], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, relax.const(weight)))
        bb.emit_func_output(out)
    return bb.get(), weight


def _primfuncs(mod: tvm.IRModule) -> dict[str, tvm.tirx.PrimFunc]:
    return {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}


def test_a_decode_matmul_reads_its_weight_row_by_row_and_gets_the_gemv_rule() -> None:
    target = cuda_target(H200).tvm_target()
    mod, weight = _linear_module(1)
    funcs = _primfuncs(fuse(mod, target))
    assert list(funcs) == ["matmul_nt"]
    with target:
        assert dl.gpu.GEMV().apply(funcs["matmul_nt"], target, False) is not None
    # The weight constant passed to it is the transposed original, [N, K].
    consts = []
    relax.analysis.post_order_visit(
        fuse(mod, target)["main"].body,
        lambda e: (
            consts.append(e.value.numpy())
            if hasattr(e, "value") and e.value is not None and hasattr(e.value, "numpy")
            else None
        ),
    )
    assert any(c.shape == weight.T.shape and np.array_equal(c, weight.T) for c in consts)


@pytest.mark.parametrize("rows", [8, 64])
def test_a_matmul_of_several_rows_keeps_tvms_legalization(rows) -> None:
    target = cuda_target(H200).tvm_target()
    funcs = _primfuncs(fuse(_linear_module(rows)[0], target))
    assert list(funcs) == ["matmul"]
    # CPU targets never take the GEMV legalization.
    cpu = tvm.target.Target("llvm")
    assert list(_primfuncs(fuse(_linear_module(1)[0], cpu))) == ["matmul"]


def _probabilities_times_values(rows: int, cache: int = 1152, heads: int = 2, dim: int = 64):
    p = te.placeholder((1, heads, rows, cache), "float16", name="P")
    v = te.placeholder((1, heads, cache, dim), "float16", name="V")
    k = te.reduce_axis((0, cache), name="k")
    out = te.compute(
        (1, heads, rows, dim),
        lambda b, h, i, d: te.sum(p[b, h, i, k] * v[b, h, k, d], axis=k),
        name="matmul",
    )
    return te.create_prim_func([p, v, out])


def test_decode_attention_is_split_across_threads_and_builds() -> None:
    target = cuda_target(H200).tvm_target()
    with target:
        sch = SplitReduction().apply(_probabilities_times_values(7), target, False)
        assert sch is not None
        bound = {
            str(sch.get(loop).thread_binding.thread_tag)
            for loop in sch.get_loops(sch.get_sblock("matmul"))
            if sch.get(loop).thread_binding is not None
        }
        assert bound == {"blockIdx.x", "threadIdx.x", "threadIdx.y"}
        tvm.compile(sch.mod, target=target)  # lowers, with the cross-thread reduction


def test_prefill_attention_and_short_reductions_are_left_to_the_matmul_rule() -> None:
    target = cuda_target(H200).tvm_target()
    with target:
        assert SplitReduction().apply(_probabilities_times_values(128), target, False) is None
        short = _probabilities_times_values(7, cache=128)
        assert SplitReduction().apply(short, target, False) is None
