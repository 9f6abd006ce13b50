"""``compiler.lowering.relax_rewrite.rewrite_call``: TVM's rewrite, with large constants stood in
for."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst
from tvm.relax import dpl

from compiler.lowering.relax_rewrite import HIDDEN_BYTES, is_constant, rewrite_call


def _layers(count: int, size: int) -> relax.Function:
    """``count`` times ``h = h @ W_i; h = h + h ** 2``, each ``W_i`` a constant."""
    rng = np.random.default_rng(0)
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, size], "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            h = x
            for _ in range(count):
                weight = relax.const(rng.random((size, size), dtype=np.float32))
                h = builder.emit(relax.op.matmul(h, weight))
                h = builder.emit(relax.op.add(h, relax.op.power(h, relax.const(2.0, "float32"))))
            out = builder.emit_output(h)
        builder.emit_func_output(out)
    return builder.get()["main"]


def _constants(func: relax.Function) -> list[GenericConst]:
    found: list[GenericConst] = []
    relax.analysis.post_order_visit(
        func.body, lambda e: found.append(e) if isinstance(e, GenericConst) else None
    )
    return found


def test_the_rewrite_is_tvms_with_the_same_constant_objects() -> None:
    size = 128  # 64 KiB weights: at the threshold, stood in for
    assert size * size * 4 >= HIDDEN_BYTES
    func = _layers(3, size)
    base = dpl.wildcard()
    pattern = dpl.is_op("relax.power")(base, dpl.is_const())
    seen: list[bool] = []

    def square(expr: relax.Expr, matches: dict) -> relax.Expr:
        return relax.op.multiply(matches[base], matches[base])

    def weights_are_constants(expr: relax.Expr, matches: dict) -> relax.Expr:
        seen.append(is_constant(matches[weight]) and not isinstance(matches[weight], GenericConst))
        return expr

    ours = rewrite_call(pattern, square, func)
    tvm.ir.assert_structural_equal(ours, dpl.rewrite_call(pattern, square, func))
    assert not any(c.op.name == "relax.power" for c in _calls(ours))
    before = {c.value.data_ptr() for c in _constants(func) if c.value.shape}
    after = {c.value.data_ptr() for c in _constants(ours) if c.value.shape}
    assert after == before and len(after) == 3  # the same weights, not copies
    assert len(ours.params) == 1

    weight = dpl.wildcard()
    same = rewrite_call(
        dpl.is_op("relax.matmul")(dpl.wildcard(), weight), weights_are_constants, func
    )
    tvm.ir.assert_structural_equal(same, func)  # nothing rewritten
    assert seen == [True] * 3  # the rewriter saw stand-ins, which count as constants


def _calls(func: relax.Function) -> list[relax.Call]:
    found: list[relax.Call] = []
    relax.analysis.post_order_visit(
        func.body,
        lambda e: (
            found.append(e) if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None
        ),
    )
    return found
