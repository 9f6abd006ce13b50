"""Convolutions in NHWC for CPU targets (the layout lever of issue 19).

In NCHW a convolution's vectors run along the image width (7–56 wide); in NHWC they run along
the channels, which is how TVM's own x86 results were tuned. ``to_nhwc`` promises a Relax module
computing the same function as ``mod`` (inputs and outputs keep their layouts) in which
- every ``relax.nn.conv2d`` runs as ``NHWC`` data with ``HWIO`` weights (the weights are
  constants: the transposed copies are folded, nothing is transposed at run time);
- the element-wise ops, pools and reductions between convolutions follow the layout
  (``relax.transform.ConvertLayout``), so transposes remain only at the model's edges: one from
  each NCHW input, and one back where a layout-sensitive op (reshape, matmul, an output) needs
  NCHW; a transpose that only moves axes of extent 1 (``[1, 1, 1, C]`` → ``[1, C, 1, 1]`` before
  a classifier's flatten) is a reshape, which the VM executes as a view;
- ``clip`` (ReLU6) is written ``minimum(maximum(x, lo), hi)`` first: ConvertLayout does not
  propagate layouts through ``clip``, which left MobileNetV2 with 70 transposes (2 without).
Both frontends' imports reach this form alike (they are canonical before it:
:mod:`compiler.frontends.canonicalize`), so ONNX and ``.pt2`` tasks still share keys. ``mod`` itself
is not modified.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from compiler.frontends.canonicalize import static_shape
from compiler.lowering.relax_rewrite import rewrite_call

#: ``ConvertLayout``'s desired layouts: data, weights (output follows data).
DESIRED_LAYOUTS: dict[str, list[str]] = {"relax.nn.conv2d": ["NHWC", "HWIO"]}


def _clip_as_min_max(func: relax.Function) -> relax.Function:
    data = wildcard()
    pattern = is_op("relax.clip")(data, wildcard(), wildcard())

    def rewrite(expr: relax.Call, matches: dict) -> relax.Expr:
        dtype = getattr(getattr(expr, "ty", None), "dtype", None)
        low, high = expr.args[1], expr.args[2]
        try:  # clip's bounds are PrimValues of float immediates
            lo, hi = float(low.value), float(high.value)
        except (AttributeError, TypeError, ValueError):
            return expr
        if dtype is None:
            return expr
        lower = relax.op.maximum(matches[data], relax.const(lo, str(dtype)))
        return relax.op.minimum(lower, relax.const(hi, str(dtype)))

    return rewrite_call(pattern, rewrite, func)


def _unit_transposes_as_reshapes(func: relax.Function) -> relax.Function:
    data = wildcard()
    pattern = is_op("relax.permute_dims")(data)

    def rewrite(expr: relax.Call, matches: dict) -> relax.Expr:
        shape = static_shape(matches[data])
        out_shape = static_shape(expr)
        axes = getattr(expr.attrs, "axes", None)
        if shape is None or out_shape is None or axes is None:
            return expr
        moved = [int(a) for a in axes]
        kept = [a for a in moved if shape[a] != 1]
        if kept != sorted(kept):  # a real transpose: non-unit axes change order
            return expr
        return relax.op.reshape(matches[data], out_shape)

    return rewrite_call(pattern, rewrite, func)


def _map_relax_functions(mod: tvm.IRModule, rewrite) -> tvm.IRModule:
    updated = tvm.IRModule(mod.functions, attrs=mod.attrs)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            updated[gvar] = rewrite(func)
    return updated


def to_nhwc(mod: tvm.IRModule) -> tvm.IRModule:
    """Rewrite ``mod``'s convolutions into NHWC as the module docstring says."""
    mod = _map_relax_functions(mod, _clip_as_min_max)
    mod = tvm.ir.transform.Sequential(
        [
            relax.transform.ConvertLayout(DESIRED_LAYOUTS),
            relax.transform.FoldConstant(),
        ]
    )(mod)
    mod = _map_relax_functions(mod, _unit_transposes_as_reshapes)
    return tvm.ir.transform.Sequential(
        [relax.transform.CanonicalizeBindings(), relax.transform.DeadCodeElimination()]
    )(mod)
