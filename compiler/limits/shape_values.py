"""Small compile-time values of an ONNX graph's shape computations, computed without TVM.

Exporters build shapes at run time (``Shape`` -> ``Gather`` -> ``Concat`` -> ``ConstantOfShape``);
with static inputs TVM folds them all, and ONNX shape inference can size the folded tensors only
when those shape values are known. Its own data propagation evaluates arithmetic on tensors of
any size (see :mod:`compiler.limits.graph_limits`), so this module does the same for *small* tensors
only: :func:`shape_values` evaluates nodes whose inputs are all known and keeps results of at most
:data:`MAX_VALUE_ELEMENTS` elements; :func:`substitute_values` turns them into initializers so a
second inference run can use them. Nothing is evaluated on a tensor larger than that bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

MAX_VALUE_ELEMENTS = 64

_Eval = Callable[[onnx.NodeProto, list[np.ndarray]], np.ndarray]


def _attr(node: onnx.NodeProto, name: str, default=None):
    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    return default


def _unsqueeze(node: onnx.NodeProto, args: list[np.ndarray]) -> np.ndarray:
    axes = list(args[1]) if len(args) > 1 else list(_attr(node, "axes", []))
    out = args[0]
    rank = out.ndim + len(axes)
    for axis in sorted(int(a) % rank for a in axes):
        out = np.expand_dims(out, axis)
    return out


def _squeeze(node: onnx.NodeProto, args: list[np.ndarray]) -> np.ndarray:
    axes = list(args[1]) if len(args) > 1 else _attr(node, "axes")
    return np.squeeze(args[0], axis=None if axes is None else tuple(int(a) for a in axes))


def _slice(node: onnx.NodeProto, args: list[np.ndarray]) -> np.ndarray:
    data = args[0]
    if len(args) >= 3:
        starts, ends = list(args[1]), list(args[2])
        axes = list(args[3]) if len(args) > 3 else list(range(len(starts)))
        steps = list(args[4]) if len(args) > 4 else [1] * len(starts)
    else:
        starts, ends = list(_attr(node, "starts")), list(_attr(node, "ends"))
        axes = list(_attr(node, "axes", range(len(starts))))
        steps = [1] * len(starts)
    index = [slice(None)] * data.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        index[int(axis)] = slice(int(start), int(end), int(step))
    return data[tuple(index)]


def _constant_of_shape(node: onnx.NodeProto, args: list[np.ndarray]) -> np.ndarray:
    value = _attr(node, "value")
    fill = (
        numpy_helper.to_array(value).reshape(-1) if value is not None else np.zeros(1, np.float32)
    )
    shape = [int(d) for d in args[0]]
    if math.prod(shape) > MAX_VALUE_ELEMENTS:
        raise ValueError("too large")
    return np.full(shape, fill[0], dtype=fill.dtype)


def _range(_node: onnx.NodeProto, args: list[np.ndarray]) -> np.ndarray:
    start, limit, delta = (a.item() for a in args)
    if delta == 0 or max(0, math.ceil((limit - start) / delta)) > MAX_VALUE_ELEMENTS:
        raise ValueError("too large")
    return np.arange(start, limit, delta, dtype=args[0].dtype)


def _cast(node: onnx.NodeProto, args: list[np.ndarray]) -> np.ndarray:
    return args[0].astype(helper.tensor_dtype_to_np_dtype(_attr(node, "to")))


def _div(_node: onnx.NodeProto, args: list[np.ndarray]) -> np.ndarray:
    a, b = args
    if np.issubdtype(a.dtype, np.integer):
        return np.trunc(a / b).astype(a.dtype)
    return a / b


_EVALUATORS: dict[str, _Eval] = {
    "Identity": lambda _n, a: a[0],
    "Cast": _cast,
    "Concat": lambda n, a: np.concatenate(a, axis=int(_attr(n, "axis", 0))),
    "Gather": lambda n, a: np.take(a[0], a[1], axis=int(_attr(n, "axis", 0))),
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Slice": _slice,
    "Reshape": lambda _n, a: a[0].reshape(
        [int(d) if d else a[0].shape[i] for i, d in enumerate(a[1])]
    ),
    "Add": lambda _n, a: a[0] + a[1],
    "Sub": lambda _n, a: a[0] - a[1],
    "Mul": lambda _n, a: a[0] * a[1],
    "Div": _div,
    "Neg": lambda _n, a: -a[0],
    "Abs": lambda _n, a: np.abs(a[0]),
    "Max": lambda _n, a: np.maximum.reduce(a),
    "Min": lambda _n, a: np.minimum.reduce(a),
    "Equal": lambda _n, a: np.equal(a[0], a[1]),
    "Where": lambda _n, a: np.where(a[0], a[1], a[2]),
    "Floor": lambda _n, a: np.floor(a[0]),
    "Ceil": lambda _n, a: np.ceil(a[0]),
    "ConstantOfShape": _constant_of_shape,
    "Range": _range,
}


#: ``Constant`` attributes other than ``value`` and the dtype of the value each one means.
_CONSTANT_LISTS = {
    "value_ints": np.int64,
    "value_int": np.int64,
    "value_floats": np.float32,
    "value_float": np.float32,
}


def _constant_attribute(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a ``Constant`` given by ``value_int(s)`` / ``value_float(s)`` (torch's
    dynamo exporter writes the shapes of reshapes so), if small."""
    for name, dtype in _CONSTANT_LISTS.items():
        value = _attr(node, name)
        if value is not None:
            array = np.array(value, dtype=dtype)
            return array if array.size <= MAX_VALUE_ELEMENTS else None
    return None


def _small(tensor: onnx.TensorProto) -> bool:
    return (
        math.prod(tensor.dims) <= MAX_VALUE_ELEMENTS
        and tensor.data_location != onnx.TensorProto.EXTERNAL
    )


def shape_values(
    graph: onnx.GraphProto, static_shapes: Mapping[str, list[int] | None]
) -> dict[str, np.ndarray]:
    """Values of node outputs that small known values determine (at most
    :data:`MAX_VALUE_ELEMENTS` elements each, every input too). ``static_shapes`` gives the
    inferred static shape of a tensor (``None`` when unknown), for ``Shape`` and ``Size``.
    Promises never to build a larger array; a node it cannot evaluate is simply left out."""
    known: dict[str, np.ndarray] = {
        t.name: numpy_helper.to_array(t) for t in graph.initializer if _small(t)
    }
    found: dict[str, np.ndarray] = {}
    for node in graph.node:
        if len(node.output) != 1 or not node.output[0] or node.domain not in ("", "ai.onnx"):
            continue
        out = node.output[0]
        try:
            if node.op_type == "Constant":
                value = _attr(node, "value")
                result = (
                    numpy_helper.to_array(value)
                    if value is not None and _small(value)
                    else _constant_attribute(node)
                )
            elif node.op_type in ("Shape", "Size"):
                dims = static_shapes.get(node.input[0])
                if dims is None:
                    continue
                if node.op_type == "Size":
                    result = np.array(math.prod(dims), dtype=np.int64)
                else:
                    start, end = _attr(node, "start", 0), _attr(node, "end")
                    result = np.array(dims[start:end], dtype=np.int64)
            elif node.op_type in _EVALUATORS and all(i in known for i in node.input if i):
                args = [known[i] for i in node.input if i]
                result = np.asarray(_EVALUATORS[node.op_type](node, args))
            else:
                continue
        except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError):
            continue
        if result is None or result.size > MAX_VALUE_ELEMENTS or result.dtype == object:
            continue
        known[out] = result
        if node.op_type != "Constant":
            found[out] = result
    return found


def substitute_values(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` whose nodes producing ``values`` are replaced by initializers (and
    their ``value_info`` entries dropped)."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    kept = [
        node
        for node in fixed.graph.node
        if not (len(node.output) == 1 and node.output[0] in values)
    ]
    del fixed.graph.node[:]
    fixed.graph.node.extend(kept)
    # An exporter's annotation of a substituted value (``[1, 1, 1, "past + seq"]``, its symbol
    # cleared once the inputs are bound) would hide the initializer's static shape from
    # shape inference: the initializer says it now.
    infos = [v for v in fixed.graph.value_info if v.name not in values]
    del fixed.graph.value_info[:]
    fixed.graph.value_info.extend(infos)
    fixed.graph.initializer.extend(numpy_helper.from_array(v, name) for name, v in values.items())
    return fixed
