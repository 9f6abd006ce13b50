"""Grouped-query attention's two forms (:mod:`compiler.llm.attention`): a prefill chunk's scores
are ``q k^T`` (:func:`prefill_scores`), a decode step's ``(k q^T)^T``; both give the attention
the converter emits."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from compiler.llm.attention import PREFILL_SCORES_MIN_ROWS, grouped_attention, prefill_scores

HEADS, KV, CACHE, DIM = 4, 2, 24, 8


def _attention(tokens: int) -> relax.Function:
    q = relax.Var("q", relax.TensorType([1, HEADS, tokens, DIM], "float32"))
    k = relax.Var("k", relax.TensorType([1, KV, CACHE, DIM], "float32"))
    v = relax.Var("v", relax.TensorType([1, KV, CACHE, DIM], "float32"))
    mask = relax.Var("mask", relax.TensorType([1, 1, tokens, CACHE], "bool"))
    builder = relax.BlockBuilder()
    with builder.function("main", [q, k, v, mask]):
        with builder.dataflow():
            out = grouped_attention(builder, q, k, v, mask, DIM**-0.5, HEADS // KV)
            result = builder.emit_output(out)
        builder.emit_func_output(result)
    return builder.get()["main"]


def _ops(func: relax.Function) -> list[str]:
    return [
        binding.value.op.name
        for block in func.body.blocks
        for binding in block.bindings
        if isinstance(binding.value, relax.Call) and hasattr(binding.value.op, "name")
    ]


def _run(func: relax.Function, tokens: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    arrays = [
        rng.standard_normal((1, HEADS, tokens, DIM)).astype("float32"),
        rng.standard_normal((1, KV, CACHE, DIM)).astype("float32"),
        rng.standard_normal((1, KV, CACHE, DIM)).astype("float32"),
        np.tril(np.ones((tokens, CACHE), bool), k=CACHE - tokens)[None, None],
    ]
    executable = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](*(tvm.runtime.tensor(a) for a in arrays)).numpy()


@pytest.mark.parametrize("tokens", [1, PREFILL_SCORES_MIN_ROWS // (HEADS // KV)])
def test_a_long_chunk_multiplies_q_by_k_transposed_and_agrees(tokens: int) -> None:
    emitted = _attention(tokens)
    rewritten = prefill_scores(emitted)
    # The converter's form: matmul(k, q^T), then the scores transposed back.
    assert _ops(emitted)[:4] == [
        "relax.reshape",
        "relax.permute_dims",
        "relax.matmul",
        "relax.permute_dims",
    ]
    prefill = tokens * (HEADS // KV) >= PREFILL_SCORES_MIN_ROWS
    if prefill:  # q k^T: the copy is of k (the transpose feeds the matmul, none follows it)
        ops = _ops(rewritten)
        first = ops.index("relax.matmul")
        assert ops[first - 1] == "relax.permute_dims" and ops[first + 1] == "relax.reshape"
    else:
        assert rewritten.same_as(emitted) or _ops(rewritten) == _ops(emitted)
    np.testing.assert_allclose(_run(rewritten, tokens), _run(emitted, tokens), rtol=1e-5, atol=1e-5)
