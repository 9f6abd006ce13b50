"""Load and validate an ONNX model from untrusted bytes.

Promises: a returned model parsed as protobuf, passed ``onnx.checker``, uses a default-domain opset
within :class:`ModelLimits`, carries all weights inside the file (or, when loaded from a path, in
external-data files inside that file's own folder), and declares only static input shapes (after
applying the user's ``input_shapes``) within the size limits, and stays within the node-count and
compile-time-constant limits (:mod:`compiler.limits.graph_limits`). Anything else raises
:class:`ModelError` with a message for the user; nothing is executed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper

from compiler.errors import ModelError
from compiler.frontends.model_spec import ModelLimits, TensorSpec
from compiler.limits.graph_limits import check_graph_limits, fold_shape_computations
from compiler.shapes.buckets import SymbolicDim

_DEFAULT_DOMAINS = ("", "ai.onnx")


def parse_onnx(data: bytes) -> onnx.ModelProto:
    """Parse protobuf bytes into a ``ModelProto`` that at least looks like a model."""
    try:
        model = onnx.load_model_from_string(data)
    except (DecodeError, RuntimeError, ValueError) as err:
        raise ModelError(
            "bad_onnx", f"not a valid ONNX file (protobuf parse failed: {err}); truncated upload?"
        ) from None
    if model.ir_version <= 0 or not model.opset_import or not model.graph.node:
        raise ModelError(
            "bad_onnx",
            "not a valid ONNX model: missing ir_version, opset imports or graph nodes",
        )
    return model


def default_opset(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in _DEFAULT_DOMAINS:
            return int(entry.version)
    raise ModelError("bad_onnx", "ONNX model imports no default-domain opset")


def _check_opset(model: onnx.ModelProto, limits: ModelLimits) -> None:
    opset = default_opset(model)
    highest = min(limits.max_onnx_opset, onnx.defs.onnx_opset_version())
    if not limits.min_onnx_opset <= opset <= highest:
        raise ModelError(
            "bad_opset",
            f"ONNX opset {opset} is not supported: use an opset between "
            f"{limits.min_onnx_opset} and {highest}",
        )


def _external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [
        tensor
        for tensor in onnx.external_data_helper._get_all_tensors(model)  # noqa: SLF001 - no public API
        if onnx.external_data_helper.uses_external_data(tensor)
    ]


def _resolve_external_data(
    model: onnx.ModelProto, base_dir: Path | None, limits: ModelLimits
) -> None:
    """Load external weights only from files inside ``base_dir``; refuse them for raw uploads."""
    tensors = _external_tensors(model)
    if not tensors:
        return
    if base_dir is None:
        raise ModelError(
            "external_data",
            "ONNX model stores weights in external data files; upload a single self-contained "
            "file (torch.onnx.export(..., external_data=False) or onnx.save_model(model, path, "
            "save_as_external_data=False))",
        )
    root = base_dir.resolve()
    total = 0
    for tensor in tensors:
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location", "")
        candidate = (root / location).resolve()
        if not location or Path(location).is_absolute() or root not in candidate.parents:
            raise ModelError(
                "external_data",
                f"external data location {location!r} of tensor {tensor.name!r} is outside "
                "the model's folder",
            )
        if not candidate.is_file():
            raise ModelError(
                "external_data",
                f"external data file {location!r} of tensor {tensor.name!r} is missing",
            )
        total += int(info.get("length", candidate.stat().st_size))
        if total > limits.max_bytes:
            raise ModelError(
                "too_large", f"external data exceeds the {limits.max_bytes}-byte model limit"
            )
    try:
        onnx.external_data_helper.load_external_data_for_model(model, str(root))
    except (OSError, ValueError) as err:
        raise ModelError("external_data", f"cannot read external data: {err}") from None


def _check_model(model: onnx.ModelProto) -> None:
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelError("bad_onnx", f"ONNX model failed validation: {first_line}") from None


def _input_specs(
    model: onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]],
    limits: ModelLimits,
) -> tuple[TensorSpec, ...]:
    initializers = {init.name for init in model.graph.initializer}
    graph_inputs = [vi for vi in model.graph.input if vi.name not in initializers]
    unknown = set(input_shapes) - {vi.name for vi in graph_inputs}
    if unknown:
        raise ModelError(
            "bad_input_shape",
            f"--input-shape names unknown input(s) {sorted(unknown)}; the model's inputs are "
            f"{[vi.name for vi in graph_inputs]}",
        )
    specs: list[TensorSpec] = []
    for value_info in graph_inputs:
        tensor_type = value_info.type.tensor_type
        if not value_info.type.HasField("tensor_type") or tensor_type.elem_type == 0:
            raise ModelError(
                "bad_input", f"input {value_info.name!r} is not a tensor of a known element type"
            )
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)).name
        declared = list(tensor_type.shape.dim)
        if value_info.name in input_shapes:
            shape = tuple(int(d) for d in input_shapes[value_info.name])
            if len(shape) != len(declared):
                raise ModelError(
                    "bad_input_shape",
                    f"input {value_info.name!r} has rank {len(declared)}, "
                    f"but --input-shape gave {len(shape)} dimensions",
                )
            for dim, value in zip(declared, shape):
                if dim.HasField("dim_value") and dim.dim_value != value:
                    raise ModelError(
                        "bad_input_shape",
                        f"input {value_info.name!r} declares dimension {dim.dim_value}, "
                        f"--input-shape gave {value}",
                    )
        else:
            symbolic = [d.dim_param or "?" for d in declared if not d.HasField("dim_value")]
            if symbolic:
                raise ModelError(
                    "symbolic_shape",
                    f"input {value_info.name!r} has symbolic dimension(s) {symbolic}; give static "
                    f"values with --input-shape {value_info.name}=D0,D1,...",
                )
            shape = tuple(int(d.dim_value) for d in declared)
        specs.append(TensorSpec(value_info.name, shape, dtype))
    check_input_sizes(specs, limits)
    return tuple(specs)


def check_input_sizes(specs: Sequence[TensorSpec], limits: ModelLimits) -> None:
    """Refuse non-positive dimensions and inputs larger than the limits allow."""
    total_bytes = 0
    for spec in specs:
        if any(d <= 0 for d in spec.shape):
            raise ModelError(
                "bad_input_shape", f"input {spec.name!r} has non-positive dimension {spec.shape}"
            )
        if spec.num_elements > limits.max_input_elements:
            raise ModelError(
                "input_too_large",
                f"input {spec.name!r} declares shape {list(spec.shape)} "
                f"({spec.num_elements:.3g} elements), over the limit of "
                f"{limits.max_input_elements} elements",
            )
        total_bytes += spec.num_elements * np.dtype(spec.dtype).itemsize
    if total_bytes > limits.max_total_input_bytes:
        raise ModelError(
            "input_too_large",
            f"inputs need {total_bytes} bytes together, over the limit of "
            f"{limits.max_total_input_bytes}",
        )


def with_static_inputs(model: onnx.ModelProto, specs: Sequence[TensorSpec]) -> onnx.ModelProto:
    """Return a copy of ``model`` whose graph inputs declare exactly ``specs``' shapes.

    A symbol bound this way (an input's ``dim_param``) gets its value in the graph's outputs and
    ``value_info`` too, and any other ``dim_param`` there is cleared (an exporter annotates
    intermediates with the symbols, ``s70 + 1``): left symbolic, they kept shape inference from
    knowing the static shapes of values computed from the input's shape (:mod:`graph_limits`
    then refused an ``arange`` over the sequence as unbounded)."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    by_name = {spec.name: spec for spec in specs}
    bound: dict[str, int] = {}
    for value_info in fixed.graph.input:
        spec = by_name.get(value_info.name)
        if spec is None:
            continue
        dims = value_info.type.tensor_type.shape.dim
        for dim, value in zip(dims, spec.shape):
            if dim.dim_param:
                bound[dim.dim_param] = int(value)
            dim.Clear()
            dim.dim_value = value
    if bound:
        for value_info in [*fixed.graph.output, *fixed.graph.value_info]:
            if not value_info.type.HasField("tensor_type"):
                continue
            for dim in value_info.type.tensor_type.shape.dim:
                if dim.HasField("dim_param"):
                    value = bound.get(dim.dim_param)
                    dim.Clear()
                    if value is not None:
                        dim.dim_value = value
    return fixed


def validate_onnx(
    data: bytes,
    *,
    limits: ModelLimits,
    base_dir: Path | None = None,
    check_ops: Callable[[onnx.ModelProto], None] | None = None,
) -> onnx.ModelProto:
    """Parse and check ONNX bytes (opset, external data, ``onnx.checker``, outputs); the model's
    inputs may still be symbolic (:func:`specialize_onnx` binds them). ``check_ops`` (raising
    for operators that cannot be compiled) runs on the parsed graph before its external data
    is read and before ``onnx.checker``, which refuses operators it has no schema for."""
    model = parse_onnx(data)
    _check_opset(model, limits)
    if check_ops is not None:
        check_ops(model)
    _resolve_external_data(model, base_dir, limits)
    _check_model(model)
    if not model.graph.output:
        raise ModelError("bad_onnx", "ONNX model declares no outputs")
    return model


def onnx_symbolic_dims(
    model: onnx.ModelProto,
) -> tuple[list[SymbolicDim], dict[str, list[int | None]]]:
    """The symbolic dimensions of ``model``'s inputs (symbol: the ``dim_param``, or
    ``INPUT.AXIS`` for an unnamed one) and the declared shape of each input that has one
    (``None`` at its symbolic axes). ONNX declares no range: every symbol is ``1..``."""
    initializers = {init.name for init in model.graph.initializer}
    dims: list[SymbolicDim] = []
    declared: dict[str, list[int | None]] = {}
    for value_info in model.graph.input:
        if value_info.name in initializers:
            continue
        shape = list(value_info.type.tensor_type.shape.dim)
        symbolic = [(axis, d) for axis, d in enumerate(shape) if not d.HasField("dim_value")]
        if not symbolic:
            continue
        declared[value_info.name] = [
            int(d.dim_value) if d.HasField("dim_value") else None for d in shape
        ]
        for axis, dim in symbolic:
            dims.append(
                SymbolicDim(dim.dim_param or f"{value_info.name}.{axis}", value_info.name, axis)
            )
    return dims, declared


def specialize_onnx(
    model: onnx.ModelProto,
    *,
    limits: ModelLimits,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> tuple[onnx.ModelProto, tuple[TensorSpec, ...]]:
    """A copy of a validated ``model`` with ``input_shapes`` bound (static inputs, graph and
    input limits checked), and its input specs."""
    specs = _input_specs(model, input_shapes or {}, limits)
    fixed = with_static_inputs(model, specs)
    if onnx_symbolic_dims(model)[0]:  # bound here: hand TVM the shape values as constants
        fixed = fold_shape_computations(fixed)  # bounded: small values only
    check_graph_limits(fixed, limits)
    return fixed, specs


def load_onnx(
    data: bytes,
    *,
    limits: ModelLimits,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    base_dir: Path | None = None,
) -> tuple[onnx.ModelProto, tuple[TensorSpec, ...]]:
    """Validate ONNX bytes; return the model (static input shapes) and its input specs.

    ``base_dir`` is the folder external data may be read from (``None`` for uploads: refused).
    Raises :class:`ModelError` for every kind of bad input.
    """
    model = validate_onnx(data, limits=limits, base_dir=base_dir)
    return specialize_onnx(model, limits=limits, input_shapes=input_shapes)
