"""Static resource limits of an ONNX graph, checked before TVM sees it.

TVM's ONNX importer and ``FoldConstant`` evaluate every value computed only from constants at
import time: a 126-byte file whose ``ConstantOfShape`` names a 10^6 x 10^6 shape made the importer
allocate 4 TB (``std::bad_alloc``), and one of 2.5·10^8 elements doubled the service's memory.
:func:`check_graph_limits` bounds that work from the graph alone, without evaluating anything:

* the node count (subgraphs included) is at most ``ModelLimits.max_nodes``;
* every *compile-time constant* -- initializers (dense and sparse), ``Constant`` nodes, ``Shape`` /
  ``Size`` of a statically shaped tensor, and the output of any node whose inputs are all
  compile-time constants (``ConstantOfShape``, ``Expand``, ``Tile``, ``Range``, a broadcasting
  ``Add`` of two constants...) -- has a shape that ONNX shape inference knows (helped by the small
  shape values of :mod:`compiler.limits.shape_values`), with at most ``max_constant_elements``
  elements and ``max_constant_bytes`` bytes.

A constant whose shape inference cannot determine is refused too: its size cannot be bounded
before it is built. The Relax-side check (:mod:`compiler.limits.constant_limits`) and the validation
process's memory limit (``service.validation``) are the run-time bounds behind this one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import onnx
from onnx import helper

from compiler.errors import ModelError
from compiler.frontends.model_spec import ModelLimits
from compiler.limits.shape_values import shape_values, substitute_values

#: Ops TVM evaluates at import time from a statically known input *shape* (not its values).
_SHAPE_OF_INPUT_OPS = frozenset({"Shape", "Size"})
_MAX_ROUNDS = 4


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            yield attribute.g
        yield from attribute.graphs


def count_nodes(graph: onnx.GraphProto) -> int:
    """Nodes of ``graph`` and of every subgraph (``If``/``Loop``/``Scan`` bodies), iteratively."""
    total, pending = 0, [graph]
    while pending:
        current = pending.pop()
        total += len(current.node)
        for node in current.node:
            pending.extend(_subgraphs(node))
    return total


def _itemsize(elem_type: int) -> int:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return 8  # strings and unknown types: count them as 8 bytes per element


def _check_size(what: str, dims: list[int], elem_type: int, limits: ModelLimits) -> None:
    elements = math.prod(dims)
    size = elements * _itemsize(elem_type)
    if elements > limits.max_constant_elements or size > limits.max_constant_bytes:
        raise ModelError(
            "constant_too_large",
            f"{what} has shape {dims} ({elements:.3g} elements, {size:.3g} bytes), over the limit "
            f"of {limits.max_constant_elements} elements and {limits.max_constant_bytes} bytes "
            "for a tensor built at compile time",
        )


def _static_dims(value: onnx.ValueInfoProto) -> list[int] | None:
    """The fully static shape of ``value``, or ``None`` when any dimension is unknown."""
    if not value.type.HasField("tensor_type") or not value.type.tensor_type.HasField("shape"):
        return None
    dims = []
    for dim in value.type.tensor_type.shape.dim:
        if not dim.HasField("dim_value") or dim.dim_value < 0:
            return None
        dims.append(int(dim.dim_value))
    return dims


def _infer(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Shapes by ONNX shape inference *without* data propagation: its data propagation (which
    evaluates ``Add``/``Mul``... on whole tensors) used ~140 bytes per element of a folded
    constant, so a 113-byte file of one 2.5·10^8-element ``ConstantOfShape`` needed tens of GB.
    Shape values are propagated by :mod:`compiler.limits.shape_values` instead, bounded in size."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=False)
    except (onnx.shape_inference.InferenceError, ValueError, RuntimeError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        raise ModelError("bad_onnx", f"ONNX shape inference failed: {first}") from None
    graph = inferred.graph
    values = {v.name: v for v in [*graph.input, *graph.value_info, *graph.output]}
    for tensor in graph.initializer:  # includes values substituted by _infer_with_shape_values
        values.setdefault(
            tensor.name,
            helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)),
        )
    return values


def _infer_with_shape_values(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Infer shapes, then substitute small computed shape values (``Shape`` -> ``Concat`` ->
    ``ConstantOfShape``...) as initializers and infer again, until nothing new is learnt."""
    current = model
    values = _infer(current)
    for _ in range(_MAX_ROUNDS):
        known = shape_values(current.graph, {name: _static_dims(v) for name, v in values.items()})
        if not known:
            return values
        current = substitute_values(current, known)
        values = _infer(current)
    return values


def fold_shape_computations(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` (static inputs) whose small shape computations (``Shape`` ->
    ``Gather`` -> ``Concat``..., :func:`compiler.limits.shape_values.shape_values`) are
    initializers.

    An exporter keeps them in a graph exported with a symbolic dimension; once the dimension is
    bound (a shape bucket), TVM's ONNX importer folds ``Shape``/``Gather`` to a scalar PrimValue
    that its ``Reshape`` converter then refuses ("Reshape expects the input data to be a
    Tensor"): handing it the values as constants is what a static export does."""
    current = model
    for _ in range(2 * _MAX_ROUNDS):
        values = _infer(current)
        known = shape_values(current.graph, {name: _static_dims(v) for name, v in values.items()})
        if not known:
            break
        current = substitute_values(current, known)
    if current is model:
        return model
    while True:  # nodes only folded nodes read (the Constant shapes of folded reshapes): gone
        used = {
            name
            for graph in _all_graphs(current.graph)
            for node in graph.node
            for name in node.input
        } | {out.name for out in current.graph.output}
        live = [node for node in current.graph.node if any(o in used for o in node.output)]
        if len(live) == len(current.graph.node):
            break
        del current.graph.node[:]
        current.graph.node.extend(live)
    declared = {value.name for value in current.graph.input}
    kept = [t for t in current.graph.initializer if t.name in used or t.name in declared]
    del current.graph.initializer[:]
    current.graph.initializer.extend(kept)  # what only folded nodes read: gone
    return current


def _all_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    pending = [graph]
    while pending:
        current = pending.pop()
        yield current
        for node in current.node:
            pending.extend(_subgraphs(node))


def _check_initializers(graph: onnx.GraphProto, limits: ModelLimits) -> set[str]:
    constants: set[str] = set()
    for tensor in graph.initializer:
        _check_size(f"initializer {tensor.name!r}", list(tensor.dims), tensor.data_type, limits)
        constants.add(tensor.name)
    for sparse in graph.sparse_initializer:
        _check_size(
            f"sparse initializer {sparse.values.name!r}",
            list(sparse.dims),
            sparse.values.data_type,
            limits,
        )
        constants.add(sparse.values.name)
    return constants


def _check_constant_node(node: onnx.NodeProto, limits: ModelLimits) -> None:
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.TENSOR:
            _check_size(
                f"Constant node {node.name or node.output[0]!r}",
                list(attribute.t.dims),
                attribute.t.data_type,
                limits,
            )
        elif attribute.type == onnx.AttributeProto.SPARSE_TENSOR:
            _check_size(
                f"Constant node {node.name or node.output[0]!r}",
                list(attribute.sparse_tensor.dims),
                attribute.sparse_tensor.values.data_type,
                limits,
            )


def check_graph_limits(model: onnx.ModelProto, limits: ModelLimits) -> None:
    """Refuse ``model`` if it has too many nodes or could build too large a constant (see module).

    ``model``'s graph inputs should already declare their static shapes. Evaluates nothing; raises
    :class:`ModelError` with code ``too_many_nodes``, ``constant_too_large`` or ``bad_onnx``.
    """
    nodes = count_nodes(model.graph)
    if nodes > limits.max_nodes:
        raise ModelError(
            "too_many_nodes",
            f"ONNX model has {nodes} nodes, over the limit of {limits.max_nodes}",
        )
    graph = model.graph
    constants = _check_initializers(graph, limits)
    values = _infer_with_shape_values(model)
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            _check_constant_node(node, limits)
            constants.update(node.output)
            continue
        inputs = [name for name in node.input if name]
        if node.op_type in _SHAPE_OF_INPUT_OPS:
            source = values.get(inputs[0]) if inputs else None
            folded = source is not None and _static_dims(source) is not None
        else:
            folded = all(name in constants for name in inputs) and not any(_subgraphs(node))
        if not folded:
            continue
        for output in node.output:
            if not output:
                continue
            info = values.get(output)
            dims = _static_dims(info) if info is not None else None
            what = f"output {output!r} of {node.op_type} node {node.name or output!r}"
            if dims is None:
                raise ModelError(
                    "constant_too_large",
                    f"{what} is computed from constants only, but its shape cannot be determined "
                    "before it is built, so its size cannot be bounded; give it a static shape",
                )
            _check_size(what, dims, info.type.tensor_type.elem_type, limits)
            constants.add(output)
