"""Weights on an 8- or 4-bit grid, held in that format in ``params.bin`` (issue 32).

A model compiled with ``--weights q8_0`` (``q4_0``) carries float32 weights whose values lie on
the format's grid (:mod:`compiler.weights.weight_formats`: each block of 32 along the reduction axis
is ``q * s``, ``s`` one float16 scale). Where such a weight is kept beside the library
(:mod:`compiler.weights.external`), :func:`pack` holds it in the format: its codes (int8 for
``q8_0``; two 4-bit codes a byte for ``q4_0``) and its float16 scales, 1.0625 (0.5625) bytes a
weight against 4. :meth:`PackedWeight.values` gives back the same float32 values (signed zeros come
back as ``+0.0``), so the library computes exactly what it computed before it was written.

Packing is lossless by construction: a weight is packed only when its values equal the
dequantized codes, which is checked on the whole array; any other array stays as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.weights.weight_formats import Q8_BLOCK, block_shape, format_codes, grid_values

#: The formats :func:`pack` tries, smallest first (a weight on Q4_0's grid is stored in 4 bits).
PACKED_FORMATS = ("q4_0", "q8_0")


@dataclass(frozen=True)
class PackedWeight:
    """A float32 weight held in ``fmt`` by blocks of 32 along its axis ``axis``: ``codes`` are
    int8 in the weight's shape for ``q8_0``; for ``q4_0`` uint8 with that axis halved (codes
    ``q + 8``: of the axis's element ``2j`` in the low nibble of byte ``j``, of ``2j + 1`` in the
    high one); ``scales`` are float16 in the weight's shape with that axis divided by 32."""

    fmt: str
    axis: int
    codes: np.ndarray
    scales: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.codes.nbytes + self.scales.nbytes)

    def values(self) -> np.ndarray:
        """The float32 weight (equal to the one packed)."""
        q = self.codes
        if self.fmt == "q4_0":
            low = (q & 0x0F).astype(np.int8) - 8
            high = (q >> 4).astype(np.int8) - 8
            q = np.stack([low, high], axis=self.axis + 1)
            q = q.reshape(*low.shape[: self.axis], -1, *low.shape[self.axis + 1 :])
        shape = q.shape
        blocks = q.reshape(block_shape(shape, self.axis))
        scales = np.expand_dims(self.scales, self.axis + 1)
        return grid_values(blocks, scales).reshape(shape)


def pack(weight: np.ndarray) -> PackedWeight | None:
    """``weight`` held in the first of :data:`PACKED_FORMATS` whose grid it lies on, by blocks
    along its last axis or else its first; ``None`` for a weight on no grid (or not float32).
    The check is exact over the whole array, after one line of values along the axis, which
    rejects most weights cheaply."""
    if weight.dtype != np.float32 or weight.ndim == 0 or weight.size == 0:
        return None
    axes = [weight.ndim - 1] + ([0] if weight.ndim > 1 else [])
    for axis in axes:
        if weight.shape[axis] % Q8_BLOCK:
            continue
        line = weight[(0,) * axis + (slice(None),) + (0,) * (weight.ndim - axis - 1)]
        for fmt in PACKED_FORMATS:
            if grid_codes(np.ascontiguousarray(line), fmt, 0) is None:
                continue
            found = grid_codes(weight, fmt, axis)
            if found is not None:
                q, scales = found
                return PackedWeight(fmt, axis, _encode(q, fmt, axis), scales)
    return None


#: Values quantized at a time (a chunk of lines): buffers that stay small and are reused, where
#: whole-array temporaries of a 0.5 GB weight cost more in page faults than in arithmetic.
CHUNK_VALUES = 1 << 20


def grid_codes(weight: np.ndarray, fmt: str, axis: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``weight``'s int8 codes (its shape) and float16 scales (``axis`` divided by 32) in
    ``fmt`` by blocks along ``axis`` (its first or last) when its values equal their
    dequantized values, else ``None``; computed :data:`CHUNK_VALUES` at a time."""
    count = weight.shape[axis]
    last = axis == weight.ndim - 1
    lines = weight.reshape(-1, count) if last else weight.reshape(count, -1)
    codes = np.empty(lines.shape, np.int8)
    scales = np.empty(
        (lines.shape[0], count // Q8_BLOCK) if last else (count // Q8_BLOCK, lines.shape[1]),
        np.float16,
    )
    others = lines.shape[0] if last else lines.shape[1]
    step = max(1, CHUNK_VALUES // count)
    for start in range(0, others, step):
        part = np.s_[start : start + step, :] if last else np.s_[:, start : start + step]
        chunk = lines[part]
        found = format_codes(chunk, fmt, 1 if last else 0)
        if found is None:
            return None
        q, half = found
        if not np.array_equal(grid_values(q, half).reshape(chunk.shape), chunk):
            return None
        codes[part] = q.reshape(chunk.shape)
        scales[part] = np.squeeze(half, 2 if last else 1)
    scale_shape = list(weight.shape)
    scale_shape[axis] //= Q8_BLOCK
    return codes.reshape(weight.shape), scales.reshape(scale_shape)


def _encode(q: np.ndarray, fmt: str, axis: int) -> np.ndarray:
    """Int8 codes ``q`` as stored (:class:`PackedWeight`)."""
    if fmt == "q8_0":
        return q
    unsigned = (q + 8).astype(np.uint8)
    even = (slice(None),) * axis + (slice(0, None, 2),)
    odd = (slice(None),) * axis + (slice(1, None, 2),)
    return np.ascontiguousarray(unsigned[even] | (unsigned[odd] << 4))
