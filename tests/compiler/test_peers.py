"""Library peers (issue 21): a GEMM or NHWC convolution task computed by OpenBLAS behind the
shim, with the task's TIR epilogue; the zero-trial build; the artifact that links the library.

Real TVM builds and OpenBLAS calls on small one-operator ONNX models (seeded weights); every
peer is checked against the task's own (naive) TIR on the same random arguments."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

from compiler.build import build_zero_trial, export_library
from compiler.compile_options import LEGACY
from compiler.importer import normalize
from compiler.partition import partition
from compiler.peers import (
    find_peer,
    load_peers,
    peer_library,
    peer_task_module,
    peers_supported,
)
from compiler.target import cpu_target

pytestmark = pytest.mark.skipif(peer_library() is None, reason="no peer library on this machine")

RNG = np.random.default_rng(0)
REPO = Path(__file__).resolve().parents[2]


def _weight(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    return numpy_helper.from_array(RNG.standard_normal(shape).astype("float32") * 0.1, name)


def conv_model(cin: int, cout: int, size: int, kernel: int, stride: int, pad: int,
               dilation: int = 1, groups: int = 1) -> onnx.ModelProto:
    """Conv (+ bias) → Relu, NCHW as ONNX has it (the compile path turns it NHWC)."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[kernel, kernel],
                              strides=[stride, stride], pads=[pad] * 4,
                              dilations=[dilation, dilation], group=groups),
             helper.make_node("Relu", ["c"], ["y"])]
    out = (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                      [1, cin, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, out, out])],
        [_weight("w", (cout, cin // groups, kernel, kernel)), _weight("b", (cout,))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def gemm_model(rows: int, inner: int, cols: int, batch: int = 0) -> onnx.ModelProto:
    """MatMul with a weight (+ bias) → Relu, or (``batch``) a batched MatMul of two inputs."""
    if batch:
        inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [batch, rows, inner]),
                  helper.make_tensor_value_info("b", TensorProto.FLOAT, [batch, inner, cols])]
        nodes = [helper.make_node("MatMul", ["a", "b"], ["y"])]
        weights = []
    else:
        inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [rows, inner])]
        nodes = [helper.make_node("MatMul", ["a", "w"], ["m"]),
                 helper.make_node("Add", ["m", "bias"], ["s"]),
                 helper.make_node("Relu", ["s"], ["y"])]
        weights = [_weight("w", (inner, cols)), _weight("bias", (cols,))]
    out = [batch, rows, cols] if batch else [rows, cols]
    graph = helper.make_graph(nodes, "gemm", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
                              weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _partition(proto: onnx.ModelProto, target=None):
    from tvm.relax.frontend.onnx import from_onnx

    return partition(normalize(from_onnx(proto, keep_params_in_input=False)),
                     target or cpu_target(2))


def _check_peer(task_mod: tvm.IRModule, target) -> None:
    """The peer and the task's naive TIR agree on the same random arguments."""
    load_peers()  # the peer built here calls the shim's symbols: they must be in the process
    peer = peer_task_module(task_mod)
    assert peer is not None and "tirx.is_scheduled" in peer["main"].attrs
    shapes = [(tuple(int(d) for d in p.shape), str(p.dtype)) for p in task_mod["main"].params]
    args = [RNG.standard_normal(s).astype(d) for s, d in shapes]
    outs = []
    for mod in (task_mod, peer):
        tensors = [tvm.runtime.tensor(a) for a in args]
        tvm.tirx.build(mod, target=target.tvm_target())(*tensors)
        outs.append(tensors[-1].numpy())
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("label", "proto", "kind"),
    [
        ("conv3x3 pad1", conv_model(16, 32, 12, 3, 1, 1), "conv2d_nhwc"),
        ("conv3x3 stride2", conv_model(8, 16, 13, 3, 2, 1), "conv2d_nhwc"),
        ("conv7x7 stride2 rgb", conv_model(3, 16, 20, 7, 2, 3), "conv2d_nhwc"),
        ("conv3x3 dilation2", conv_model(8, 8, 12, 3, 1, 2, dilation=2), "conv2d_nhwc"),
        ("conv1x1", conv_model(16, 24, 7, 1, 1, 0), "conv2d_nhwc"),
        ("conv1x1 stride2", conv_model(16, 24, 8, 1, 2, 0), "conv2d_nhwc"),
        ("dense", gemm_model(24, 40, 56), "gemm"),
        ("gemv", gemm_model(1, 40, 200), "gemm"),
        ("few rows", gemm_model(5, 40, 200), "gemm"),
        ("batch matmul", gemm_model(6, 10, 7, batch=3), "gemm"),
    ],
)
def test_peer_matches_the_task(label, proto, kind):
    target = cpu_target(2)
    parts = _partition(proto, target)
    found = [(t, e.dispatched[0]) for t, e in zip(parts.tasks, parts.extracted)
             if find_peer(e.dispatched[0]) is not None]
    assert [find_peer(m).kind for _, m in found] == [kind], label
    _check_peer(found[0][1], target)


def test_operators_the_library_does_not_cover_have_no_peer():
    depthwise = _partition(conv_model(8, 8, 10, 3, 1, 1, groups=8))
    assert all(find_peer(e.dispatched[0]) is None for e in depthwise.extracted)
    legacy = cpu_target(2, LEGACY)  # NCHW convolutions, the path records were tuned on before
    assert not peers_supported(legacy)
    nchw = _partition(conv_model(8, 8, 10, 3, 1, 1), legacy)
    assert all(find_peer(e.dispatched[0]) is None for e in nchw.extracted)


def _zero_trial_library(proto: onnx.ModelProto, folder: Path) -> tuple[Path, frozenset[str]]:
    from tvm.relax.frontend.onnx import from_onnx

    target = cpu_target(2)
    mod = normalize(from_onnx(proto, keep_params_in_input=False))
    parts = partition(mod, target)
    executable, keys = build_zero_trial(
        mod, target, [(t.key, e.dispatched[0]) for t, e in zip(parts.tasks, parts.extracted)])
    return export_library(executable, folder / "model.so", link_peers=bool(keys)), keys


FRESH_PROCESS = """
import sys, numpy as np, tvm
from tvm import relax
vm = relax.VirtualMachine(tvm.runtime.load_module(sys.argv[1]), tvm.cpu())
x = np.load(sys.argv[2])
print(repr(vm["main"](tvm.runtime.tensor(x)).numpy().tolist()))
"""


def test_zero_trial_artifact_runs_in_a_fresh_process(tmp_path):
    """The artifact links the shim and OpenBLAS: a process with nothing but the TVM runtime
    loads and runs it (no peer library loaded, no TuneHub import) and matches ONNX Runtime."""
    import onnxruntime as ort

    proto = conv_model(8, 16, 12, 3, 1, 1)
    library, keys = _zero_trial_library(proto, tmp_path)
    assert len(keys) == 1
    needed = subprocess.run(["ldd", str(library)], capture_output=True, text=True).stdout
    assert "openblas" in needed
    x = RNG.standard_normal((1, 8, 12, 12)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(library),
                           str(tmp_path / "x.npy")], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = np.array(eval(done.stdout.strip().splitlines()[-1]), dtype="float32")  # noqa: S307
    (ref,) = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("peers_env", ["1", "0"])
def test_compile_without_a_database_is_the_zero_trial_build(tmp_path, peers_env):
    """``tunehub compile`` with no database: peers (or, with ``TUNEHUB_PEERS=0``, none, and the
    manifest says why) plus default schedules; verified either way."""
    model = tmp_path / "gemm.onnx"
    onnx.save(gemm_model(32, 64, 48), model)
    env = {**os.environ, "TUNEHUB_PEERS": peers_env}
    done = subprocess.run([sys.executable, "-m", "service.cli", "compile", str(model), "-o",
                           str(tmp_path / "out"), "--json"], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert summary["verification"]["passed"] and manifest["zero_trial"] is True
    if peers_env == "1":
        assert len(manifest["peers"]["tasks"]) == 1
        assert manifest["peers"]["runtime_library"]["library"] == "openblas"
    else:
        assert manifest["peers"] is None and "TUNEHUB_PEERS=0" in manifest["peers_skipped"]
