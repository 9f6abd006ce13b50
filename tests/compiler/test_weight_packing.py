"""``params.bin`` holds weights on an 8- or 4-bit grid in that format
(compiler/weights/weight_packing.py):

- a weight on Q8_0's (Q4_0's) grid along its last axis, or its first (an ONNX ``MatMul``'s
  ``B``), is packed in the format and read back as the same values;
- anything else (a float32 model's weight, a grid weight moved by one ulp, integers) stays as it
  is;
- ``save_params``/``load_params`` round-trip a mix of both, in order, and the file is the
  format's size.

The end-to-end case (a decoder compiled with ``--weights q8_0`` whose weights live in
``params.bin``) is in tests/compiler/test_weight_formats.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from compiler.weights.external import load_params, save_params
from compiler.weights.weight_formats import (
    Q4_BYTES_PER_WEIGHT,
    Q8_BYTES_PER_WEIGHT,
    q4_0_values,
    q8_0_values,
)
from compiler.weights.weight_packing import pack

RNG = np.random.default_rng(7)


def _random(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize(
    ("fmt", "values", "bytes_per_weight"),
    [("q8_0", q8_0_values, Q8_BYTES_PER_WEIGHT), ("q4_0", q4_0_values, Q4_BYTES_PER_WEIGHT)],
)
def test_a_grid_weight_is_packed_along_its_blocks_axis(fmt, values, bytes_per_weight) -> None:
    along_last = values(_random(48, 96))
    packed = pack(along_last)
    assert packed is not None and (packed.fmt, packed.axis) == (fmt, 1)
    assert np.array_equal(packed.values(), along_last)
    assert packed.nbytes == along_last.size * bytes_per_weight
    # An ONNX MatMul's B is [K, N]: its blocks run along the first axis.
    along_first = np.ascontiguousarray(values(_random(80, 64)).T)
    packed = pack(along_first)
    assert packed is not None and (packed.fmt, packed.axis) == (fmt, 0)
    restored = packed.values()
    assert restored.shape == along_first.shape and np.array_equal(restored, along_first)


def test_what_is_not_on_a_grid_stays_as_it_is() -> None:
    assert pack(_random(32, 64)) is None  # a float32 model's weight
    on_grid = q8_0_values(_random(32, 64))
    nudged = on_grid.copy()
    nudged[-1, -1] = np.nextafter(nudged[-1, -1], np.float32(np.inf))  # the last row only
    assert pack(nudged) is None
    assert pack(q8_0_values(_random(32, 64)).astype(np.float64)) is None
    assert pack(np.arange(64, dtype=np.int32)) is None
    assert pack(_random(30, 30)) is None  # no axis of whole blocks


def test_a_q4_weight_is_held_in_4_bits_and_signed_zeros_come_back_as_zeros() -> None:
    weight = q4_0_values(_random(16, 64))
    weight[0, :32] = -0.0
    packed = pack(weight)
    assert packed is not None and packed.fmt == "q4_0"  # on both grids: the smaller wins
    assert np.array_equal(packed.values(), weight)


def test_params_round_trip_in_order_and_take_the_formats_bytes(tmp_path) -> None:
    arrays = [
        q8_0_values(_random(256, 512)),
        _random(256, 512),
        q4_0_values(_random(512, 256)),
        np.ascontiguousarray(q8_0_values(_random(128, 256)).T),
        RNG.integers(0, 100, (64, 64)).astype(np.int64),
    ]
    path = tmp_path / "params.bin"
    save_params(tuple(tvm.runtime.tensor(a) for a in arrays), path)
    loaded = load_params(path, tvm.cpu())
    assert len(loaded) == len(arrays)
    for got, want in zip(loaded, arrays, strict=True):
        assert got.dtype == str(want.dtype) and np.array_equal(got.numpy(), want)
    plain = tmp_path / "plain.bin"
    tvm.runtime.save_param_dict_to_file(
        {f"p{i}": tvm.runtime.tensor(a) for i, a in enumerate(arrays)}, str(plain)
    )
    # Each packed array saves 4 bytes a weight less its format's bytes (headers aside).
    saved = plain.stat().st_size - path.stat().st_size
    expected = (256 * 512 + 128 * 256) * (4 - Q8_BYTES_PER_WEIGHT) + 512 * 256 * (
        4 - Q4_BYTES_PER_WEIGHT
    )
    assert saved == pytest.approx(expected, rel=0.01)
