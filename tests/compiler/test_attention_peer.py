"""A decoder's attention on the CPU shim (``tunehub_peer_attention``,
:func:`compiler.llm.attention.attention_kernel`): over the cache's filled part only, the same
numbers as softmax over the whole cache, and the matrix-product form where the shim is not
linked (:func:`compiler.llm.attention.expand_attention`)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import tvm
from tvm import relax

from compiler.llm.attention import (
    emit_attention,
    expand_attention,
    is_attention_kernel,
    specialize_attention,
)
from compiler.peers.library import load_peers, peer_library

LOWEST = np.finfo(np.float32).min


def _shim_attention(q, k, v, mask, scale) -> np.ndarray:
    lib = ctypes.CDLL(str(peer_library().shared), mode=ctypes.RTLD_GLOBAL)
    f = lib.tunehub_peer_attention
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    f.argtypes = [ptr] * 5 + [i64] * 9 + [ctypes.c_int32, ctypes.c_float]
    b, h, s, d = q.shape
    kv, c = k.shape[1:3]
    out = np.full_like(q, np.nan)
    kind = 0 if mask is None else (2 if mask.dtype == np.bool_ else 1)
    mb, mh, ms = (1, 1, 1) if mask is None else mask.shape[:3]
    mask_data = None if mask is None else mask.ctypes.data
    status = f(q.ctypes.data, k.ctypes.data, v.ctypes.data, mask_data, out.ctypes.data,
               b, h, s, d, kv, c, mb, mh, ms, kind, scale)  # fmt: skip
    assert status == 0
    return out


def _reference(q, k, v, mask, scale) -> np.ndarray:
    """torch's ``scaled_dot_product_attention`` after ``repeat_kv``, in float64."""
    rep = q.shape[1] // k.shape[1]
    keys = np.repeat(k, rep, axis=1).astype(np.float64)
    values = np.repeat(v, rep, axis=1).astype(np.float64)
    scores = np.einsum("bhsd,bhcd->bhsc", q.astype(np.float64), keys) * scale
    if mask is not None:
        scores = np.where(mask, scores, -np.inf) if mask.dtype == np.bool_ else scores + mask
    scores -= scores.max(-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhsc,bhcd->bhsd", weights, values)


def _case(batch, heads, kv, tokens, cache, dim, position, kind, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, heads, tokens, dim)).astype(np.float32)
    k = rng.standard_normal((batch, kv, cache, dim)).astype(np.float32)
    v = rng.standard_normal((batch, kv, cache, dim)).astype(np.float32)
    seen = np.arange(cache)[None, :] <= position + np.arange(tokens)[:, None]  # causal, filled
    mask = {
        "none": None,
        "bool": seen[None, None].copy(),
        "float": np.where(seen, 0.0, LOWEST).astype(np.float32)[None, None],
    }[kind]
    return q, k, v, mask


@pytest.mark.parametrize(
    "batch,heads,kv,tokens,cache,dim,position",
    [
        (1, 14, 2, 40, 96, 16, 0),  # a prefill chunk at the start of the cache
        (1, 14, 2, 1, 96, 16, 57),  # a decode step
        (2, 8, 4, 5, 64, 32, 30),  # a batch, mid-cache
        (1, 4, 4, 3, 40, 8, 37),  # no grouping, the cache full
    ],
)
@pytest.mark.parametrize("kind", ["float", "bool", "none"])
def test_the_shim_attends_over_the_filled_keys_as_over_all(
    batch, heads, kv, tokens, cache, dim, position, kind
) -> None:
    q, k, v, mask = _case(batch, heads, kv, tokens, cache, dim, position, kind)
    want = _reference(q, k, v, mask, dim**-0.5)
    assert np.abs(_shim_attention(q, k, v, mask, dim**-0.5) - want).max() < 2e-6
    if mask is not None:  # what lies past the filled part is never read
        hidden = np.arange(cache) > position + tokens - 1
        k[:, :, hidden], v[:, :, hidden] = np.nan, np.nan
        assert np.abs(_shim_attention(q, k, v, mask, dim**-0.5) - want).max() < 2e-6


def test_a_row_that_hides_every_key_reads_them_all_as_torch_does() -> None:
    q, k, v, mask = _case(1, 4, 2, 3, 24, 8, 0, "float")
    mask[0, 0, 1] = LOWEST  # softmax over equal scores: the mean of every value
    got = _shim_attention(q, k, v, mask, 0.5)
    assert np.abs(got - _reference(q, k, v, mask, 0.5)).max() < 2e-6


def _module(tokens: int, mask_dtype: str) -> tvm.IRModule:
    q = relax.Var("q", relax.TensorType([1, 4, tokens, 8], "float32"))
    k = relax.Var("k", relax.TensorType([1, 2, 24, 8], "float32"))
    v = relax.Var("v", relax.TensorType([1, 2, 24, 8], "float32"))
    mask = relax.Var("mask", relax.TensorType([1, 1, tokens, 24], mask_dtype))
    builder = relax.BlockBuilder()
    with builder.function("main", [q, k, v, mask]):
        with builder.dataflow():
            out = builder.emit_output(emit_attention(builder, q, k, v, mask, 8**-0.5))
        builder.emit_func_output(out)
    return builder.get()


@pytest.mark.parametrize("mask_dtype", ["float32", "bool"])
def test_the_kernel_and_its_expansion_compute_the_same_attention(mask_dtype) -> None:
    """Built for the shim (sizes specialized) and expanded into matrix products (a build
    without the shim): the same numbers, torch's, and the expansion calls no kernel."""
    load_peers()
    tokens = 5
    q, k, v, mask = _case(1, 4, 2, tokens, 24, 8, 10, "bool" if mask_dtype == "bool" else "float")
    mod = _module(tokens, mask_dtype)
    shim = specialize_attention(mod)
    expanded = expand_attention(mod)
    assert any(is_attention_kernel(f) for f in shim.functions.values())
    assert not any(is_attention_kernel(f) for f in expanded.functions.values())
    want = _reference(q, k, v, mask, 8**-0.5)
    for built in (shim, expanded):
        executable = tvm.compile(built, target="llvm")
        vm = relax.VirtualMachine(executable, tvm.cpu())
        got = vm["main"](*(tvm.runtime.tensor(a) for a in (q, k, v, mask))).numpy()
        assert np.abs(got - want).max() < 2e-6
