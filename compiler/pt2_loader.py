"""Describe the user inputs of a ``torch.export`` program and bind its symbolic dimensions.

The archive itself is opened only through :mod:`compiler.pt2_safety` (no code runs from it).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from compiler.errors import ModelError
from compiler.model_spec import ModelLimits, TensorSpec
from compiler.onnx_loader import check_input_sizes


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def pt2_input_specs(
    program: torch.export.ExportedProgram,
    input_shapes: Mapping[str, Sequence[int]],
    limits: ModelLimits,
) -> tuple[tuple[TensorSpec, ...], tuple[tuple[str, int], ...]]:
    """Return the program's user inputs with static shapes, and the symbol bindings used.

    Every symbolic dimension must be given by ``input_shapes`` (input name → full shape); the same
    symbol must get the same value everywhere. Raises :class:`ModelError` otherwise.
    """
    user_inputs = list(program.graph_signature.user_inputs)
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
            raise ModelError("bad_input", f"input {name!r} is not a tensor ({type(value).__name__})")
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
                        f"input {name!r} declares dimension {dim}, --input-shape gave {given[index]}",
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
