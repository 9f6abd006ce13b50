"""Vectorizable approximations of float32 transcendental ops, a lowering step.

TVM lowers ``erf``, ``exp`` and ``tanh`` on CPU to scalar libm calls (``erff`` and friends, one
call an element, seen in the generated assembly), which no schedule can vectorize: BERT's GELU
task stayed at 27 ns an element after 2,000 trials, half the model's estimated latency
(``bench/results/models_2026-11-30.md``). TVM's ``topi.fast_*`` kernels are polynomial
approximations built from multiplies and adds, which vectorize (ONNX Runtime's CPU kernels compute
``Erf`` and the exponentials of ``Softmax`` with vectorized polynomials too).

``fast_math`` promises a module in which every float32
- ``relax.nn.gelu`` / ``relax.nn.gelu_tanh`` is first written out with ``erf`` / ``tanh`` (the
  formulas TVM legalizes them to, which call the exact functions directly),
- ``relax.erf``, ``relax.exp``, ``relax.tanh`` and ``relax.nn.softmax`` is a ``call_tir`` of
  ``topi.fast_erf`` / ``fast_exp`` / ``fast_tanh`` / ``nn.fast_softmax``
(the ops TVM's own ``relax.transform.FastMathTransform`` rewrites, whatever their dtype; here
only float32, the dtype TVM's approximations are written for),
- ``relax.sigmoid`` and ``relax.nn.silu`` (the gate of Llama-style MLPs) is a ``call_tir`` of
  :func:`fast_sigmoid` / :func:`fast_silu`: ``1 / (1 + fast_exp(-x))`` (times ``x``).
  ``FastMathTransform`` leaves them exact, and TVM legalizes ``sigmoid`` to a scalar ``expf``
  call an element: a 32M-parameter Llama's SiLU task took 1.2 ms for 512x1408 elements (~10
  cycles an element), 6 % of its prefill at 512 tokens
  (``bench/results/decoder_2026-12-02_s512.md``' database). Other dtypes are left exact. The
approximation errors are within the verification tolerances (tests compare against the exact
functions); task keys change, so these tasks are tuned anew. ``mod`` itself is not modified.

The lowering applies it after the convolution layout
(:func:`compiler.lowering.pipeline.for_target`): a ``call_tir`` is opaque to ``ConvertLayout``, so
applied before it, a sigmoid after an NHWC convolution kept a transpose between them and ran as a
task of its own.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax, te, topi
from tvm.relax import Call, Expr, PyExprMutator, expr_functor
from tvm.relax.dpl import is_op, wildcard

from compiler.lowering.relax_rewrite import rewrite_call


def fast_sigmoid(x: te.Tensor) -> te.Tensor:
    """``1 / (1 + exp(-x))`` with ``topi.fast_exp`` (which clamps its argument to float32's
    range, so neither tail overflows)."""
    denominator = topi.add(topi.fast_exp(topi.negative(x)), tvm.tirx.const(1.0, x.dtype))
    return topi.divide(tvm.tirx.const(1.0, x.dtype), denominator)


def fast_silu(x: te.Tensor) -> te.Tensor:
    """``x * sigmoid(x)`` with :func:`fast_sigmoid`."""
    return topi.multiply(x, fast_sigmoid(x))


_FAST_TE = {
    "relax.erf": topi.fast_erf,
    "relax.exp": topi.fast_exp,
    "relax.tanh": topi.fast_tanh,
    "relax.sigmoid": fast_sigmoid,
    "relax.nn.silu": fast_silu,
}


def _is_float32(expr: Expr) -> bool:
    tensor_type = getattr(expr, "ty", None)
    return isinstance(tensor_type, relax.TensorType) and str(tensor_type.dtype) == "float32"


def _scalar(value: float) -> Expr:
    return relax.const(value, "float32")


def _decompose_gelu(func: relax.Function) -> relax.Function:
    data = wildcard()
    pattern = is_op("relax.nn.gelu")(data) | is_op("relax.nn.gelu_tanh")(data)

    def rewrite(expr: Call, matches: dict) -> Expr:
        x = matches[data]
        if not _is_float32(x):
            return expr
        if expr.op.name == "relax.nn.gelu":
            erf = relax.op.erf(relax.op.multiply(x, _scalar(math.sqrt(0.5))))
            return relax.op.multiply(
                x, relax.op.add(_scalar(0.5), relax.op.multiply(erf, _scalar(0.5)))
            )
        cube = relax.op.multiply(_scalar(0.044715), relax.op.multiply(x, x))
        inner = relax.op.multiply(
            relax.op.multiply(_scalar(math.sqrt(2.0 / math.pi)), x),
            relax.op.add(_scalar(1.0), cube),
        )
        return relax.op.multiply(
            relax.op.multiply(_scalar(0.5), x), relax.op.add(_scalar(1.0), relax.op.tanh(inner))
        )

    return rewrite_call(pattern, rewrite, func)


@expr_functor.mutator
class _FastMathRewriter(PyExprMutator):
    """``FastMathTransform``'s rewrite, restricted to float32 operands."""

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        op = getattr(call.op, "name", None)
        if op is None or not call.args or not _is_float32(call.args[0]):
            return call
        if op in _FAST_TE:
            return self.builder_.call_te(_FAST_TE[op], call.args[0])
        if op == "relax.nn.softmax":
            return self.builder_.call_te(topi.nn.fast_softmax, call.args[0], int(call.attrs.axis))
        return call


def fast_math(mod: tvm.IRModule) -> tvm.IRModule:
    """Rewrite ``mod``'s float32 transcendental ops as described in the module docstring; ``mod``
    itself is left unchanged."""
    mod = mod.clone()
    for gvar, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            mod[gvar] = _decompose_gelu(func)
    rewriter = _FastMathRewriter(mod)
    for gvar, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
    return rewriter.builder_.get()
