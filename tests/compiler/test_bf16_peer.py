"""The CPU shim's bfloat16 GEMM (``compiler/peers/shim_bf16.inc``) as the peer of bfloat16 tasks.

A bfloat16 model's linear layers import as ``matmul`` blocks over casts to float32 with a float32
product, then a cast back (``bf16_f32``); its attention as ``matmul`` blocks in bfloat16 alone
(``bf16``). Both get the shim's bfloat16 GEMM, which accumulates in float32 as torch does, so
each matches numpy's float32 product of the same bfloat16 values within one bfloat16 rounding.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import te

from compiler.peers import find_peer, load_peers, peer_task_module, peer_variants
from compiler.peers.algorithms import ONEDNN_BF16_MIN_ROWS, native_bfloat16
from compiler.peers.library import onednn_available, peer_library
from compiler.target import resolve_target

pytestmark = pytest.mark.skipif(peer_library() is None, reason="no peer library on this machine")
RNG = np.random.default_rng(0)


def _linear(rows: int, k: int, n: int) -> tuple[tvm.IRModule, list[te.Tensor]]:
    """``cast(x @ W -> float32) -> bfloat16`` with ``x [rows, k]``, ``W [k, n]`` bfloat16."""
    x = te.placeholder((rows, k), "bfloat16", name="x")
    w = te.placeholder((k, n), "bfloat16", name="W")
    r = te.reduce_axis((0, k), name="r")
    product = te.compute(
        (rows, n),
        lambda i, j: te.sum(x[i, r].astype("float32") * w[r, j].astype("float32"), axis=r),
        name="matmul",
    )
    out = te.compute((rows, n), lambda i, j: product[i, j].astype("bfloat16"), name="cast")
    return tvm.IRModule({"main": te.create_prim_func([x, w, out])}), [x, w, out]


def _attention(batch: int, rows: int, k: int, n: int, transposed: bool) -> tuple:
    """A batched bfloat16 ``matmul`` with a batched B, ``[batch, n, k]`` when ``transposed``."""
    a = te.placeholder((1, batch, rows, k), "bfloat16", name="A")
    shape = (1, batch, n, k) if transposed else (1, batch, k, n)
    b = te.placeholder(shape, "bfloat16", name="B")
    r = te.reduce_axis((0, k), name="r")
    out = te.compute(
        (1, batch, rows, n),
        lambda z, h, i, j: te.sum(
            a[z, h, i, r] * (b[z, h, j, r] if transposed else b[z, h, r, j]), axis=r
        ),
        name="matmul",
    )
    return tvm.IRModule({"main": te.create_prim_func([a, b, out])}), [a, b, out]


def _run(mod: tvm.IRModule, tensors: list[te.Tensor], call=None) -> list[np.ndarray]:
    target = resolve_target("cpu").tvm_target()
    load_peers()  # the peer calls the shim's symbols: they must be in the process
    peer = peer_task_module(mod, call=call)
    assert peer is not None
    values = [
        RNG.standard_normal([int(d) for d in t.shape]).astype(ml_dtypes.bfloat16)
        for t in tensors[:-1]
    ]
    dev = tvm.cpu()
    out = tvm.runtime.empty([int(d) for d in tensors[-1].shape], "bfloat16", dev)
    tvm.tirx.build(peer, target=target)(*[tvm.runtime.tensor(v, dev) for v in values], out)
    return [*values, out.numpy()]


@pytest.mark.parametrize(
    ("rows", "k", "n"), [(1, 96, 300), (5, 64, 130), (17, 40, 257), (33, 96, 200)]
)
def test_a_bfloat16_linear_layer_takes_the_bf16_gemm_and_matches_numpy(rows, k, n) -> None:
    """Few rows take the shim's kernel; from :data:`ONEDNN_BF16_MIN_ROWS` rows, where the
    library has oneDNN, its bfloat16 matmul is the default and the shim's kernel the other
    variant. Every variant matches numpy."""
    mod, tensors = _linear(rows, k, n)
    onednn = rows >= ONEDNN_BF16_MIN_ROWS and onednn_available() and native_bfloat16()
    assert find_peer(mod).algorithm == ("bf16_f32_onednn" if onednn else "bf16_f32")
    variants = peer_variants(mod)  # the default first
    want = ["bf16_f32_onednn", "bf16_f32"] if onednn else ["bf16_f32"]
    assert [v.algorithm for v in variants] == want
    for call in variants:
        x, w, out = _run(mod, tensors, call)
        want = (x.astype(np.float32) @ w.astype(np.float32)).astype(ml_dtypes.bfloat16)
        # One rounding to bfloat16 of the same float32 sum, up to its order of summation.
        np.testing.assert_allclose(
            out.astype(np.float32), want.astype(np.float32), rtol=2**-7, atol=1e-3
        )


@pytest.mark.parametrize("transposed", [False, True])
def test_bfloat16_attention_takes_the_bf16_gemm_and_matches_numpy(transposed) -> None:
    mod, tensors = _attention(batch=2, rows=7, k=64, n=40, transposed=transposed)
    assert find_peer(mod).algorithm == "bf16"
    a, b, out = _run(mod, tensors)
    right = np.swapaxes(b, -1, -2) if transposed else b
    want = a.astype(np.float32) @ right.astype(np.float32)
    np.testing.assert_allclose(out.astype(np.float32), want, rtol=2**-7, atol=1e-2)
