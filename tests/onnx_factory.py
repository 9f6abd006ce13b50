"""Tiny hand-built ONNX graphs for tests of validation and import (no torch needed)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: list[onnx.TensorProto] | None = None,
    opset: int = 17,
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializers or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def float_input(name: str, shape: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def relu_model(shape: list[int | str] = (1, 8), opset: int = 17) -> onnx.ModelProto:
    return make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [float_input("x", list(shape))],
        [float_input("y", list(shape))],
        opset=opset,
    )


def matmul_model(rows: int | str = 4, inner: int = 16, cols: int = 8) -> onnx.ModelProto:
    weight = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((inner, cols)).astype(np.float32), "w"
    )
    return make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [float_input("x", [rows, inner])],
        [float_input("y", [rows, cols])],
        [weight],
    )


def unsupported_ops_model() -> onnx.ModelProto:
    """Uses Celu and Det, which the Relax ONNX importer lacks (plus a supported Relu)."""
    return make_model(
        [
            helper.make_node("Celu", ["x"], ["a"]),
            helper.make_node("Relu", ["a"], ["b"]),
            helper.make_node("Det", ["b"], ["y"]),
        ],
        [float_input("x", [2, 3, 3])],
        [float_input("y", [2])],
    )


def two_layer_model(
    batch: int = 4, inner: int = 32, hidden: int = 16, cols: int = 8
) -> onnx.ModelProto:
    """``relu(x @ w1) @ w2``: two tuning tasks (a fused matmul+relu and a matmul)."""
    rng = np.random.default_rng(1)
    w1 = numpy_helper.from_array(rng.standard_normal((inner, hidden)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((hidden, cols)).astype(np.float32), "w2")
    return make_model(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"]),
            helper.make_node("Relu", ["h"], ["a"]),
            helper.make_node("MatMul", ["a", "w2"], ["y"]),
        ],
        [float_input("x", [batch, inner])],
        [float_input("y", [batch, cols])],
        [w1, w2],
    )


def constant_of_shape_bomb(shape: list[int]) -> onnx.ModelProto:
    """``x + ConstantOfShape(shape)``: ~120 bytes of file, ``prod(shape)`` float32 elements once
    TVM folds the constant at import."""
    dims = numpy_helper.from_array(np.array(shape, dtype=np.int64), "s")
    return make_model(
        [
            helper.make_node("ConstantOfShape", ["s"], ["c"]),
            helper.make_node("Add", ["x", "c"], ["y"]),
        ],
        [float_input("x", [1])],
        [float_input("y", list(shape))],
        [dims],
    )


def add_chain_model(nodes: int, width: int = 4) -> onnx.ModelProto:
    """``nodes`` chained ``Add`` nodes (``y = x + 1 + 1 + ...``): small file, slow to import."""
    one = numpy_helper.from_array(np.ones(width, dtype=np.float32), "one")
    names = ["x"] + [f"a{i}" for i in range(nodes - 1)] + ["y"]
    chain = [helper.make_node("Add", [names[i], "one"], [names[i + 1]]) for i in range(nodes)]
    return make_model(chain, [float_input("x", [width])], [float_input("y", [width])], [one])


def external_data_model(location: str, shape: tuple[int, ...] = (4, 4)) -> onnx.ModelProto:
    """``x @ w`` whose weight ``w`` is stored as external data at ``location`` (not written)."""
    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=list(shape))
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (
        ("location", location),
        ("offset", "0"),
        ("length", str(4 * int(np.prod(shape)))),
    ):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    return make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [float_input("x", [2, shape[0]])],
        [float_input("y", [2, shape[1]])],
        [weight],
    )
