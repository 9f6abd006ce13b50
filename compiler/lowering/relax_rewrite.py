"""TVM's pattern rewrite (``relax.dpl.rewrite_call``) without its cost in a model's weights.

``rewrite_call`` rewrites until the function stops changing, and every rewrite it makes costs
time in proportion to the bytes of the function's constants (measured on TVM 0.27: 40 matches
in a function holding 640 MB of constants took 2.1 s; with those constants stood in for by
parameters, 0.08 s in all, the stand-ins included). A decoder's import runs several rewrites
on each of its token buckets over gigabytes of weights: a 4-layer TinyLlama-shaped decoder
(1.2 GB) spent a quarter of its preparation there, 132 s before and 71 s after.

:func:`rewrite_call` stands each constant of at least :data:`HIDDEN_BYTES` in for by a parameter
of its own while TVM's rewrite runs, then binds the same constants back: the function that comes
back is what TVM's rewrite returns, with the same constant objects. A rewrite whose pattern must
see a large tensor as a constant (``is_const()`` on a convolution's weight, whose values it
folds) passes ``hide_constants=False``; one that only needs to know an operand is a constant
tests it with :func:`is_constant`, which knows the stand-ins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tvm import relax
from tvm.ir.expr import GenericConst
from tvm.relax import dpl

from compiler.weights.external import tensor_nbytes

#: Constants of this many bytes or more are stood in for while a rewrite runs.
HIDDEN_BYTES = 1 << 16

#: The name of every stand-in parameter (never a name a frontend gives).
STAND_IN_NAME = "tunehub_hidden_constant"


def rewrite_call(
    pattern: dpl.DFPattern,
    rewriter: Callable[[relax.Expr, dict], relax.Expr],
    func: relax.Function,
    *,
    hide_constants: bool = True,
) -> relax.Function:
    """``relax.dpl.rewrite_call(pattern, rewriter, func)``, with ``func``'s large constants
    stood in for by parameters while it runs (``hide_constants``; see the module docstring).
    ``rewriter`` then sees a stand-in ``relax.Var`` where a large constant is: it may test for
    one with :func:`is_constant` and must not read its value."""
    if not hide_constants:
        return dpl.rewrite_call(pattern, rewriter, func)
    hider = _StandIns()
    body = hider.visit_expr(func.body)
    if not hider.constants:
        return dpl.rewrite_call(pattern, rewriter, func)
    stand_ins = list(hider.constants)
    hidden = relax.Function([*func.params, *stand_ins], body, func.ret_ty, func.is_pure, func.attrs)
    return dpl.rewrite_call(pattern, rewriter, hidden).bind_params(hider.constants)


def is_constant(expr: relax.Expr) -> bool:
    """Whether ``expr`` is a constant, or the stand-in of one while :func:`rewrite_call` runs."""
    return isinstance(expr, GenericConst) or (
        isinstance(expr, relax.Var) and expr.name == STAND_IN_NAME
    )


@relax.expr_functor.mutator
class _StandIns(relax.PyExprMutator):
    """Replaces each large constant by a parameter (one per constant object), recorded in
    ``constants`` (stand-in → the constant)."""

    def __init__(self) -> None:
        super().__init__()
        self.constants: dict[relax.Var, GenericConst] = {}
        self._by_constant: dict[Any, relax.Var] = {}

    def visit_generic_const_(self, const: GenericConst) -> relax.Expr:  # noqa: N802 - TVM's name
        if tensor_nbytes(const.value) < HIDDEN_BYTES:
            return const
        stand_in = self._by_constant.get(const)
        if stand_in is None:
            stand_in = relax.Var(STAND_IN_NAME, const.ty)
            self._by_constant[const] = stand_in
            self.constants[stand_in] = const
        return stand_in
