"""The epilogue a CPU peer call does as it stores its output (the shim's ``Epilogue``): the run
of per-channel bias add, residual add and clamps right after the anchor, read from the task's
blocks (:func:`_fuse_epilogue`); the rest of the epilogue stays TIR."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from tvm import ir, tirx

from compiler.peers.calls import PeerCall
from compiler.peers.patterns import _is_vars, _Load, _Stage

#: Whether CPU peer calls do the epilogue steps the shim has (:func:`_fuse_epilogue`); off only
#: to build calls for a shim older than its epilogue (``bench.bench_conv_peers``' baseline).
FUSE_EPILOGUE = True


def _epilogue_step(
    value: Any, current: str, variables: list[Any], shape: list[int], params: dict[str, Any]
) -> tuple[str, Any] | None:
    """What one epilogue block's value does to ``current`` (the buffer so far, read at the
    block's own indices), if the shim's epilogue can do it: ``("bias", name)`` (a float32
    parameter indexed by the last axis, its other axes of extent 1), ``("residual", name)`` (a
    float32 parameter of the output's shape, read at the same indices), ``("max", c)`` or
    ``("min", c)`` with a float32 constant; else ``None``."""

    def is_current(expr: Any) -> bool:
        return (
            isinstance(expr, _Load)
            and str(expr.source.name) == current
            and _is_vars(expr.indices, variables)
        )

    if isinstance(value, (ir.prim.expr.Max, ir.prim.expr.Min)):
        const = value.b if is_current(value.a) else value.a if is_current(value.b) else None
        if isinstance(const, ir.prim.expr.FloatImm) and str(const.ty) == "float32":
            return ("max" if isinstance(value, ir.prim.expr.Max) else "min"), float(const.value)
        return None
    if not isinstance(value, ir.prim.expr.Add):
        return None
    other = value.b if is_current(value.a) else value.a if is_current(value.b) else None
    if not isinstance(other, _Load) or str(other.source.name) not in params:
        return None
    buffer = params[str(other.source.name)]
    dims = [int(d) for d in buffer.shape]
    if str(buffer.dtype) != "float32":
        return None
    if dims == shape and _is_vars(other.indices, variables):
        return "residual", str(buffer.name)
    indices = list(other.indices)  # its axes but the last have extent 1: their indices are 0
    if (
        indices
        and dims
        and dims[-1] == shape[-1]
        and all(d == 1 for d in dims[:-1])
        and isinstance(indices[-1], ir.Var)
        and indices[-1].same_as(variables[-1])
    ):
        return "bias", str(buffer.name)
    return None


def _fuse_epilogue(
    call: PeerCall, anchor: int, stages: list[_Stage], func: tirx.PrimFunc
) -> tuple[PeerCall, int]:
    """``call`` extended by the longest run of epilogue blocks right after ``anchor`` that the
    shim's epilogue does (at most one bias add and one residual add, then clamps; see
    :func:`_epilogue_step`), and the index of the last stage the call then computes. A run is
    cut before a block that does something else, and shortened so that no buffer the call no
    longer writes is read by the blocks left after it."""
    params = {str(p.name): p for p in func.params}  # a PrimFunc's parameters are its buffers
    out = stages[anchor].block.body.buffer
    shape = [int(d) for d in out.shape]
    current, bias, residual = call.output, "", ""
    lo, hi = -math.inf, math.inf
    runs: list[tuple[int, str, str, str, float, float]] = []
    for index in range(anchor + 1, len(stages)):
        block = stages[index].block
        store = block.body
        variables = [iv.var for iv in block.iter_vars]
        if not (
            isinstance(store, tirx.BufferStore)
            and _is_vars(store.indices, variables)
            and [int(d) for d in store.buffer.shape] == shape
            and str(store.buffer.dtype) == "float32"
        ):
            break
        step = _epilogue_step(store.value, current, variables, shape, params)
        clamped = (lo, hi) != (-math.inf, math.inf)
        if step is None:
            break
        kind, what = step
        if kind == "bias" and not bias and not clamped:
            bias = what
        elif kind == "residual" and not residual and not clamped:
            residual = what
        elif kind == "max" and max(lo, what) <= hi:
            lo = max(lo, what)
        elif kind == "min" and lo <= min(hi, what):
            hi = min(hi, what)
        else:
            break
        current = str(store.buffer.name)
        runs.append((index, current, bias, residual, lo, hi))
    while runs:  # the buffers before the run's last must not be read after it
        index, current, bias, residual, lo, hi = runs[-1]
        skipped = {call.output} | {r[1] for r in runs[:-1]}
        later = {str(region.source.name) for s in stages[index + 1 :] for region in s.block.reads}
        if not skipped & later:
            clamp = None if (lo, hi) == (-math.inf, math.inf) else (lo, hi)
            return replace(call, output=current, bias=bias, residual=residual, clamp=clamp), index
        runs.pop()
    return call, anchor
