"""Constant folding that also gets through the operators TVM's ``FoldConstant`` stops at.

``relax.transform.FoldConstant`` evaluates an operator on constant operands by legalizing it to
one ``call_tir`` and running that. Two operators do not get through:

- ``relax.cumsum`` has no legalization of its own (``DispatchSortScan`` lowers it, later);
- ``relax.index_tensor``'s legalization reads its indices through ``TupleGetItem`` bindings,
  which are not constants, so the ``call_tir`` it yields is never evaluated.

Both are how attention masks and position tables are built (a running sum over positions,
positions gathered by index); whatever is computed from them stayed in the model too, as small
tasks recomputing a constant on every call. (A ``.pt2`` program's values that depend on no
placeholder at all, ``arange`` and the masks built from it, are computed by torch at translation:
:func:`compiler.frontends.pt2_ops.translate`; this module catches what depends on constants: a
buffer, an ONNX initializer.) :func:`fold_constants` runs ``FoldConstant``, evaluates those two
operators with numpy where all their operands are constants (numpy's ``cumsum`` and integer-array
indexing compute exactly what the ops define), and runs ``FoldConstant`` again, until a round
evaluates nothing. A module without such calls comes back as ``FoldConstant`` alone leaves it.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst


def _constant_value(expr: relax.Expr) -> np.ndarray | None:
    return expr.value.numpy() if isinstance(expr, GenericConst) else None


@relax.expr_functor.mutator
class _EvaluateConstantCalls(relax.PyExprMutator):
    """Replace ``cumsum`` / ``index_tensor`` calls on constants by their value."""

    def __init__(self, mod: tvm.IRModule | None = None) -> None:
        super().__init__(mod)
        self.evaluated = 0

    def _constant(self, expr: relax.Expr) -> np.ndarray | None:
        if isinstance(expr, relax.Var):
            bound = self.lookup_binding(expr)
            expr = bound if bound is not None else expr
        return _constant_value(expr)

    def _evaluate(self, call: relax.Call) -> np.ndarray | None:
        name = call.op.name
        if name == "relax.cumsum":
            data = self._constant(call.args[0])
            if data is None or bool(call.attrs.exclusive):
                return None
            axis = None if call.attrs.axis is None else int(call.attrs.axis)
            dtype = str(call.ty.dtype)
            return np.cumsum(data if axis is not None else data.reshape(-1), axis=axis, dtype=dtype)
        if name == "relax.index_tensor":
            data = self._constant(call.args[0])
            indices = call.args[1]
            if isinstance(indices, relax.Var):
                indices = self.lookup_binding(indices)
            if data is None or not isinstance(indices, relax.Tuple):
                return None
            values = [self._constant(field) for field in indices.fields]
            if any(value is None for value in values):
                return None
            return data[tuple(values)]
        return None

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - TVM visitor name
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op):
            return call
        try:
            value = self._evaluate(call)
        except (IndexError, ValueError, TypeError):  # out-of-range indices...: left to TVM
            return call
        if value is None:
            return call
        self.evaluated += 1
        value = np.ascontiguousarray(value.astype(str(call.ty.dtype)))
        return relax.const(value, str(call.ty.dtype))


def fold_constants(mod: tvm.IRModule, max_rounds: int = 8) -> tvm.IRModule:
    """``FoldConstant``, plus constant ``cumsum`` / ``index_tensor`` calls, repeated while a round
    evaluates any (at most ``max_rounds``; see the module docstring). ``mod`` is not modified."""
    mod = relax.transform.FoldConstant()(mod)
    for _ in range(max_rounds):
        evaluator = _EvaluateConstantCalls(mod)
        for gvar, func in list(mod.functions_items()):
            if isinstance(func, relax.Function):
                evaluator.builder_.update_func(gvar, evaluator.visit_expr(func))
        if not evaluator.evaluated:
            break
        mod = relax.transform.FoldConstant()(evaluator.builder_.get())
    return mod
