"""An embedding table on a weight format's grid, gathered from its codes (issue 32's memory).

A decoder compiled with ``--weights q8_0`` (``q4_0``) has its embedding table on the format's
grid too (:mod:`compiler.weights.weight_formats`: each run of 32 along a row is ``q * s``). The
GEMMs hold their weights in the format (:mod:`compiler.peers.held_weights`), but a gather reads its
table row by row and has no library peer, so the table stayed float32: 262 MB of TinyLlama-1.1B's,
545 MB of Qwen2.5-0.5B's.

:func:`gather_from_codes` rewrites each ``take`` along axis 0 of a constant 2-D float32 table
whose rows lie on the grid into a gather of its int8 codes ``[V, H / 32, 32]`` and float16 scales
``[V, H / 32, 1]``, multiplied in float32 and reshaped to the gather's shape. ``q * s`` (``|q|``
at most 127, ``s`` a float16) is exact in float32, so every row is the same numbers. The table
then takes 1.0625 bytes a value instead of 4 (``q4_0``'s codes are held one a byte too). A table
off the grid, or read by something else too (a head tied to the embedding reads the float32
constant; its GEMM holds its own copy in the format), keeps what it had: only the ``take`` changes.

It runs before fusion (:func:`compiler.lowering.pipeline.for_target`), so tuning and the build see
the same tasks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import ir, relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from compiler.weights.weight_formats import Q8_BLOCK
from compiler.weights.weight_packing import grid_codes


def table_codes(table: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray] | None:
    """``table`` (float32 ``[V, H]``) as ``fmt``'s int8 codes ``[V, H / 32, 32]`` and float16
    scales ``[V, H / 32, 1]`` when every row lies on the grid, else ``None``."""
    if table.dtype != np.float32 or table.ndim != 2 or table.shape[1] % Q8_BLOCK:
        return None
    found = grid_codes(np.ascontiguousarray(table), fmt, 1)
    if found is None:
        return None
    codes, scales = found
    rows, blocks = table.shape[0], table.shape[1] // Q8_BLOCK
    return codes.reshape(rows, blocks, Q8_BLOCK), scales.reshape(rows, blocks, 1)


@mutator
class _GatherFromCodes(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, fmt: str) -> None:
        super().__init__(mod)
        self.fmt = fmt
        self.tables: dict[Any, Any] = {}  # float32 constant -> (codes, scales) constants or None

    def visit_call_(self, op: relax.Call) -> relax.Expr:
        call = super().visit_call_(op)
        if not (isinstance(call, relax.Call) and call.op.same_as(ir.Op.get("relax.take"))):
            return call
        table, indices = call.args[0], call.args[1]
        if not isinstance(table, tvm.ir.expr.GenericConst) or int(call.attrs.axis) != 0:
            return call
        if table not in self.tables:
            found = table_codes(table.value.numpy(), self.fmt)
            self.tables[table] = (
                None if found is None else (relax.const(found[0]), relax.const(found[1]))
            )
        held = self.tables[table]
        if held is None:
            return call
        codes, scales = held
        mode = str(call.attrs.mode)
        rows = relax.op.astype(relax.op.take(codes, indices, axis=0, mode=mode), "float32")
        steps = relax.op.astype(relax.op.take(scales, indices, axis=0, mode=mode), "float32")
        return relax.op.reshape(relax.op.multiply(rows, steps), call.ty.shape)


def gather_from_codes(mod: tvm.IRModule, fmt: str) -> tvm.IRModule:
    """``mod`` with each gather of a constant table on ``fmt``'s grid reading its codes (see
    the module docstring); ``mod`` is not modified."""
    mutator_ = _GatherFromCodes(mod, fmt)
    out = mod.clone()
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function):
            out[gvar] = mutator_.visit_expr(func)
    return out
