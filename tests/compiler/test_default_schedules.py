"""Default CPU schedules (:mod:`compiler.default_schedules`): a softmax over rows takes
:class:`RowSoftmax` where its rows have a vector-sized divisor, and computes what numpy does."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from compiler.default_schedules import default_task_module, softmax_lanes
from compiler.lowering import fuse
from compiler.target import resolve_target


def _softmax_task(rows: int, length: int) -> tvm.IRModule:
    """The one fused PrimFunc of ``softmax(x, axis=-1)`` over ``[rows, length]`` float32."""
    x = relax.Var("x", relax.TensorType((rows, length), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(relax.op.nn.softmax(x, axis=-1))
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


@pytest.mark.parametrize(("rows", "length", "rule"), [(96, 1500, True), (96, 197, False)])
def test_row_softmax_schedules_rows_and_matches_numpy(rows: int, length: int, rule: bool) -> None:
    target = resolve_target("cpu").tvm_target()
    scheduled = default_task_module(_softmax_task(rows, length), target)
    assert scheduled is not None
    script = scheduled.script()
    assert ("_rf" in script) == rule  # the rule's rfactor blocks, or DLight's schedule
    library = tvm.compile(scheduled, target=target)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, length)).astype("float32") * 4
    out = tvm.runtime.tensor(np.zeros_like(x), tvm.cpu())
    library.mod["main"](tvm.runtime.tensor(x, tvm.cpu()), out)
    expected = np.exp(x - x.max(axis=-1, keepdims=True))
    expected /= expected.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)
