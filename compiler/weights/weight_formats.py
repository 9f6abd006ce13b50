"""Weight formats chosen at compile time: a model's weights as exported, or in 8 or 4 bits.

A decode step reads every weight once, so its speed is the weights' bytes. ``q8_0`` is
llama.cpp's Q8_0 format: each run of 32 weights along a matrix's reduction axis is an int8
vector times one float16 scale, ``float16(max|w| / 127)``, 1.0625 bytes a weight against 4.
``q4_0`` is its Q4_0: 32 weights of 4 bits (``q`` in [-8, 7]) times ``float16(m / -8)``, ``m``
the run's value of largest magnitude, 0.5625 bytes a weight.

How it is applied, and why that keeps verification honest:

1. At load (:func:`apply_weight_format` for ``.pt2``, :func:`apply_onnx_weight_format` for
   ONNX, called by :func:`compiler.frontends.loader.load_model`), every float32 weight matrix (a
   ``.pt2`` program's 2-D parameter whose last axis, the input features of a ``torch.nn.Linear``, is
   a multiple of 32; an ONNX ``MatMul``'s or ``Gemm``'s weight initializer, along its reduction
   axis) is replaced in place by its values in the format (:func:`q8_0_values`,
   :func:`q4_0_values`): quantized and dequantized. The model that is imported, tuned, and
   verified against (torch runs the same program; ONNX Runtime the same ``ModelProto``) is the
   quantized model, so the reference is exact for it, and :class:`WeightFormatReport` records
   how far the weights moved.
2. In the library, the shim's GEMM over 8-bit (4-bit) weights (``algorithm`` ``q8`` / ``q4``,
   ``compiler/peers/shim_q8.inc`` / ``shim_q4.inc``) recognizes a weight whose values are all on
   that grid and holds it in the format, so a decode step streams a quarter (an eighth) of the
   bytes. The check is exact (``q * scale == w`` for every weight), so it never changes a
   result beyond the order of a sum.
3. The library holds such a weight in the format only: the build replaces each constant weight
   of those GEMMs by the shim's own bytes for it (:mod:`compiler.peers.held_weights`), which
   the GEMM reads as they are, and an embedding table is gathered from its int8 codes and
   float16 scales (:mod:`compiler.weights.quantized_gather`): no float32 copy is left. Beside the
   library (``params.bin``, a model past 1 GiB of weights: :mod:`compiler.weights.external`) those
   are written as they are, and any other float32 weight on the grid in the format
   (:mod:`compiler.weights.weight_packing`), read back as the same float32 values.

Raises :class:`compiler.errors.ModelError` (``bad_weights``) for a format the model cannot take.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.errors import ModelError

#: The weight formats a compile can ask for: ``as_exported`` (the program's own weights),
#: ``q8_0`` and ``q4_0`` (see the module docstring).
WEIGHT_FORMATS = ("as_exported", "q8_0", "q4_0")
#: Weights a Q8_0 (or Q4_0) scale covers, along the reduction axis.
Q8_BLOCK = 32
#: Bytes a weight takes in Q8_0 (an int8, and a float16 scale per :data:`Q8_BLOCK`).
Q8_BYTES_PER_WEIGHT = 1 + 2 / Q8_BLOCK
#: Bytes a weight takes in Q4_0 (4 bits, and a float16 scale per :data:`Q8_BLOCK`).
Q4_BYTES_PER_WEIGHT = 0.5 + 2 / Q8_BLOCK


def check_weight_format(name: str) -> str:
    """``name`` when it is one of :data:`WEIGHT_FORMATS`; raises ``ModelError("bad_weights")``."""
    if name not in WEIGHT_FORMATS:
        raise ModelError(
            "bad_weights",
            f"unknown weight format {name!r}: choose one of {', '.join(WEIGHT_FORMATS)}",
        )
    return name


def q8_0_values(weight: np.ndarray) -> np.ndarray | None:
    """``weight`` (float32, last axis a multiple of :data:`Q8_BLOCK`) on Q8_0's grid: each block
    of 32 along the last axis becomes ``q * s`` with ``s = float16(max|w| / 127)`` and
    ``q = clip(rint(w / s), -127, 127)`` (``q = 0`` where ``s`` is 0). Idempotent: values already
    on the grid come back unchanged. ``None`` when the weight cannot take the format (a value
    that is not finite, a scale past float16's range)."""
    return _on_grid(weight, "q8_0")


def q4_0_values(weight: np.ndarray) -> np.ndarray | None:
    """``weight`` on llama.cpp's Q4_0 grid, as :func:`q8_0_values` on Q8_0's: each block of 32
    along the last axis becomes ``q * s`` with ``m`` its first value of largest magnitude,
    ``s = float16(m / -8)`` and ``q = clip(rint(w / s), -8, 7)`` (``m`` becomes ``-8 s``, so the
    block keeps its scale when quantized again: idempotent). ``None`` when the weight cannot
    take the format."""
    return _on_grid(weight, "q4_0")


def _absmax_over_127(blocks: np.ndarray, axis: int) -> np.ndarray:
    return np.abs(blocks).max(axis=axis, keepdims=True) / 127


def _first_largest_over_minus_8(blocks: np.ndarray, axis: int) -> np.ndarray:
    first_largest = np.expand_dims(np.abs(blocks).argmax(axis=axis), axis)
    return np.take_along_axis(blocks, first_largest, axis=axis) / np.float32(-8)


#: Each quantized format's grid: a block's scale (before float16; of the blocks and the axis of
#: their 32 values) and the codes' range.
_GRIDS: dict[str, tuple[Callable[[np.ndarray, int], np.ndarray], int, int]] = {
    "q8_0": (_absmax_over_127, -127, 127),
    "q4_0": (_first_largest_over_minus_8, -8, 7),
}
#: ``x + _ROUNDER - _ROUNDER`` in float32 is ``rint(x)`` (to nearest, ties to even) for
#: ``|x| < 2**22``, several times faster than ``np.rint`` on float32.
_ROUNDER = np.float32(1.5 * 2**23)


def _on_grid(weight: np.ndarray, fmt: str) -> np.ndarray | None:
    """``weight`` quantized in ``fmt`` and dequantized (:func:`format_codes`)."""
    found = format_codes(weight, fmt)
    return None if found is None else grid_values(*found).reshape(weight.shape)


def block_shape(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    """``shape`` with its axis ``axis`` (a multiple of :data:`Q8_BLOCK`) split into
    ``(blocks, 32)``; ``axis`` is non-negative."""
    return (*shape[:axis], shape[axis] // Q8_BLOCK, Q8_BLOCK, *shape[axis + 1 :])


def format_codes(
    weight: np.ndarray, fmt: str, axis: int = -1
) -> tuple[np.ndarray, np.ndarray] | None:
    """``weight`` quantized in ``fmt`` (``q8_0``, ``q4_0``) by blocks of :data:`Q8_BLOCK` along
    its axis ``axis``: the codes ``q = clip(rint(w / s), lo, hi)`` (float32, the weight's shape
    with that axis split into ``(K / 32, 32)``: :func:`block_shape`; ``q = 0`` where ``s`` is 0)
    and the scales ``s`` (float16, the same with 1 for 32), the format's scale of each block
    rounded to float16. ``None`` for a weight that is not float32, not a whole number of blocks
    along the axis, or not finite, and for a scale past float16's range. Whether ``weight`` was
    on the grid is the caller's check: ``grid_values(q, s)`` equals it."""
    scale_of, lo, hi = _GRIDS[fmt]
    axis = axis % weight.ndim if weight.ndim else 0
    if (
        weight.dtype != np.float32
        or weight.ndim == 0
        or weight.shape[axis] % Q8_BLOCK
        or not np.isfinite(weight).all()
    ):
        return None
    blocks = weight.reshape(block_shape(weight.shape, axis))
    with np.errstate(over="ignore"):
        half = scale_of(blocks, axis + 1).astype(np.float32).astype(np.float16)
    if not np.isfinite(half).all():
        return None
    scale = half.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = blocks / scale  # |ratio| <= 128 where the scale is not 0 (the rounder's range)
        ratio += _ROUNDER
        ratio -= _ROUNDER
        q = np.where(scale != 0, np.clip(ratio, lo, hi), np.float32(0))
    return q.astype(np.float32, copy=False), half


def grid_values(q: np.ndarray, half_scales: np.ndarray) -> np.ndarray:
    """The float32 values of codes ``q`` (blocks of 32: :func:`format_codes`'s shape; any
    integer or float dtype) times their float16 scales (broadcast over each block), as
    :func:`q8_0_values` computes them: each product is exact in float32 (at most 8 significant
    bits of ``q`` times 11 of a float16), so the same codes and scales always give the same
    bits."""
    return q.astype(np.float32) * half_scales.astype(np.float32)


#: Each quantized format's values function and bytes a weight.
FORMAT_VALUES = {"q8_0": q8_0_values, "q4_0": q4_0_values}
FORMAT_BYTES_PER_WEIGHT = {"q8_0": Q8_BYTES_PER_WEIGHT, "q4_0": Q4_BYTES_PER_WEIGHT}


@dataclass(frozen=True)
class WeightFormatReport:
    """What :func:`apply_weight_format` did: the format, the weights it quantized (``names``,
    their count of values), the bytes they take in float32 and in the format, and the largest
    change of a weight (absolute, and relative to that tensor's largest magnitude)."""

    format: str
    names: tuple[str, ...]
    values: int
    float32_bytes: int
    format_bytes: int
    max_abs_change: float
    max_rel_change: float

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "tensors": len(self.names),
            "values": self.values,
            "float32_bytes": self.float32_bytes,
            "format_bytes": self.format_bytes,
            "max_abs_change": self.max_abs_change,
            "max_rel_change": self.max_rel_change,
            "stored_as": "in the format only, in the library or in params.bin (weights kept "
            "beside it) and in memory: a GEMM's weight as the GEMM reads it, an embedding table "
            "as int8 codes and float16 scales; any other weight on the grid as float32 in "
            "memory, in the format in params.bin",
        }


@dataclass
class _Quantized:
    """What an ``apply_*`` function has quantized so far: the figures of its report."""

    names: list[str] = field(default_factory=list)
    values: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0

    def add(self, name: str, original: np.ndarray, quantized: np.ndarray) -> None:
        """Count how far ``original`` moved; a name seen before (an archive's programs each
        hold their own copy of a weight) is counted once in ``names`` and ``values``."""
        change = float(np.abs(quantized - original).max(initial=0.0))
        peak = float(np.abs(original).max(initial=0.0))
        self.max_abs = max(self.max_abs, change)
        self.max_rel = max(self.max_rel, change / peak if peak else 0.0)
        if name not in self.names:
            self.names.append(name)
            self.values += original.size

    def report(self, fmt: str) -> WeightFormatReport:
        return WeightFormatReport(
            format=fmt,
            names=tuple(self.names),
            values=self.values,
            float32_bytes=4 * self.values,
            format_bytes=int(self.values * FORMAT_BYTES_PER_WEIGHT[fmt]),
            max_abs_change=self.max_abs,
            max_rel_change=self.max_rel,
        )


def apply_weight_format(programs: Iterable[Any], fmt: str) -> WeightFormatReport | None:
    """Apply ``fmt`` to the weights of ``programs`` (``torch.export`` programs, in place; a
    weight they share is changed once, and a weight of the same name in several programs is
    reported once). ``as_exported`` changes nothing (``None``). Raises
    ``ModelError("bad_weights")`` for an unknown format, weights that are not float32, or a
    program with no weight matrix to quantize."""
    if check_weight_format(fmt) == "as_exported":
        return None
    import torch  # noqa: PLC0415 - .pt2 only

    seen: set[int] = set()
    done = _Quantized()
    others: set[str] = set()
    for program in programs:
        for name, tensor in _parameters(program):
            if id(tensor) in seen or tensor.ndim != 2:
                continue
            seen.add(id(tensor))
            if tensor.dtype != torch.float32:
                others.add(str(tensor.dtype).removeprefix("torch."))
                continue
            original = tensor.detach().cpu().numpy()
            quantized = FORMAT_VALUES[fmt](original)
            if quantized is None:
                continue
            done.add(name, original, quantized)  # before the copy: ``original`` is its memory
            with torch.no_grad():
                tensor.copy_(torch.from_numpy(quantized))
    if not done.names:
        why = (
            f"its weight matrices are {', '.join(sorted(others))}, and {fmt} quantizes float32 "
            "weights (export the model in float32)"
            if others
            else "it has no float32 weight matrix whose input features are a multiple of "
            f"{Q8_BLOCK}"
        )
        raise ModelError("bad_weights", f"--weights {fmt} cannot apply to this model: {why}")
    return done.report(fmt)


def apply_onnx_weight_format(proto: Any, fmt: str) -> WeightFormatReport | None:
    """Apply ``fmt`` to the weight matrices of an ONNX model (``onnx.ModelProto``, in place):
    every float32 2-D initializer that is the weight ``B`` of a ``MatMul`` or ``Gemm``, quantized
    along its reduction axis (``B``'s first axis, its last for ``Gemm`` with ``transB``), where
    that axis is a multiple of :data:`Q8_BLOCK`. An initializer that is a ``B`` along both axes
    is left as exported. The model's reference (ONNX Runtime on ``proto``) then runs the same
    quantized weights. ``as_exported`` changes nothing (``None``). Raises
    ``ModelError("bad_weights")`` for an unknown format or a model with no weight to quantize."""
    if check_weight_format(fmt) == "as_exported":
        return None
    from onnx import numpy_helper  # noqa: PLC0415 - ONNX only

    initializers = {t.name: t for t in proto.graph.initializer}
    axes: dict[str, set[int]] = {}
    for node in proto.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        trans_b = node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute)
        axes.setdefault(node.input[1], set()).add(1 if trans_b else 0)
    done = _Quantized()
    for name, reduction in axes.items():
        tensor = initializers.get(name)
        if tensor is None or len(tensor.dims) != 2 or len(reduction) != 1:
            continue
        original = numpy_helper.to_array(tensor)
        if original.dtype != np.float32:
            continue
        along_last = original if reduction == {1} else original.T
        quantized = FORMAT_VALUES[fmt](np.ascontiguousarray(along_last))
        if quantized is None:
            continue
        if reduction == {0}:
            quantized = quantized.T
        done.add(name, original, quantized)
        tensor.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(quantized), name))
    if not done.names:
        raise ModelError(
            "bad_weights",
            f"--weights {fmt} cannot apply to this model: it has no float32 MatMul or Gemm "
            f"weight whose input features are a multiple of {Q8_BLOCK}",
        )
    return done.report(fmt)


def _parameters(program: Any) -> list[tuple[str, Any]]:
    """A ``torch.export`` program's parameters (name, tensor), in its signature's order."""
    from torch.export.graph_signature import InputKind  # noqa: PLC0415 - .pt2 only

    stored = program.state_dict
    return [
        (spec.target, stored[spec.target])
        for spec in program.graph_signature.input_specs
        if spec.kind == InputKind.PARAMETER and spec.target in stored
    ]
