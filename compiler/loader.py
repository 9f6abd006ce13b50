"""One entry point for user model files: detect the format, validate, load.

``load_model`` accepts an ONNX file or a ``.pt2`` archive (``torch.export.save``), as bytes (an
upload) or a path (the CLI), and promises a :class:`LoadedModel` whose inputs are all static and
within :class:`ModelLimits`. Every bad input raises :class:`ModelError` with a user-facing message.
No code from the file is executed: ``.pt2`` archives go through :mod:`compiler.pt2_safety` first.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from compiler.errors import ModelError
from compiler.model_spec import LoadedModel, ModelFormat, ModelLimits
from compiler.onnx_loader import load_onnx

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


def _load_pt2(
    data: bytes, limits: ModelLimits, input_shapes: Mapping[str, Sequence[int]], display_name: str
):
    from compiler.pt2_loader import check_pt2_graph_limits, pt2_input_specs  # noqa: PLC0415 - torch, .pt2 only
    from compiler.pt2_safety import load_exported_program  # noqa: PLC0415 - torch, for .pt2 files only

    fd, name = tempfile.mkstemp(suffix=".pt2", prefix="tunehub-upload-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        program = load_exported_program(
            Path(name), max_uncompressed_bytes=2 * limits.max_bytes, display_name=display_name
        )
    finally:
        os.unlink(name)
    specs, bindings = pt2_input_specs(program, input_shapes, limits)
    check_pt2_graph_limits(program, limits)
    return program, specs, bindings


def load_model(
    source: bytes | Path,
    *,
    limits: ModelLimits | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    expected_format: ModelFormat | None = None,
    allow_external_data: bool = True,
    display_name: str | None = None,
) -> LoadedModel:
    """Validate and load a model from bytes (upload) or a path (local file).

    ``input_shapes`` gives static values for symbolic input dimensions (input name → shape).
    ``expected_format`` makes a mismatch between a declared and the detected format an error.
    ``allow_external_data``: an ONNX file loaded from a path may keep weights in files of its own
    folder; ``False`` (every upload: its folder is the service's staging area) refuses external
    data whatever it names, as bytes always do. ``display_name`` is how messages name the file
    (default: the path's file name, or ``<upload>`` for bytes), so a server's temp names never
    reach a user.
    """
    limits = limits or ModelLimits()
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
    if fmt == "onnx":
        model, specs = load_onnx(data, limits=limits, input_shapes=shapes, base_dir=base_dir)
        return LoadedModel("onnx", sha256, len(data), specs, model)
    program, specs, bindings = _load_pt2(data, limits, shapes, display_name or "<upload>")
    return LoadedModel("pt2", sha256, len(data), specs, program, bindings)
