"""Put imported Relax modules in one canonical form, whatever the frontend.

The ONNX and ``torch.export`` importers describe the same network differently: ONNX convs often
carry a bias (``conv2d`` → ``add``) before batch-norm, which ``FoldBatchnormToConv2D`` does not
match, and the two frontends put a constant operand of ``add``/``multiply`` on different sides.
Tuning tasks are keyed by structural hash, so such differences would split one workload in two.

``canonicalize`` promises:
- every inference ``batch_norm`` that follows a ``conv2d`` with constant weights (optionally
  through a constant bias ``add``) is folded into the weights: ``add(conv2d(x, W'), b')`` with
  ``b'`` shaped ``[1, C, 1, 1]`` — the same form for both frontends; in a half-precision program
  (a float32 convolution cast back to float16, :func:`compiler.frontends.pt2_ops.in_torch_dtype`) it
  is ``add(astype(conv2d(x, W'), float16), b')``;
- ``minimum(maximum(x, lo), hi)`` with scalar constants (ONNX ``Clip``) is ``clip(x, lo, hi)``
  (what ``torch.export`` gives for ReLU6 / hardtanh);
- a ``matmul`` of an input of rank > 2 by a constant 2-D weight (an ONNX ``MatMul`` on
  ``[batch, seq, hidden]``), with an optional bias ``add``, runs on the flattened 2-D input and
  is reshaped back afterwards, as ``torch.export`` lowers ``nn.Linear``;
- commutative binary ops with exactly one constant operand have it second;
- ``power(x, c)`` with a constant integer exponent ``c`` in 2..4 is a product of ``x``s (GPT-2's
  GELU computes ``x ** 3``: TVM lowers ``power`` to a scalar ``powf`` call per element, which kept
  that element-wise task at 6 GFLOP/s);
- a 1-D convolution (``conv1d``, ``NCW``/``OIW``: a speech model's stem) is a 2-D one over a unit
  row (``squeeze(conv2d(expand_dims(x, 2), W[:, :, None, :]), 2)``), so that it takes the
  convolution layout, the default schedules and the library peers of ``conv2d`` (it had neither a
  peer nor a vectorized default schedule: 2 GFLOP of a Whisper-sized encoder ran as naive loops).
Numerics are unchanged up to float rounding (the tests compare against the frameworks).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst
from tvm.relax.dpl import is_const, is_op, is_tuple_get_item, wildcard

from compiler.lowering.relax_rewrite import is_constant, rewrite_call

_COMMUTATIVE = ("relax.add", "relax.multiply", "relax.maximum", "relax.minimum")


def _const(value: np.ndarray, dtype: str) -> GenericConst:
    return relax.const(np.ascontiguousarray(value.astype(dtype)), dtype)


def _fold_conv_batch_norm(func: relax.Function) -> relax.Function:
    data, weight, bias = wildcard(), is_const(), is_const()
    conv = is_op("relax.nn.conv2d")(data, weight)
    biased = is_op("relax.add")(conv, bias) | is_op("relax.add")(bias, conv)
    gamma, beta, mean, var = is_const(), is_const(), is_const(), is_const()
    norm_biased = is_op("relax.nn.batch_norm")(biased, gamma, beta, mean, var)
    norm_plain = is_op("relax.nn.batch_norm")(conv, gamma, beta, mean, var)
    cast = is_op("relax.astype")(conv)  # a half-precision program's float32 convolution
    norm_cast = is_op("relax.nn.batch_norm")(cast, gamma, beta, mean, var)
    pattern = (
        is_tuple_get_item(norm_biased, 0)
        | is_tuple_get_item(norm_plain, 0)
        | is_tuple_get_item(norm_cast, 0)
    )

    def rewrite(expr: relax.Expr, matches: dict) -> relax.Expr:
        conv_call = matches[conv]
        norm_call = next(matches[n] for n in (norm_biased, norm_plain, norm_cast) if n in matches)
        attrs = norm_call.attrs
        kernel = conv_call.attrs
        if (
            int(attrs.axis) != 1
            or str(kernel.data_layout) != "NCHW"
            or str(kernel.kernel_layout) != "OIHW"
        ):
            return expr
        w = matches[weight].value.numpy()
        dtype = str(w.dtype)
        channels = w.shape[0]
        scale_g = matches[gamma].value.numpy().astype(np.float64)
        shift_b = matches[beta].value.numpy().astype(np.float64)
        mu = matches[mean].value.numpy().astype(np.float64)
        sigma2 = matches[var].value.numpy().astype(np.float64)
        b = np.zeros(channels)
        if norm_biased in matches:
            raw = matches[bias].value.numpy().astype(np.float64)
            if raw.size != channels:
                return expr
            b = raw.reshape(-1)
        scale = scale_g / np.sqrt(sigma2 + float(attrs.epsilon))
        w_folded = w.astype(np.float64) * scale.reshape(-1, 1, 1, 1)
        b_folded = ((b - mu) * scale + shift_b).reshape(1, channels, 1, 1)
        folded_conv = relax.Call(
            conv_call.op, [matches[data], _const(w_folded, dtype)], conv_call.attrs
        )
        if norm_cast in matches:  # the cast stays right after the convolution (cuDNN's half peer)
            out = str(matches[cast].attrs.dtype)
            return relax.op.add(relax.op.astype(folded_conv, out), _const(b_folded, out))
        return relax.op.add(folded_conv, _const(b_folded, dtype))

    return rewrite_call(pattern, rewrite, func, hide_constants=False)  # folds the weights


def _integer_powers(func: relax.Function) -> relax.Function:
    base, exponent = wildcard(), is_const()
    pattern = is_op("relax.power")(base, exponent)

    def rewrite(expr: relax.Expr, matches: dict) -> relax.Expr:
        value = _scalar(matches[exponent])
        if value is None or value not in (2.0, 3.0, 4.0):
            return expr
        x = matches[base]
        square = relax.op.multiply(x, x)
        if value == 2.0:
            return square
        return relax.op.multiply(square, x) if value == 3.0 else relax.op.multiply(square, square)

    return rewrite_call(pattern, rewrite, func)


def _out_dtype(dtype: object) -> str | None:
    """A convolution's ``out_dtype`` attribute as ``conv2d`` takes it: ``None`` when unset (the
    ONNX importer leaves it ``None`` or ``void``: the input's dtype)."""
    text = "" if dtype is None else str(dtype)
    return None if text in ("", "void", "None") else text


def _conv1d_as_conv2d(func: relax.Function) -> relax.Function:
    data, weight, bias = wildcard(), wildcard(), is_const()
    plain = is_op("relax.nn.conv1d")(data, weight)
    biased = is_op("relax.add")(plain, bias)

    def rewrite(expr: relax.Expr, matches: dict) -> relax.Expr:
        attrs = matches[plain].attrs
        layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
        if layouts != ("NCW", "OIW", "NCW"):
            return expr
        kernel = matches[weight]
        if isinstance(kernel, GenericConst):  # a constant stays one (the peers want constants)
            w = kernel.value.numpy()
            kernel = _const(w.reshape(w.shape[0], w.shape[1], 1, w.shape[2]), str(w.dtype))
        else:
            kernel = relax.op.expand_dims(kernel, 2)
        left, right = (int(p) for p in attrs.padding)
        conv = relax.op.nn.conv2d(
            relax.op.expand_dims(matches[data], 2),
            kernel,
            strides=(1, int(attrs.strides[0])),
            padding=(0, left, 0, right),
            dilation=(1, int(attrs.dilation[0])),
            groups=int(attrs.groups),
            out_dtype=_out_dtype(attrs.out_dtype),
        )
        if biased in matches:  # the bias joins the convolution's task (a peer's epilogue)
            b = matches[bias].value.numpy()
            if b.ndim != 3 or b.shape[0] != 1 or b.shape[2] != 1:
                return expr
            conv = relax.op.add(conv, _const(b.reshape(1, -1, 1, 1), str(b.dtype)))
        return relax.op.squeeze(conv, [2])

    return rewrite_call(biased | plain, rewrite, func, hide_constants=False)  # reads weights


def _scalar(const: GenericConst) -> float | None:
    value = const.value.numpy()
    return float(value.reshape(-1)[0]) if value.size == 1 else None


def _call_tir_with_scalar(expr: relax.Expr | None, prefix: str) -> tuple[relax.Expr, float] | None:
    """``(x, c)`` for ``call_tir(<prefix>*, (x, const c))`` (how the ONNX importer emits Clip)."""
    if not isinstance(expr, relax.Call) or getattr(expr.op, "name", "") != "relax.call_tir":
        return None
    callee, packed = expr.args[0], expr.args[1]
    if not isinstance(callee, tvm.ir.GlobalVar) or not callee.name_hint.startswith(prefix):
        return None
    fields = getattr(packed, "fields", None)
    if fields is None or len(fields) != 2 or not isinstance(fields[1], GenericConst):
        return None
    value = _scalar(fields[1])
    return None if value is None else (fields[0], value)


@relax.expr_functor.mutator
class _ClipFromCallTir(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - TVM visitor name
        call = super().visit_call_(call)
        upper = _call_tir_with_scalar(call, "minimum")
        if upper is None:
            return call
        inner, high = upper
        producer = self.lookup_binding(inner) if isinstance(inner, relax.Var) else inner
        lower = _call_tir_with_scalar(producer, "maximum")
        if lower is None or lower[1] > high:
            return call
        return relax.op.clip(lower[0], lower[1], high)


def _clip_from_min_max(func: relax.Function) -> relax.Function:
    data, low, high = wildcard(), is_const(), is_const()
    lower = is_op("relax.maximum")(data, low)
    pattern = is_op("relax.minimum")(lower, high)

    def rewrite(expr: relax.Expr, matches: dict) -> relax.Expr:
        lo, hi = _scalar(matches[low]), _scalar(matches[high])
        if lo is None or hi is None or lo > hi:
            return expr
        return relax.op.clip(matches[data], lo, hi)

    return rewrite_call(pattern, rewrite, func)


def static_shape(expr: relax.Expr) -> list[int] | None:
    """The integer shape of ``expr``'s tensor type, or ``None`` when it is not fully static."""
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    if shape is None or not hasattr(shape, "values"):
        return None
    try:
        return [int(d) for d in shape.values]
    except TypeError:
        return None


def _flatten_linear(func: relax.Function) -> relax.Function:
    data, weight, bias = wildcard(), wildcard(), wildcard()
    product = is_op("relax.matmul")(data, weight)
    biased = is_op("relax.add")(product, bias)
    pattern = biased | product

    def rewrite(expr: relax.Expr, matches: dict) -> relax.Expr:
        with_bias = biased in matches
        if not is_constant(matches[weight]) or (with_bias and not is_constant(matches[bias])):
            return expr
        shape = static_shape(matches[data])
        w_shape = static_shape(matches[weight]) or []
        if shape is None or len(shape) <= 2 or len(w_shape) != 2:
            return expr
        if with_bias and static_shape(matches[bias]) not in ([w_shape[1]], [1, w_shape[1]]):
            return expr
        rows = 1
        for dim in shape[:-1]:
            rows *= dim
        call = matches[product]
        flat = relax.op.reshape(matches[data], [rows, shape[-1]])
        result = relax.Call(call.op, [flat, matches[weight]], call.attrs)
        if with_bias:
            result = relax.op.add(result, matches[bias])
        return relax.op.reshape(result, [*shape[:-1], w_shape[1]])

    return rewrite_call(pattern, rewrite, func)


@relax.expr_functor.mutator
class _ConstantOperandLast(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - TVM visitor name
        call = super().visit_call_(call)
        if (
            isinstance(call.op, tvm.ir.Op)
            and call.op.name in _COMMUTATIVE
            and len(call.args) == 2
            and isinstance(call.args[0], GenericConst)
            and not isinstance(call.args[1], GenericConst)
        ):
            return relax.Call(call.op, [call.args[1], call.args[0]], call.attrs, call.ty_args)
        return call


def canonicalize(mod: tvm.IRModule) -> tvm.IRModule:
    """Apply the rewrites of the module docstring to every Relax function of ``mod``."""
    updated = tvm.IRModule(mod.functions, attrs=mod.attrs)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            func = _conv1d_as_conv2d(func)
            func = _integer_powers(func)
            func = _fold_conv_batch_norm(func)
            func = _ConstantOperandLast().visit_expr(func)
            func = _clip_from_min_max(func)
            func = _ClipFromCallTir().visit_expr(func)
            func = _flatten_linear(func)
            func = _ConstantOperandLast().visit_expr(func)
            updated[gvar] = func
    return relax.transform.DeadCodeElimination()(updated)
