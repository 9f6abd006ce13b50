"""Describe the user inputs of a ``torch.export`` program, bind its symbolic dimensions, bound its
graph.

The archive itself is opened only through :mod:`compiler.frontends.pt2_safety` (no code runs from
it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.export.graph_signature import InputKind, TensorArgument

from compiler.errors import ModelError
from compiler.frontends.model_spec import ModelLimits, TensorSpec
from compiler.frontends.onnx_loader import check_input_sizes
from compiler.shapes.buckets import SymbolicDim


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_user_inputs(program: torch.export.ExportedProgram) -> list[str]:
    """The names of the program's user inputs that are tensors, in order. A constant argument
    the program was exported with (``use_cache=True``, a ``None``) is part of its graph, not an
    input of the compiled function."""
    return [
        spec.arg.name
        for spec in program.graph_signature.input_specs
        if spec.kind == InputKind.USER_INPUT and isinstance(spec.arg, TensorArgument)
    ]


def pt2_input_specs(
    program: torch.export.ExportedProgram,
    input_shapes: Mapping[str, Sequence[int]],
    limits: ModelLimits,
) -> tuple[tuple[TensorSpec, ...], tuple[tuple[str, int], ...]]:
    """Return the program's user inputs with static shapes, and the symbol bindings used.

    Every symbolic dimension must be given by ``input_shapes`` (input name → full shape); the same
    symbol must get the same value everywhere. Raises :class:`ModelError` otherwise.
    """
    user_inputs = tensor_user_inputs(program)
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    unknown = set(input_shapes) - set(user_inputs)
    if unknown:
        raise ModelError(
            "bad_input_shape",
            f"--input-shape names unknown input(s) {sorted(unknown)}; the model's inputs are "
            f"{user_inputs}",
        )
    specs: list[TensorSpec] = []
    bindings: dict[str, int] = {}
    for name in user_inputs:
        value: Any = placeholders[name].meta.get("val") if name in placeholders else None
        if not isinstance(value, torch.Tensor):
            raise ModelError(
                "bad_input", f"input {name!r} is not a tensor ({type(value).__name__})"
            )
        declared = list(value.shape)
        given = input_shapes.get(name)
        if given is not None and len(given) != len(declared):
            raise ModelError(
                "bad_input_shape",
                f"input {name!r} has rank {len(declared)}, but --input-shape gave {len(given)}",
            )
        shape: list[int] = []
        for index, dim in enumerate(declared):
            if isinstance(dim, int):
                if given is not None and int(given[index]) != dim:
                    raise ModelError(
                        "bad_input_shape",
                        f"input {name!r} declares dimension {dim}, --input-shape gave "
                        f"{given[index]}",
                    )
                shape.append(dim)
                continue
            if given is None:
                raise ModelError(
                    "symbolic_shape",
                    f"input {name!r} has symbolic dimension {dim}; give static values with "
                    f"--input-shape {name}=D0,D1,...",
                )
            symbol, concrete = str(dim), int(given[index])
            if bindings.setdefault(symbol, concrete) != concrete:
                raise ModelError(
                    "bad_input_shape",
                    f"symbolic dimension {symbol} was given two values: "
                    f"{bindings[symbol]} and {concrete}",
                )
            shape.append(concrete)
        specs.append(TensorSpec(name, tuple(shape), _dtype_name(value.dtype)))
    check_input_sizes(specs, limits)
    return tuple(specs), tuple(sorted(bindings.items()))


def pt2_symbolic_dims(
    program: torch.export.ExportedProgram,
) -> tuple[list[SymbolicDim], dict[str, list[int | None]]]:
    """The symbolic dimensions of the program's user inputs (symbol: the name ``torch.export``
    recorded, e.g. ``s70``; range: its ``range_constraints``) and the declared shape of each
    input that has one (``None`` at its symbolic axes). A dimension that is an expression of
    symbols (``2*s0``) cannot be bucketed: refused with ``symbolic_shape``."""
    ranges = {str(symbol): bounds for symbol, bounds in program.range_constraints.items()}
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    dims: list[SymbolicDim] = []
    declared: dict[str, list[int | None]] = {}
    for name in tensor_user_inputs(program):
        value: Any = placeholders[name].meta.get("val") if name in placeholders else None
        if not isinstance(value, torch.Tensor):
            continue  # refused by pt2_input_specs
        shape = list(value.shape)
        if all(isinstance(d, int) for d in shape):
            continue
        declared[name] = [d if isinstance(d, int) else None for d in shape]
        for axis, dim in enumerate(shape):
            if isinstance(dim, int):
                continue
            symbol = str(dim)
            if not symbol.isidentifier():
                raise ModelError(
                    "symbolic_shape",
                    f"input {name!r} has dimension {symbol}, an expression of symbols, which "
                    f"cannot be bucketed; give static values with --input-shape {name}=D0,D1,...",
                )
            bounds = ranges.get(symbol)
            low, high = 1, None
            if bounds is not None:
                low = max(1, _bound(bounds.lower) or 1)
                high = _bound(bounds.upper)
            dims.append(SymbolicDim(symbol, name, axis, low, high))
    return dims, declared


def specialize_program(
    program: torch.export.ExportedProgram, specs: Sequence[TensorSpec]
) -> torch.export.ExportedProgram | None:
    """``program`` exported again at the static shapes ``specs`` (its graph module traced on
    zeros of those shapes: ATen operators of the already loaded graph, no code of the file), or
    ``None`` when torch refuses (then the caller binds the symbols in Relax instead).

    Every value that depends on no input is then a constant again (the causal mask and the
    positions over the sequence, :func:`compiler.frontends.pt2_ops.input_free_values`), so a
    bucket's tasks are those of a static export at that length, keys included: binding the symbols
    only after translation left the mask's ``arange``/``index_tensor`` work as runtime tasks."""
    examples = tuple(torch.zeros(spec.shape, dtype=getattr(torch, spec.dtype)) for spec in specs)
    try:
        with torch.no_grad():
            return torch.export.export(program.module(), examples)
    except Exception:  # noqa: BLE001 - any refusal by torch: the Relax binding path is used
        return None


def _bound(value: Any) -> int | None:
    """An integer bound of a ``ValueRanges`` end, ``None`` for infinity."""
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if abs(number) < (1 << 62) else None


def check_pt2_graph_limits(program: torch.export.ExportedProgram, limits: ModelLimits) -> None:
    """Refuse a program with too many graph nodes or a compile-time constant over the limits.

    A node is a compile-time constant when every tensor it reads is a parameter, buffer or constant
    of the program (or it reads none, like ``aten.full``): TVM folds such nodes at import. Their
    sizes come from the shapes ``torch.export`` recorded (``meta["val"]``); nothing is evaluated.
    Raises :class:`ModelError` with code ``too_many_nodes`` or ``constant_too_large``.
    """
    nodes = list(program.graph.nodes)
    operators = sum(1 for node in nodes if node.op == "call_function")
    if operators > limits.max_nodes:
        raise ModelError(
            "too_many_nodes",
            f"torch.export program has {operators} nodes, over the limit of {limits.max_nodes}",
        )
    user_inputs = set(program.graph_signature.user_inputs)
    constant: set[str] = {
        node.name for node in nodes if node.op == "placeholder" and node.name not in user_inputs
    }
    for node in nodes:
        if node.op != "call_function":
            continue
        if any(arg.name not in constant for arg in node.all_input_nodes):
            continue
        constant.add(node.name)
        values = node.meta.get("val")
        for value in values if isinstance(values, (list, tuple)) else [values]:
            if not isinstance(value, torch.Tensor):
                continue
            try:
                shape = [int(d) for d in value.shape]
            except (TypeError, ValueError):  # symbolic: depends on an input, not folded
                continue
            elements = math.prod(shape)
            size = elements * value.element_size()
            if elements > limits.max_constant_elements or size > limits.max_constant_bytes:
                raise ModelError(
                    "constant_too_large",
                    f"graph node {node.name} ({node.target}) builds a constant of shape {shape} "
                    f"({elements:.3g} elements, {size:.3g} bytes), over the limit of "
                    f"{limits.max_constant_elements} elements and {limits.max_constant_bytes} "
                    "bytes for a tensor built at compile time",
                )
