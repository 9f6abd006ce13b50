"""Default CPU schedules (:mod:`compiler.lowering.default_schedules`): a softmax over long rows
takes :class:`RowSoftmax` where their length has a vector-sized divisor (short rows keep DLight's
rule, faster there), and computes what numpy does, NaN guard included."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from compiler.lowering.default_schedules import default_task_module, softmax_lanes
from compiler.lowering.pipeline import fuse
from compiler.target import resolve_target


def _softmax_task(rows: int, length: int, nan_guard: bool = False) -> tvm.IRModule:
    """The one fused PrimFunc of ``softmax(x, axis=-1)`` over ``[rows, length]`` float32; with
    ``nan_guard``, followed by ``where(isnan(s), 0, s)`` (an exported attention's)."""
    x = relax.Var("x", relax.TensorType((rows, length), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            s = builder.emit(relax.op.nn.softmax(x, axis=-1))
            if nan_guard:
                zero = relax.const(0.0, "float32")
                s = builder.emit(relax.op.where(relax.op.isnan(s), zero, s))
            out = builder.emit_output(s)
        builder.emit_func_output(out)
    target = resolve_target("cpu").tvm_target()
    fused = fuse(builder.get(), target)
    funcs = [(g, f) for g, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(funcs) == 1
    return tvm.IRModule({"main": funcs[0][1].with_attr("global_symbol", "main")})


def test_softmax_lanes_divide_the_row() -> None:
    assert softmax_lanes(1500) == 12
    assert softmax_lanes(128) == 16
    assert softmax_lanes(197) is None  # a ViT's sequence: no vector-sized divisor


@pytest.mark.parametrize(
    ("rows", "length", "nan_guard", "rule"),
    [
        (96, 1500, False, True),
        (64, 1024, True, True),
        (96, 128, True, False),
        (96, 197, False, False),
    ],
)
def test_row_softmax_schedules_rows_and_matches_numpy(
    rows: int, length: int, nan_guard: bool, rule: bool
) -> None:
    target = resolve_target("cpu").tvm_target()
    scheduled = default_task_module(_softmax_task(rows, length, nan_guard), target)
    assert scheduled is not None
    script = scheduled.script()
    assert ("_rf" in script) == rule  # the rule's rfactor blocks, or DLight's schedule
    library = tvm.compile(scheduled, target=target)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, length)).astype("float32") * 4
    out = tvm.runtime.tensor(np.zeros_like(x), tvm.cpu())
    guard = scheduled["main"].params[1:-1]  # the NaN guard's 0.0, a 0-d parameter
    zeros = [tvm.runtime.tensor(np.zeros((), "float32")) for _ in guard]
    library.mod["main"](tvm.runtime.tensor(x, tvm.cpu()), *zeros, out)
    expected = np.exp(x - x.max(axis=-1, keepdims=True))
    expected /= expected.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_a_bfloat16_attention_matmul_gets_a_cpu_schedule_that_builds_and_computes() -> None:
    """A bfloat16 batched matmul (a bfloat16 decoder's attention) once broke the CPU build:
    TVM 0.27's bfloat16 legalization kept the vectorized reduction's ``bfloat16x8`` store into
    the ``uint16`` storage it made ("dtype mismatch on BufferStore"). It stays scalar now."""
    import ml_dtypes  # noqa: PLC0415 - numpy's bfloat16, a TVM dependency

    p = relax.Var("p", relax.TensorType((1, 2, 4, 32), "bfloat16"))
    v = relax.Var("v", relax.TensorType((1, 2, 32, 64), "bfloat16"))
    builder = relax.BlockBuilder()
    with builder.function("main", [p, v]):
        with builder.dataflow():
            out = builder.emit_output(relax.op.matmul(p, v))
        builder.emit_func_output(out)
    target = resolve_target("cpu").tvm_target()
    fused = fuse(builder.get(), target)
    (func,) = [f for _, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    scheduled = default_task_module(
        tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target
    )
    assert scheduled is not None
    lib = tvm.compile(scheduled, target=target)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, 2, 4, 32)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((1, 2, 32, 64)).astype(ml_dtypes.bfloat16)
    dev = tvm.cpu()
    c = tvm.runtime.empty((1, 2, 4, 64), "bfloat16", dev)
    lib["main"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), c)
    want = a.astype(np.float32) @ b.astype(np.float32)
    # Accumulated in bfloat16 (TVM's legalization): 32 terms, each rounding at 2**-9.
    np.testing.assert_allclose(c.numpy().astype(np.float32), want, rtol=5e-2, atol=0.25)
