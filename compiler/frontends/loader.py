"""One entry point for user model files: detect the format, validate, load.

``load_model`` accepts an ONNX file or a ``.pt2`` archive (``torch.export.save``), as bytes (an
upload) or a path (the CLI), and promises a :class:`LoadedModel` whose inputs are all static and
within :class:`ModelLimits` (a model with symbolic dimensions: one static specialization per shape
bucket, :mod:`compiler.shapes.buckets`; a ``.pt2`` archive packaged with several programs, such as a
decoder's prefill and decode: one static function per program, ``LoadedModel.programs``). Every bad
input raises :class:`ModelError` with a user-facing message. No code from the file is executed:
``.pt2`` archives go through :mod:`compiler.frontends.pt2_safety` first.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from compiler.errors import ModelError, UnsupportedOperatorsError
from compiler.frontends.model_spec import Bucket, LoadedModel, ModelFormat, ModelLimits
from compiler.frontends.onnx_loader import onnx_symbolic_dims, specialize_onnx, validate_onnx
from compiler.shapes.buckets import (
    BucketSpec,
    ShapeBuckets,
    SymbolicDim,
    bucket_input_shapes,
    function_name,
    resolve_buckets,
)
from compiler.weights.weight_formats import (
    apply_onnx_weight_format,
    apply_weight_format,
    check_weight_format,
)

ZIP_MAGIC = b"PK\x03\x04"


def detect_format(data: bytes) -> ModelFormat:
    """Return ``"pt2"`` for a zip archive, else ``"onnx"`` (protobuf has no magic number)."""
    if not data:
        raise ModelError("empty", "the model file is empty")
    return "pt2" if data.startswith(ZIP_MAGIC) else "onnx"


def read_model_file(path: Path, limits: ModelLimits) -> bytes:
    """Read a model file from disk, refusing files over the size limit before reading them."""
    try:
        size = path.stat().st_size
    except OSError as err:
        raise ModelError(
            "not_found", f"cannot read model file {str(path)!r}: {err.strerror}"
        ) from None
    if not path.is_file():
        raise ModelError("not_found", f"{str(path)!r} is not a file")
    if size > limits.max_bytes:
        raise ModelError(
            "too_large", f"model file is {size} bytes, over the limit of {limits.max_bytes} bytes"
        )
    return path.read_bytes()


def _load_programs(data: bytes, limits: ModelLimits, display_name: str) -> dict[str, Any]:
    """The archive's ``ExportedProgram`` s by name (one, ``model``, unless it was packaged with
    other names or several; at most ``limits.max_programs``), each within the graph limits."""
    from compiler.frontends.pt2_loader import check_pt2_graph_limits  # noqa: PLC0415 - torch, .pt2 only
    from compiler.frontends.pt2_safety import load_exported_programs  # noqa: PLC0415 - torch, for .pt2 files only

    fd, name = tempfile.mkstemp(suffix=".pt2", prefix="tunehub-upload-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        programs = load_exported_programs(
            Path(name),
            max_uncompressed_bytes=2 * limits.max_bytes,
            max_programs=limits.max_programs,
            display_name=display_name,
        )
    finally:
        os.unlink(name)
    for program in programs.values():
        check_pt2_graph_limits(program, limits)
    return programs


def _several_programs(
    programs: Mapping[str, Any],
    limits: ModelLimits,
    sha256: str,
    size: int,
    input_shapes: Mapping[str, Sequence[int]],
    buckets: Mapping[str, BucketSpec],
    display_name: str,
) -> LoadedModel:
    """A multi-program archive as one model with a function per program (``LoadedModel.programs``,
    one :class:`Bucket` each, no symbol values). Refused (``ModelError``): options that bind
    symbolic dimensions (each program must be exported with static shapes), a program name that
    is not an identifier, a program with symbolic dimensions, and two programs that take the same
    input shapes (the library dispatches on them)."""
    from compiler.frontends.pt2_loader import pt2_input_specs, pt2_symbolic_dims  # noqa: PLC0415 - torch, .pt2 only

    names = ", ".join(programs)
    if input_shapes or buckets:
        raise ModelError(
            "bad_input_shape",
            f"{display_name} holds several programs ({names}); --input-shape and --buckets "
            "apply to a single program: export each program with static shapes instead",
        )
    from compiler.llm.last_logits import keeps_last_logits  # noqa: PLC0415 - torch, .pt2 only
    from compiler.llm.state import program_state  # noqa: PLC0415 - torch, .pt2 only

    functions: list[Bucket] = []
    seen: dict[tuple[tuple[int, ...], ...], str] = {}
    states: dict[str, tuple] = {}
    for name, program in programs.items():
        if not name.isidentifier():
            raise ModelError(
                "bad_pt2", f"{display_name}: program name {name!r} is not an identifier"
            )
        dims, _ = pt2_symbolic_dims(program)
        if dims:
            raise ModelError(
                "symbolic_shape",
                f"{display_name}: program {name!r} has symbolic dimensions "
                f"({', '.join(sorted({d.symbol for d in dims}))}); a multi-program archive takes "
                "programs exported with static shapes",
            )
        specs, bindings = pt2_input_specs(program, {}, limits)
        shapes = tuple(spec.shape for spec in specs)
        if shapes in seen:
            raise ModelError(
                "bad_pt2",
                f"{display_name}: programs {seen[shapes]!r} and {name!r} take the same input "
                "shapes; the compiled library picks a program by its inputs' shapes",
            )
        seen[shapes] = name
        states[name] = program_state(program)
        model = LoadedModel(
            "pt2",
            sha256,
            size,
            specs,
            program,
            bindings,
            state=states[name],
            last_logits=bool(states[name]) and keeps_last_logits(program),
        )
        functions.append(Bucket(name, (), model))
    if len({tuple(states[n]) for n in states}) > 1:
        raise ModelError(
            "bad_pt2",
            f"{display_name}: its programs keep different state ("
            + "; ".join(f"{n}: {', '.join(s.name for s in v) or 'none'}" for n, v in states.items())
            + "); the programs of one decoder share one KV cache: export them from one model "
            "with the same cache",
        )
    first = functions[0].model
    return replace(first, buckets=tuple(functions), programs=tuple(programs))


def _refuse_ops(proto: Any) -> None:
    """Refuse, naming them, the operators TVM's ONNX importer lacks, before the checker (which
    knows no ONNX Runtime contrib operator: ``GroupQueryAttention``,
    ``SimplifiedLayerNormalization`` of ONNX Runtime GenAI's model builder) and the shape
    buckets (a model TVM cannot import is not worth specializing)."""
    from compiler.frontends.importer import unsupported_onnx_ops  # noqa: PLC0415 - TVM's frontend

    missing = unsupported_onnx_ops(proto)
    if missing:
        error = UnsupportedOperatorsError(missing, "ONNX")
        if any(op.startswith("com.microsoft::") for op in missing):
            error.message += (
                " (ONNX Runtime contrib operators, as ONNX Runtime GenAI's model builder writes "
                "them; TuneHub compiles standard ONNX operators: export the decoder with "
                "optimum-onnx or torch.onnx.export instead)"
            )
            error.args = (error.message,)
        raise error


def _pinned_symbols(
    dims: Sequence[SymbolicDim], input_shapes: Mapping[str, Sequence[int]]
) -> dict[str, int]:
    """The symbols ``--input-shape`` binds: those of the inputs it gives (a rank mismatch is
    left for the loaders' own checks, which name it)."""
    pinned: dict[str, int] = {}
    for dim in dims:
        shape = input_shapes.get(dim.input)
        if shape is not None and dim.axis < len(shape):
            pinned.setdefault(dim.symbol, int(shape[dim.axis]))
    return pinned


def _specializations(
    dims: Sequence[SymbolicDim],
    declared: Mapping[str, Sequence[int | None]],
    input_shapes: Mapping[str, Sequence[int]],
    buckets: Mapping[str, BucketSpec],
) -> tuple[ShapeBuckets | None, list[tuple[tuple[tuple[str, int], ...], dict]]]:
    """The buckets (``None``: every symbol pinned or none declared) and, per specialization,
    its symbol values and the full ``input_shapes`` to load it with."""
    pinned = _pinned_symbols(dims, input_shapes)
    spec = resolve_buckets(dims, buckets, pinned)
    if spec is None:
        return None, [((), dict(input_shapes))]
    free = [d for d in dims if d.input not in input_shapes]
    out = []
    for values in spec.specializations():
        shapes = bucket_input_shapes(free, declared, {**pinned, **dict(values)})
        out.append((values, {**input_shapes, **shapes}))
    return spec, out


def _bucketed(
    models: list[tuple[tuple[tuple[str, int], ...], LoadedModel]],
    spec: ShapeBuckets | None,
    dims: Sequence[SymbolicDim],
    dynamic_source: Any,
) -> LoadedModel:
    """One model, or the largest specialization carrying every bucket, the bucketed symbols'
    dimensions and the symbolic source (see ``LoadedModel``)."""
    if spec is None:
        return models[0][1]
    buckets = tuple(Bucket(function_name(values), values, model) for values, model in models)
    bucketed = {symbol for symbol, _ in spec.values}
    return replace(
        models[-1][1],
        buckets=buckets,
        bucket_spec=spec,
        symbolic_dims=tuple(d for d in dims if d.symbol in bucketed),
        dynamic_source=dynamic_source,
    )


def load_model(
    source: bytes | Path,
    *,
    limits: ModelLimits | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    buckets: Mapping[str, BucketSpec] | None = None,
    expected_format: ModelFormat | None = None,
    allow_external_data: bool = True,
    display_name: str | None = None,
    weights: str = "as_exported",
) -> LoadedModel:
    """Validate and load a model from bytes (upload) or a path (local file).

    ``input_shapes`` gives static values for symbolic input dimensions (input name → shape).
    Symbols it does not bind are compiled as shape buckets (:mod:`compiler.shapes.buckets`):
    ``buckets`` gives their values by symbol (a symbol given none gets the defaults), and the
    model returned carries one static specialization per bucket (``LoadedModel.buckets``).
    ``expected_format`` makes a mismatch between a declared and the detected format an error.
    ``allow_external_data``: an ONNX file loaded from a path may keep weights in files of its own
    folder; ``False`` (every upload: its folder is the service's staging area) refuses external
    data whatever it names, as bytes always do. ``display_name`` is how messages name the file
    (default: the path's file name, or ``<upload>`` for bytes), so a server's temp names never
    reach a user. ``weights``: a format of :data:`compiler.weights.weight_formats.WEIGHT_FORMATS`,
    applied to the model's weight matrices as it loads (the model returned then carries its
    ``weight_format`` report).
    """
    limits = limits or ModelLimits()
    check_weight_format(weights)
    base_dir: Path | None = None
    if isinstance(source, Path):
        data = read_model_file(source, limits)
        base_dir = source.parent if allow_external_data else None
        display_name = display_name or source.name
    else:
        data = bytes(source)
        if len(data) > limits.max_bytes:
            raise ModelError(
                "too_large",
                f"model file is {len(data)} bytes, over the limit of {limits.max_bytes} bytes",
            )
    fmt = detect_format(data)
    if expected_format is not None and expected_format != fmt:
        raise ModelError(
            "wrong_format", f"the file was declared as {expected_format} but its content is {fmt}"
        )
    sha256 = hashlib.sha256(data).hexdigest()
    shapes = dict(input_shapes or {})
    wanted = dict(buckets or {})
    loaded: list[tuple[tuple[tuple[str, int], ...], LoadedModel]] = []
    if fmt == "onnx":
        from compiler.llm.past_present import (  # noqa: PLC0415
            bucket_plan,
            complete_shapes,
            past_present_layout,
        )

        proto = validate_onnx(data, limits=limits, base_dir=base_dir, check_ops=_refuse_ops)
        onnx_report = apply_onnx_weight_format(proto, weights)
        dims, declared = onnx_symbolic_dims(proto)
        layout = past_present_layout(proto)  # past/present decoder: mask = past + seq
        if layout is not None:
            dims, wanted = bucket_plan(layout, dims, wanted)
        spec, plans = _specializations(dims, declared, shapes, wanted)
        for values, bucket_shapes in plans:
            if layout is not None:
                bucket_shapes = complete_shapes(layout, bucket_shapes)
            model, specs = specialize_onnx(proto, limits=limits, input_shapes=bucket_shapes)
            one = LoadedModel("onnx", sha256, len(data), specs, model, values, past_present=layout)
            loaded.append((values, replace(one, weight_format=onnx_report)))
        return _bucketed(loaded, spec, dims, proto)
    from compiler.frontends.pt2_loader import pt2_input_specs, pt2_symbolic_dims  # noqa: PLC0415 - torch, .pt2 only
    from compiler.llm.last_logits import keeps_last_logits  # noqa: PLC0415 - torch, .pt2 only
    from compiler.llm.state import DECODER_BUCKETS, program_state  # noqa: PLC0415 - torch, .pt2 only

    programs = _load_programs(data, limits, display_name or "<upload>")
    report = apply_weight_format(programs.values(), weights)
    if len(programs) > 1:
        several = _several_programs(
            programs, limits, sha256, len(data), shapes, wanted, display_name or "<upload>"
        )
        return replace(several, weight_format=report)
    (program,) = programs.values()
    state = program_state(program)
    last_logits = bool(state) and keeps_last_logits(program)
    dims, declared = pt2_symbolic_dims(program)
    if state:  # a decoder's token count: a decode step (1) and prefill chunks, by default
        capacity = min(spec.capacity for spec in state)  # a chunk never outgrows the cache
        for dim in dims:
            if not {dim.symbol, dim.alias} & set(wanted) and dim.input not in shapes:
                top = min(dim.maximum or max(DECODER_BUCKETS), capacity)
                wanted[dim.symbol] = [v for v in DECODER_BUCKETS if dim.minimum <= v <= top]
    spec, plans = _specializations(dims, declared, shapes, wanted)
    for values, bucket_shapes in plans:
        specs, bindings = pt2_input_specs(program, bucket_shapes, limits)
        model = LoadedModel(
            "pt2", sha256, len(data), specs, program, bindings, state=state, last_logits=last_logits
        )
        loaded.append((values, model))
    return replace(_bucketed(loaded, spec, dims, program), weight_format=report)
