"""A decoder's logits cut to the last position (:mod:`compiler.llm.last_logits`): the head matmul
reads one row where it is a position-wise matmul over a constant weight, and any other output is
sliced after it; both give the last position of what the function computed before."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from compiler.errors import ModelError
from compiler.llm.last_logits import last_position_logits

TOKENS, HIDDEN, VOCABULARY = 5, 8, 12
RNG = np.random.default_rng(0)
WEIGHT = RNG.standard_normal((HIDDEN, VOCABULARY)).astype("float32")


def _decoder(flat_head: bool, constant_weight: bool = True) -> relax.Function:
    """``logits = head(x * 2)`` on ``x`` ``[1, TOKENS, HIDDEN]``: over ``[TOKENS, HIDDEN]`` rows
    reshaped back (``flat_head``, as ``nn.Linear`` imports) or on the 3-D tensor; the weight a
    constant or a parameter."""
    x = relax.Var("x", relax.TensorType([1, TOKENS, HIDDEN], "float32"))
    params = [x]
    weight: relax.Expr = relax.const(WEIGHT)
    if not constant_weight:
        weight = relax.Var("w", relax.TensorType([HIDDEN, VOCABULARY], "float32"))
        params.append(weight)
    builder = relax.BlockBuilder()
    with builder.function("main", params):
        with builder.dataflow():
            scaled = builder.emit(relax.op.multiply(x, relax.const(2.0, "float32")))
            if flat_head:
                rows = builder.emit(relax.op.reshape(scaled, [TOKENS, HIDDEN]))
                product = builder.emit(relax.op.matmul(rows, weight))
                logits = builder.emit(relax.op.reshape(product, [1, TOKENS, VOCABULARY]))
            else:
                logits = builder.emit(relax.op.matmul(scaled, weight))
            out = builder.emit_output(relax.Tuple([logits]))
        builder.emit_func_output(out)
    return builder.get()["main"]


def _run(func: relax.Function, *arrays: np.ndarray) -> np.ndarray:
    executable = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](*(tvm.runtime.tensor(a) for a in arrays))[0].numpy()


def _head_rows(func: relax.Function) -> list[int]:
    """The row count of every matmul in ``func`` that produces logits."""
    return [
        int(np.prod([int(v) for v in binding.value.ty.shape.values][:-1]))
        for block in func.body.blocks
        for binding in block.bindings
        if isinstance(binding.value, relax.Call)
        and getattr(binding.value.op, "name", "") == "relax.matmul"
    ]


@pytest.mark.parametrize("flat_head", [True, False])
def test_a_head_over_a_constant_weight_reads_one_row(flat_head: bool) -> None:
    func = _decoder(flat_head)
    x = RNG.standard_normal((1, TOKENS, HIDDEN)).astype("float32")
    cut, hoisted = last_position_logits(func)
    assert hoisted and _head_rows(cut) == [1]
    got = _run(cut, x)
    assert got.shape == (1, 1, VOCABULARY)
    np.testing.assert_allclose(got, _run(func, x)[:, -1:], rtol=1e-5, atol=1e-5)


def test_any_other_output_is_sliced_after_it() -> None:
    func = _decoder(flat_head=True, constant_weight=False)
    x = RNG.standard_normal((1, TOKENS, HIDDEN)).astype("float32")
    cut, hoisted = last_position_logits(func)
    assert not hoisted and _head_rows(cut) == [TOKENS]
    got = _run(cut, x, WEIGHT)
    np.testing.assert_allclose(got, _run(func, x, WEIGHT)[:, -1:], rtol=1e-5, atol=1e-5)


def _head_only(shape: list[int]) -> relax.Function:
    """``(x @ WEIGHT,)`` on ``x`` of ``shape``."""
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            product = builder.emit(relax.op.matmul(x, relax.const(WEIGHT)))
            out = builder.emit_output(relax.Tuple([product]))
        builder.emit_func_output(out)
    return builder.get()["main"]


def test_one_position_is_left_as_it_is() -> None:
    func = _head_only([1, 1, HIDDEN])
    assert last_position_logits(func)[0].same_as(func)


def test_an_output_that_is_not_logits_is_refused() -> None:
    with pytest.raises(ModelError, match="static \\[batch, tokens, vocabulary\\]"):
        last_position_logits(_head_only([TOKENS, HIDDEN]))
