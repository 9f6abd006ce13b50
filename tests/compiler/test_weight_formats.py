"""``--weights q8_0``: a decoder's weights in llama.cpp's 8-bit blocks (issue 32).

- :func:`compiler.weights.weight_formats.q8_0_values` puts a weight on Q8_0's grid, idempotently;
- the shim's GEMM over 8-bit weights (``tunehub_peer_gemm_q8``) computes an on-grid weight as
  numpy does, and any other weight (a float32 model's) exactly as the float32 path does;
- a static-cache decoder compiled with ``q8_0`` is verified against torch running the same
  quantized program, generates torch's tokens, says so in its manifest, its one-row GEMMs are
  the 8-bit kernel, and it keeps no float32 copy of any weight (the GEMMs' weights held as the
  kernel reads them, the embedding gathered from its codes);
- what cannot take the format is refused with a reason (exit 2 on the CLI).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from compiler.compile_options import CPU_DEFAULT
from compiler.errors import ModelError
from compiler.peers.held_weights import HELD_FUNCTIONS, HeldCall, hold_weight
from compiler.weights.weight_formats import FORMAT_VALUES, WEIGHT_FORMATS, q4_0_values, q8_0_values

#: Each quantized format and the shim's GEMM that streams it.
FORMAT_GEMMS = {"q8_0": "tunehub_peer_gemm_q8", "q4_0": "tunehub_peer_gemm_q4"}

REPO = Path(__file__).resolve().parents[2]


def test_q8_0_values_are_on_the_grid_and_idempotent() -> None:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((48, 96)) * 0.05).astype(np.float32)
    w[3, :32] = 0.0  # an all-zero block: scale 0
    q = q8_0_values(w)
    assert q is not None and q.dtype == np.float32 and q.shape == w.shape
    blocks = q.reshape(48, 3, 32)
    scale = (np.abs(w.reshape(48, 3, 32)).max(-1, keepdims=True) / np.float32(127)).astype(
        np.float16
    )
    ints = np.divide(blocks, scale.astype(np.float32), where=scale > 0, out=np.zeros_like(blocks))
    assert np.array_equal(ints, np.rint(ints)) and np.abs(ints).max() == 127
    assert not q[3, :32].any()
    assert np.array_equal(q8_0_values(q), q)  # already on the grid: unchanged
    assert np.abs(q - w).max() <= np.abs(w).max() / 127  # at most half a step of the largest block
    assert q8_0_values(w[:, :40]) is None  # not a whole number of blocks
    w[0, 0] = np.inf
    assert q8_0_values(w) is None


def test_q4_0_values_are_on_the_grid_and_idempotent() -> None:
    """Q4_0: each block is ``q * s``, ``q`` in [-8, 7], ``s = float16(m / -8)`` with ``m`` the
    block's first value of largest magnitude (which becomes ``-8 s``)."""
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((48, 96)) * 0.05).astype(np.float32)
    w[3, :32] = 0.0
    w[5, 32:64] = np.abs(w[5, 32:64])  # a block whose largest value is positive: s < 0
    q = q4_0_values(w)
    assert q is not None and q.dtype == np.float32 and q.shape == w.shape
    blocks, original = q.reshape(48, 3, 32), w.reshape(48, 3, 32)
    largest = np.take_along_axis(original, np.abs(original).argmax(-1)[..., None], -1)
    scale = (largest / np.float32(-8)).astype(np.float16).astype(np.float32)
    ints = np.divide(blocks, scale, where=scale != 0, out=np.zeros_like(blocks))
    assert np.array_equal(ints, np.rint(ints)) and ints.min() == -8 and ints.max() <= 7
    assert not q[3, :32].any() and (q[5, 32:64] >= 0).all()
    assert np.array_equal(q4_0_values(q), q)  # already on the grid: unchanged
    assert q4_0_values(w[:, :40]) is None


def _shim_gemm(symbol: str, a: np.ndarray, b: np.ndarray, trans_b: bool, bias: np.ndarray):
    """``symbol``'s C = A x B + bias; ``B`` is ``[K, N]``, ``[N, K]`` with ``trans_b``, or held
    bytes (``N`` is then the bias's length)."""
    from compiler.peers.library import peer_library

    lib = ctypes.CDLL(str(peer_library().shared), mode=ctypes.RTLD_GLOBAL)
    f = getattr(lib, symbol)
    i64, i32, ptr, f32 = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p, ctypes.c_float
    f.argtypes = [ptr, ptr, ptr, i64, i64, i64, i64, i32, i32, i32, ptr, ptr, f32, f32]
    m, k = a.shape
    n = len(bias)
    c = np.zeros((m, n), np.float32)
    f(a.ctypes.data, b.ctypes.data, c.ctypes.data, 1, m, n, k, int(trans_b), 0, 1,
      bias.ctypes.data, None, f32(-np.inf), f32(np.inf))  # fmt: skip
    return c


@pytest.mark.parametrize("fmt", FORMAT_GEMMS)
@pytest.mark.parametrize(
    "rows,inner,cols",
    [(1, 96, 200), (3, 64, 40), (6, 128, 33), (9, 32, 64), (64, 96, 70), (131, 288, 40)],
)
@pytest.mark.parametrize("trans_b", [False, True])
def test_the_shim_gemm_over_quantized_weights(fmt, rows, inner, cols, trans_b) -> None:
    """On the grid: numpy's product (float64) within float32 rounding, also where one block of
    the input is a thousand times smaller than the rest or all zeros; from 64 rows (each tile
    widened to float32 once, then the packed micro-kernel) exactly the packed float32 GEMM's
    product over the same values. Off the grid: exactly what the float32 path the rows default
    to computes (OpenBLAS for a row, the packed GEMM above)."""
    rng = np.random.default_rng(rows * inner + cols)
    a = rng.standard_normal((rows, inner)).astype(np.float32)
    a[0, :32] *= 1e-3
    a[-1, -32:] = 0.0
    bias = rng.standard_normal(cols).astype(np.float32)
    weight = FORMAT_VALUES[fmt]((rng.standard_normal((cols, inner)) * 0.02).astype(np.float32))
    b = np.ascontiguousarray(weight if trans_b else weight.T)  # [N, K] or [K, N]
    want = a.astype(np.float64) @ weight.T.astype(np.float64) + bias
    got = _shim_gemm(FORMAT_GEMMS[fmt], a, b, trans_b, bias)
    assert np.abs(got - want).max() < 1e-5
    if rows >= 64 and os.environ.get("TUNEHUB_PEERS_ISA") != "none":  # none: packed is BLAS
        assert np.array_equal(got, _shim_gemm("tunehub_peer_gemm_packed", a, b, trans_b, bias))

    off = np.ascontiguousarray(rng.standard_normal(b.shape).astype(np.float32))
    fallback = "tunehub_peer_gemm" if rows == 1 else "tunehub_peer_gemm_packed"
    assert np.array_equal(
        _shim_gemm(FORMAT_GEMMS[fmt], a, off, trans_b, bias),
        _shim_gemm(fallback, a, off, trans_b, bias),
    )

    # Held by the library ahead of time (compiler/peers/held_weights.py): the same bytes the
    # cache holds, so the held entry point computes the very same numbers; off the grid: none.
    call = HeldCall(*HELD_FUNCTIONS[FORMAT_GEMMS[fmt]], 1, inner, cols, trans_b)
    held = hold_weight(b, call)
    assert held is not None and held.dtype == np.int8
    assert np.array_equal(_shim_gemm(call.function, a, held, trans_b, bias), got)
    assert hold_weight(off, call) is None
    assert hold_weight(b.T, call) is None  # not the call's shape


@pytest.mark.parametrize("fmt", FORMAT_GEMMS)
def test_a_value_that_is_not_finite_reaches_the_output(fmt) -> None:
    """An input value that is not finite gives what float32 arithmetic gives: no finite output
    in its row; the other rows are exact."""
    rng = np.random.default_rng(7)
    weight = FORMAT_VALUES[fmt]((rng.standard_normal((40, 64)) * 0.02).astype(np.float32))
    a = rng.standard_normal((3, 64)).astype(np.float32)
    a[1, 3], a[2, 60] = np.nan, np.inf
    want = a[0].astype(np.float64) @ weight.T.astype(np.float64)
    got = _shim_gemm(
        FORMAT_GEMMS[fmt], a, np.ascontiguousarray(weight), True, np.zeros(40, np.float32)
    )
    np.testing.assert_allclose(got[0], want, atol=1e-5)
    assert not np.isfinite(got[1:]).any()


def test_a_weight_format_is_its_own_target_on_the_same_machine() -> None:
    from compiler.target import cpu_target

    plain, q8 = cpu_target(2), cpu_target(2, replace(CPU_DEFAULT, weights="q8_0"))
    assert plain.key != q8.key and "weights q8_0" in q8.describe()
    assert plain.with_weights("q8_0").key == q8.key  # what a worker of one serves
    assert q8.with_weights("as_exported").key == plain.key
    assert q8.compile_options.weights == "q8_0" and plain.compile_options.weights == "as_exported"


def test_the_cli_spells_the_compilers_formats() -> None:
    from service.cli.options import WEIGHT_FORMATS as CLI_FORMATS

    assert CLI_FORMATS == WEIGHT_FORMATS


@pytest.mark.slow
def test_a_decoder_with_8_bit_weights_is_verified_and_generates_torchs_tokens(
    tmp_path, monkeypatch
) -> None:
    import tvm

    import compiler.weights.external
    from compiler.llm.generate import Generator, TorchDecoder, reference_programs
    from compiler.peers import find_peer, gemm_rows, zero_trial_call
    from compiler.prepare import prepare_model
    from compiler.target import cpu_target
    from examples import hf_exports
    from tuner.final_build.finalize import publish_zero_trial

    program = hf_exports.save(hf_exports.static_cache_program("qwen2", 32), tmp_path / "s.pt2")
    target = cpu_target(2, replace(CPU_DEFAULT, weights="q8_0"))
    assert target.key != cpu_target(2).key  # its own jobs and records
    prepared = prepare_model(program, target)
    report = prepared.model.weight_format
    # 7 projections a layer (q, k, v, o, gate, up, down), the embedding and the head; nothing 1-D
    assert report.format == "q8_0" and len(report.names) == 2 * 7 + 2
    assert all(".weight" in name and "norm" not in name for name in report.names)
    assert 0 < report.max_rel_change <= 1 / 254 + 1e-6  # half a step of the block's largest

    # The reference is the quantized program: every quantized weight is on the grid there.
    stored = prepared.model.source.state_dict
    for name in report.names:
        values = stored[name].detach().numpy()
        assert np.array_equal(q8_0_values(values), values), name

    one_row = [
        task.dispatched[0]
        for task in prepared.partition.extracted
        if (call := find_peer(task.dispatched[0])) is not None
        and call.kind == "gemm"
        and gemm_rows(task.dispatched[0], call) == 1
    ]
    assert one_row and {zero_trial_call(t, target).algorithm for t in one_row} == {"q8"}
    # a float32 target keeps OpenBLAS's sgemv for them
    assert {zero_trial_call(t, cpu_target(2)).algorithm for t in one_row} == {""}

    # Its weights beside the library, as a real decoder's (past 1 GiB): params.bin holds the
    # quantized ones in 8 bits (compiler/weights/weight_packing.py), and the artifact runs from
    # them.
    monkeypatch.setattr(compiler.weights.external, "EXTERNAL_BYTES", 0)
    monkeypatch.setattr(compiler.weights.external, "MIN_LIFTED_BYTES", 4096)
    manifest = publish_zero_trial(prepared, tmp_path / "out")
    stored = tvm.runtime.load_param_dict_from_file(str(tmp_path / "out" / "params.bin"))
    # The projections and the head are held as their GEMM reads them (compiler/peers/
    # held_weights.py), every prefill chunk's too (the held bytes of the smallest, under 4 KiB,
    # stay in the library), and the embedding table is gathered from its int8 codes
    # (compiler/weights/quantized_gather.py): no float32 copy of any weight is left.
    held = [a for a in stored.values() if str(a.dtype) == "int8" and len(a.shape) == 1]
    assert len(held) >= 2 * 5 + 1
    state = prepared.model.source.state_dict
    vocabulary = next(v.shape[0] for name, v in state.items() if "embed_tokens" in name)
    assert [a.shape[0] for a in stored.values() if len(a.shape) == 3] == [vocabulary]
    assert not [a.shape for a in stored.values() if str(a.dtype) == "float32"]
    assert not [name for name in stored if str(name).endswith(":codes")]
    stored_bytes = sum(a.numpy().nbytes for a in stored.values())
    assert stored_bytes < manifest["model"]["weights"]["float32_bytes"] / 3
    assert manifest["verification"]["passed"], manifest["verification"]
    assert manifest["generation"]["passed"], manifest["generation"]
    assert manifest["model"]["weights"]["format"] == "q8_0"
    assert (
        manifest["model"]["weights"]["format_bytes"]
        < manifest["model"]["weights"]["float32_bytes"] / 3
    )
    ours = Generator.load(tmp_path / "out")
    torch_reference = TorchDecoder(reference_programs(prepared.model), ours.signature)
    assert (
        ours.generate([5, 9, 2, 7], 12).tokens == torch_reference.generate([5, 9, 2, 7], 12).tokens
    )


def test_what_cannot_take_8_bit_weights_is_refused(tmp_path, example_model) -> None:
    import torch

    from compiler.frontends.loader import load_model
    from compiler.target import resolve_target
    from examples import hf_exports

    narrow = _onnx_matmul(tmp_path / "narrow.onnx", inner=20)  # 20 input features: no block
    with pytest.raises(ModelError) as info:
        load_model(narrow, weights="q8_0")
    assert info.value.code == "bad_weights" and "multiple of 32" in info.value.message

    linear = torch.nn.Linear(64, 32).to(torch.bfloat16)
    bf16 = torch.export.export(linear, (torch.zeros(1, 64, dtype=torch.bfloat16),))
    path = hf_exports.save(bf16, tmp_path / "bf16.pt2")
    with pytest.raises(ModelError) as info:
        load_model(path, weights="q8_0")
    assert info.value.code == "bad_weights" and "bfloat16" in info.value.message

    with pytest.raises(ModelError) as info:
        resolve_target("cuda", weights="q8_0")
    assert info.value.code == "bad_weights"

    with pytest.raises(ModelError) as info:
        load_model(path, weights="q4_k")
    assert info.value.code == "bad_weights"

    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "compile", str(narrow), "--weights", "q8_0",
         "-o", str(tmp_path / "out")],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--weights q8_0 cannot apply to this model" in done.stderr
    assert not (tmp_path / "out").exists()


def _onnx_matmul(path: Path, inner: int, outer: int = 10) -> Path:
    """An ONNX model of one MatMul, ``[1, inner] x [inner, outer]`` with a random weight."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(0).standard_normal((inner, outer)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, inner])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, outer])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


@pytest.mark.parametrize(("fmt", "algorithm"), [("q8_0", "q8"), ("q4_0", "q4")])
def test_an_onnx_model_takes_quantized_weights_along_each_matmuls_reduction(
    tmp_path, example_model, monkeypatch, fmt, algorithm
) -> None:
    """The MLP (784 -> 512 -> 256 -> 10, ONNX): the weights of its last two layers (512 and 256
    input features) go on the format's grid along their input features, whatever form the
    exporter gave them (``Gemm`` with ``transB`` or ``MatMul``); the first (784) keeps its
    values. ONNX Runtime verifies the library against the same quantized model, and the
    zero-trial build streams the quantized ones in the format."""
    import tvm
    from onnx import numpy_helper

    import compiler.weights.external
    from compiler.peers import find_peer, gemm_rows, zero_trial_call
    from compiler.prepare import prepare_model
    from compiler.target import cpu_target
    from tuner.final_build.finalize import publish_zero_trial

    target = cpu_target(2, replace(CPU_DEFAULT, weights=fmt))
    prepared = prepare_model(example_model("mlp", "onnx"), target)
    report = prepared.model.weight_format
    assert report.format == fmt and len(report.names) == 2
    assert report.values == 512 * 256 + 256 * 10
    proto = prepared.model.source
    trans_b = {
        node.input[1]: any(a.name == "transB" and a.i for a in node.attribute)
        for node in proto.graph.node
        if node.op_type in ("Gemm", "MatMul")
    }
    for tensor in proto.graph.initializer:
        if tensor.name in report.names:
            values = numpy_helper.to_array(tensor)
            along_inputs = values if trans_b[tensor.name] else values.T
            on_grid = FORMAT_VALUES[fmt](np.ascontiguousarray(along_inputs))
            assert np.array_equal(on_grid, along_inputs)

    gemms = [
        task.dispatched[0]
        for task in prepared.partition.extracted
        if (call := find_peer(task.dispatched[0])) is not None and call.kind == "gemm"
    ]
    assert all(gemm_rows(t, find_peer(t)) == 1 for t in gemms)
    assert {zero_trial_call(t, target).algorithm for t in gemms} == {algorithm}
    # Beside the library (as a real decoder's weights, past 1 GiB), params.bin holds the two
    # quantized weights as the library holds them, in the format's bytes the GEMM reads
    # (compiler/peers/held_weights.py), not in float32; the first layer's as it was.
    monkeypatch.setattr(compiler.weights.external, "EXTERNAL_BYTES", 0)
    monkeypatch.setattr(compiler.weights.external, "MIN_LIFTED_BYTES", 4096)
    manifest = publish_zero_trial(prepared, tmp_path / "out")
    stored = tvm.runtime.load_param_dict_from_file(str(tmp_path / "out" / "params.bin"))
    held = [a for a in stored.values() if str(a.dtype) == "int8"]
    per_weight = {"q8_0": 1 + 2 / 32, "q4_0": 0.5 + 2 / 32}[fmt]
    assert sorted(a.shape[0] for a in held) == [
        64 + int(per_weight * 32 * -(-n // 32) * k) for n, k in ((10, 256), (256, 512))
    ]
    shapes = {tuple(a.shape) for a in stored.values() if str(a.dtype) == "float32"}
    assert shapes & {(784, 512), (512, 784)}
    assert not shapes & {(512, 256), (256, 512), (256, 10), (10, 256)}
    assert not any(str(name).endswith(":codes") for name in stored)
    assert manifest["verification"]["passed"], manifest["verification"]
    assert manifest["model"]["weights"]["format"] == fmt
