"""Reading TVM 0.27's TIR for the peer matchers: a fused task's top-level stages and buffers,
the buffer loads of an expression, the parts of a ``C += A * B`` reduction block, and the linear
coefficients of an index."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tvm import ir, s_tir, tirx
from tvm.sym.pattern import detect_linear_equation

# TVM 0.27's TIR nodes: a load is ``ir.TensorLoad`` (its buffer is ``.source``), buffers and
# loop variables are ``ir.Var``, block regions ``ir.TensorRegion``.
_Load = ir.TensorLoad


@dataclass(frozen=True)
class _Stage:
    """One top-level loop nest of a fused PrimFunc and the block at its bottom."""

    stmt: Any
    block: Any


def _stages(func: tirx.PrimFunc) -> tuple[Any, list[_Stage]] | None:
    root = func.body.block if isinstance(func.body, s_tir.SBlockRealize) else None
    if root is None:
        return None
    body = root.body
    stmts = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
    stages = []
    for stmt in stmts:
        node = stmt
        while isinstance(node, tirx.For):
            node = node.body
        if not isinstance(node, s_tir.SBlockRealize):
            return None
        stages.append(_Stage(stmt, node.block))
    return root, stages


def buffer_loads(expr: Any) -> list[Any]:
    """The buffer loads in ``expr`` (arithmetic, casts, calls, selects), outermost first."""
    if isinstance(expr, _Load):
        return [expr]
    out: list[Any] = []
    for name in ("a", "b", "value", "condition", "true_value", "false_value"):
        child = getattr(expr, name, None) if hasattr(type(expr), name) else None
        if child is not None:
            out += buffer_loads(child)
    if isinstance(expr, ir.Call):
        for arg in expr.args:
            out += buffer_loads(arg)
    return out


def _is_vars(indices: Any, variables: list[Any]) -> bool:
    return len(indices) == len(variables) and all(
        isinstance(i, ir.Var) and i.same_as(v) for i, v in zip(indices, variables)
    )


def _reduction_parts(block: Any) -> tuple[Any, Any, Any, list[Any], list[Any]] | None:
    """``(C store, A load, B load, spatial vars, reduce vars)`` of ``C += A * B``."""
    store = block.body
    if block.init is None or not isinstance(store, tirx.BufferStore):
        return None
    value = store.value
    if not (
        isinstance(value, ir.prim.expr.Add)
        and isinstance(value.a, _Load)
        and value.a.source.same_as(store.buffer)
        and isinstance(value.b, ir.prim.expr.Mul)
    ):
        return None
    a, b = _uncast(value.b.a), _uncast(value.b.b)
    if not (isinstance(a, _Load) and isinstance(b, _Load)):
        return None
    spatial = [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    reduce = [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if len(spatial) + len(reduce) != len(block.iter_vars):
        return None
    if not _is_vars(store.indices, spatial):
        return None
    return store, a, b, spatial, reduce


def _uncast(expr: Any) -> Any:
    """``x`` of ``T.Cast(dtype, x)`` (how an fp16 product accumulates in fp32), else ``expr``."""
    return expr.value if isinstance(expr, ir.prim.expr.Cast) else expr


def _float32(*buffers: Any) -> bool:
    return all(str(b.dtype) == "float32" for b in buffers)


def _coefficients(expr: Any, variables: list[Any]) -> list[int] | None:
    coeffs = detect_linear_equation(expr, variables)
    if len(coeffs) != len(variables) + 1:
        return None
    try:
        return [int(c) for c in coeffs]
    except (TypeError, ValueError):
        return None


def _buffers_by_name(func: tirx.PrimFunc, root: Any) -> dict[str, Any]:
    out = {str(p.name): p for p in func.params}
    for buf in root.alloc_buffers:
        out[str(buf.name)] = buf
    return out
