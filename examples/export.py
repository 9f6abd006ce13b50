"""Export the example networks to ONNX and to ``.pt2`` (``torch.export.save``).

Contracts shared by every function here:

* Shapes are static: the shapes of ``EXAMPLES[name].inputs`` (batch 1), no dynamic dims.
* Weights are the registry's deterministic ones; batch-norm is kept as a separate op (the
  compiler folds it later).
* Writes are atomic: the bytes go to a temporary file in the destination's directory, are
  flushed and fsynced, given mode 0644, then ``os.replace``d onto the destination. A failed
  export leaves no partial file behind (an older file at the destination is kept as it was).
* Repeated exports of a network give byte-identical files (checked by the tests for the MLP).
* An ONNX file is self-contained (weights inline, no ``.onnx.data`` side file), opset
  ``ONNX_OPSET``, inputs named after the ``InputSpec`` names and one output named ``output``.

Exporter choice: torch's default (dynamo, ``torch.export``-based) ONNX exporter, opset 18.
It handles all five networks; the legacy TorchScript exporter is deprecated in torch 2.13 and
fuses Conv+BatchNorm whenever it constant-folds in eval mode. The dynamo exporter's own
``optimize=True`` pass also fuses Conv+BatchNorm (onnxscript's ``fuse_batchnorm`` rewrite rule),
while ``optimize=False`` leaves ``Shape``/``Expand``/``CastLike`` clutter around every bias-free
conv. So we export with ``optimize=False`` and run only onnxscript's constant folding and
dead-node removal: a clean graph that still contains ``BatchNormalization``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import BinaryIO

import onnx
import onnxscript.ir.passes.common as ir_passes
import onnxscript.optimizer
import torch
from onnxscript import ir

from examples.networks import EXAMPLES, ExampleSpec, get_example

ONNX_OPSET = 18
"""ONNX opset of exported models: the dynamo exporter's native opset in torch 2.13 (no version
conversion pass), and >= 17 so LayerNormalization is one op; GELU is expressed with Erf."""

FORMATS: dict[str, str] = {"onnx": ".onnx", "pt2": ".pt2"}
"""Supported export formats and the file suffix ``export_all`` gives each."""

ONNX_OUTPUT_NAME = "output"

_FILE_MODE = 0o644


def _atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> Path:
    """Call ``write`` on a temp file next to ``path``, then atomically move it onto ``path``.

    The parent directory is created if missing. On any exception the temp file is removed and
    the exception propagates; ``path`` is then untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), _FILE_MODE)  # mkstemp creates 0600
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path


def _tidy_onnx(model: ir.Model) -> None:
    """Constant-fold and drop dead nodes in place, without onnxscript's fusion rewrite rules.

    Folding removes the shape-computation clutter of the unoptimised dynamo export; fusions
    (notably Conv+BatchNorm) are deliberately not applied.
    """
    onnxscript.optimizer.fold_constants_ir(model)
    ir_passes.RemoveUnusedNodesPass()(model)
    ir_passes.LiftConstantsToInitializersPass(lift_all_constants=False, size_limit=0)(model)


def to_exported_program(name: str) -> torch.export.ExportedProgram:
    """``torch.export.export`` of example ``name`` on its seed-0 inputs (static shapes).

    Raises ``KeyError`` for an unknown name.
    """
    spec = get_example(name)
    return torch.export.export(spec.build(), spec.make_inputs(seed=0))


def onnx_from_program(
    program: torch.export.ExportedProgram,
    args: tuple,
    *,
    input_names: list[str],
    output_names: list[str],
    opset: int = ONNX_OPSET,
) -> onnx.ModelProto:
    """Translate ``program`` (exported on ``args``) with torch's dynamo exporter to a checked
    ONNX model (constants as initializers, no optimizer passes); ``program`` is not modified."""
    with torch.no_grad():
        onnx_program = torch.onnx.export(
            program,
            args,
            dynamo=True,
            opset_version=opset,
            optimize=False,
            input_names=input_names,
            output_names=output_names,
            verbose=False,
        )
    assert onnx_program is not None  # dynamo=True without f= always returns the ONNXProgram
    _tidy_onnx(onnx_program.model)
    proto = ir.serde.serialize_model(onnx_program.model)
    onnx.checker.check_model(proto)
    return proto


def _onnx_from_program(
    program: torch.export.ExportedProgram, spec: ExampleSpec, opset: int
) -> onnx.ModelProto:
    """``program`` (an export of ``spec``) as a checked ONNX model."""
    return onnx_from_program(
        program,
        spec.make_inputs(seed=0),
        input_names=[i.name for i in spec.inputs],
        output_names=[ONNX_OUTPUT_NAME],
        opset=opset,
    )


def to_onnx_proto(name: str, opset: int = ONNX_OPSET) -> onnx.ModelProto:
    """The ONNX model of example ``name`` in memory (weights inline), as ``export_onnx`` writes it.

    Raises ``KeyError`` for an unknown name.
    """
    return _onnx_from_program(to_exported_program(name), get_example(name), opset)


def _write_onnx(proto: onnx.ModelProto, path: Path) -> Path:
    return _atomic_write(path, lambda f: f.write(proto.SerializeToString()))


def _write_pt2(program: torch.export.ExportedProgram, path: Path) -> Path:
    return _atomic_write(path, lambda f: torch.export.save(program, f))


def export_onnx(name: str, path: str | os.PathLike[str], opset: int = ONNX_OPSET) -> Path:
    """Export example ``name`` to one self-contained ONNX file at ``path``; returns ``path``.

    Static shapes, weights inline, ``onnx.checker``-valid. Raises ``KeyError`` for an unknown
    name; the file is written atomically.
    """
    return _write_onnx(to_onnx_proto(name, opset), Path(path))


def export_pt2(name: str, path: str | os.PathLike[str]) -> Path:
    """Export example ``name`` with ``torch.export`` and ``torch.export.save`` it to ``path``.

    The file loads back with ``torch.export.load`` without the model class. Static shapes.
    Raises ``KeyError`` for an unknown name; the file is written atomically; returns ``path``.
    """
    return _write_pt2(to_exported_program(name), Path(path))


def export_all(
    out_dir: str | os.PathLike[str],
    names: Iterable[str] | None = None,
    formats: Sequence[str] = ("onnx", "pt2"),
) -> list[Path]:
    """Export each named example (all of ``EXAMPLES`` if ``names`` is None) in each format.

    Files are ``out_dir/<name><suffix>`` with the suffixes of ``FORMATS``, the same content
    ``export_onnx`` / ``export_pt2`` write (one ``torch.export`` per network is shared by both
    formats). The returned paths are in name-major, format-minor order. Names and formats are
    validated before anything is written (``KeyError`` / ``ValueError``).
    """
    specs = [get_example(name) for name in (EXAMPLES if names is None else names)]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ValueError(f"unknown formats {unknown}; known: {sorted(FORMATS)}")
    out = Path(out_dir)
    written: list[Path] = []
    for spec in specs:
        program = to_exported_program(spec.name)
        for fmt in formats:
            path = out / f"{spec.name}{FORMATS[fmt]}"
            if fmt == "onnx":
                written.append(_write_onnx(_onnx_from_program(program, spec, ONNX_OPSET), path))
            else:
                written.append(_write_pt2(program, path))
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: ``python -m examples.export OUT_DIR [--names N ...] [--formats onnx pt2]``."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.export", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "out_dir", type=Path, help="directory to write the files into (created if missing)"
    )
    parser.add_argument(
        "--names", nargs="+", choices=sorted(EXAMPLES), help="examples to export (default: all)"
    )
    parser.add_argument("--formats", nargs="+", choices=sorted(FORMATS), default=["onnx", "pt2"])
    args = parser.parse_args(argv)
    # The dynamo exporter logs a warning per export about torchvision ops it cannot register.
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    for path in export_all(args.out_dir, args.names, args.formats):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
