"""Decode-sized matmuls on CUDA read their weights row by row: ``x[M, K] · W[N, K]ᵀ``.

A ``torch.export`` linear layer arrives as ``matmul(x, permute_dims(W))`` and constant folding
stores the weight transposed, ``[K, N]``. For a decode step of one sequence (``M`` = 1 row,
:data:`MAX_GEMV_ROWS`) the matmul is a GEMV: its time is the weight's bytes read once, and a
GEMV over a ``[K, N]`` weight reduces along the strided axis. DLight's CUDA GEMV rule schedules
only the inner-reduction form (its outer-reduction schedules are for OpenCL and Metal), so those
matmuls fell to the generic reduction rule: 22 µs for a 8.7 MB down projection on the H200, about
0.4 TB/s (``bench/results/gpu_llm_2026-12-04.md``).

:func:`legalize_matmul` legalizes such a matmul (a 2-D input of at most :data:`MAX_GEMV_ROWS` rows
times a 2-D constant) as ``x · Wᵀ`` over the constant transposed once at build time (``[N, K]``,
as torch stored it), so the GEMV rule applies. Every other matmul keeps TVM's legalization (the
block name ``matmul`` that library peers anchor on included). The cost: a weight used by both a
decode-sized and a larger matmul (a decoder's decode and prefill buckets) is stored twice.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te
from tvm.ir.expr import GenericConst

#: The most rows (tokens times batch) a matmul may have to be legalized as a GEMV: one. With 2 to
#: 8 rows DLight's matmul rule claims the product either way (its GEMV rule wants one row, and
#: its low-batch GEMV rule a symbolic batch); a layout for those is not measured yet.
MAX_GEMV_ROWS = 1


def _static_dims(expr: relax.Expr) -> list[int] | None:
    """``expr``'s tensor shape when every dimension is a constant, else ``None``."""
    shape = getattr(expr.ty, "shape", None)
    if shape is None:
        return None
    dims = []
    for dim in shape:
        if not isinstance(dim, tvm.tirx.IntImm):
            return None
        dims.append(int(dim))
    return dims


def is_decode_gemv(call: relax.Call) -> bool:
    """Whether ``call`` (a ``relax.matmul``) is ``x[M, K] · C[K, N]`` with ``C`` a constant and
    ``M`` static and at most :data:`MAX_GEMV_ROWS`."""
    x, weight = call.args
    if not isinstance(weight, GenericConst) or len(weight.value.shape) != 2:
        return False
    dims = _static_dims(x)
    return dims is not None and len(dims) == 2 and dims[0] <= MAX_GEMV_ROWS


def legalize_matmul(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``relax.matmul``'s legalization for CUDA: a decode GEMV (:func:`is_decode_gemv`) as
    ``x · Wᵀ`` over ``W`` = the constant transposed (a PrimFunc named ``matmul_nt``, the
    accumulation in the call's ``out_dtype``); anything else as TVM legalizes it."""
    if not is_decode_gemv(call):
        return tvm.ir.Op.get("relax.matmul").get_attr("FLegalize")(bb, call)
    x, weight = call.args
    rows = np.ascontiguousarray(weight.value.numpy().T)
    out_dtype = str(call.attrs.out_dtype) if call.attrs.out_dtype is not None else ""
    if out_dtype in ("", "void", "None"):  # not set: the input's dtype, as TVM's legalization
        out_dtype = str(x.ty.dtype)

    def nt(a: te.Tensor, w: te.Tensor) -> te.Tensor:
        k = te.reduce_axis((0, a.shape[1]), name="k")
        return te.compute(
            (a.shape[0], w.shape[0]),
            lambda i, j: te.sum(a[i, k].astype(out_dtype) * w[j, k].astype(out_dtype), axis=k),
            name="matmul_nt",
        )

    return bb.call_te(nt, x, relax.const(rows), primfunc_name_hint="matmul_nt")
