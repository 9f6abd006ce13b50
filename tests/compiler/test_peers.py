"""Library peers (issue 21): a GEMM or NHWC convolution task computed by OpenBLAS behind the
shim, with the task's TIR epilogue; the zero-trial build; the artifact that links the library.

Real TVM builds and OpenBLAS calls on small one-operator ONNX models (seeded weights); every
peer is checked against the task's own (naive) TIR on the same random arguments."""

from __future__ import annotations

import dataclasses
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

from compiler.build.builder import build_zero_trial, export_library
from compiler.compile_options import LEGACY
from compiler.frontends.importer import normalize
from compiler.partition import partition
from compiler.peers import (
    find_peer,
    load_peers,
    peer_library,
    peer_task_module,
    peer_variants,
    peers_supported,
)
from compiler.peers.library import onednn_available, onednn_unavailable_reason
from compiler.target import cpu_target

pytestmark = pytest.mark.skipif(peer_library() is None, reason="no peer library on this machine")
#: The oneDNN variant every convolution has where the peer library was built against oneDNN
#: (a dependency of TuneHub on x86-64 Linux, so everywhere the suite runs by ``make test``).
ONEDNN = ["onednn"] if onednn_available() else []
#: The default of a convolution Winograd does not take: oneDNN's where the library has it.
DIRECT = "onednn" if ONEDNN else "packed"
needs_onednn = pytest.mark.skipif(
    not onednn_available(), reason=f"no oneDNN peers: {onednn_unavailable_reason()}"
)

RNG = np.random.default_rng(0)
REPO = Path(__file__).resolve().parents[2]


def _weight(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    return numpy_helper.from_array(RNG.standard_normal(shape).astype("float32") * 0.1, name)


def conv_model(
    cin: int,
    cout: int,
    size: int,
    kernel: int,
    stride: int,
    pad: int,
    dilation: int = 1,
    groups: int = 1,
    batch: int = 1,
) -> onnx.ModelProto:
    """Conv (+ bias) → Relu, NCHW as ONNX has it (the compile path turns it NHWC)."""
    nodes = [
        helper.make_node(
            "Conv",
            ["x", "w", "b"],
            ["c"],
            kernel_shape=[kernel, kernel],
            strides=[stride, stride],
            pads=[pad] * 4,
            dilations=[dilation, dilation],
            group=groups,
        ),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    out = (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, cin, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, cout, out, out])],
        [_weight("w", (cout, cin // groups, kernel, kernel)), _weight("b", (cout,))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def gemm_model(rows: int, inner: int, cols: int, batch: int = 0) -> onnx.ModelProto:
    """MatMul with a weight (+ bias) → Relu, or (``batch``) a batched MatMul of two inputs."""
    if batch:
        inputs = [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [batch, rows, inner]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [batch, inner, cols]),
        ]
        nodes = [helper.make_node("MatMul", ["a", "b"], ["y"])]
        weights = []
    else:
        inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [rows, inner])]
        nodes = [
            helper.make_node("MatMul", ["a", "w"], ["m"]),
            helper.make_node("Add", ["m", "bias"], ["s"]),
            helper.make_node("Relu", ["s"], ["y"]),
        ]
        weights = [_weight("w", (inner, cols)), _weight("bias", (cols,))]
    out = [batch, rows, cols] if batch else [rows, cols]
    graph = helper.make_graph(
        nodes, "gemm", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], weights
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _partition(proto: onnx.ModelProto, target=None):
    from tvm.relax.frontend.onnx import from_onnx

    return partition(
        normalize(from_onnx(proto, keep_params_in_input=False)), target or cpu_target(2)
    )


#: Max abs error allowed for F(4x4, 3x3) Winograd, relative to the output's largest magnitude:
#: its transforms hold coefficients up to 8 and 1/24, and on these standard-normal arguments it
#: measured 1.8e-6 .. 3.0e-6 of the output's magnitude (im2col and F(2x2, 3x3): 2e-7 .. 5e-7,
#: well inside the fixed 1e-4 of the other peers).
WINOGRAD_F4_ERROR = 1e-5


def _random_args(task_mod: tvm.IRModule) -> list[np.ndarray]:
    shapes = [(tuple(int(d) for d in p.shape), str(p.dtype)) for p in task_mod["main"].params]
    return [RNG.standard_normal(s).astype(d) for s, d in shapes]


def _run(mod: tvm.IRModule, args: list[np.ndarray], target) -> np.ndarray:
    tensors = [tvm.runtime.tensor(a) for a in args]
    tvm.tirx.build(mod, target=target.tvm_target())(*tensors)
    return tensors[-1].numpy()


def _check_peer(task_mod: tvm.IRModule, target, call=None) -> None:
    """The peer (``call``: one of its variants; default: :func:`find_peer`'s) and the task's
    naive TIR agree on the same random arguments."""
    load_peers()  # the peer built here calls the shim's symbols: they must be in the process
    peer = peer_task_module(task_mod, call=call)
    assert peer is not None and "tirx.is_scheduled" in peer["main"].attrs
    args = _random_args(task_mod)
    ref, out = _run(task_mod, args, target), _run(peer, args, target)
    algorithm = (call or find_peer(task_mod)).algorithm
    atol = WINOGRAD_F4_ERROR * np.abs(ref).max() if algorithm == "winograd_f4" else 1e-4
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=atol)


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
        ("depthwise 3x3", conv_model(32, 32, 12, 3, 1, 1, groups=32), "depthwise_conv2d_nhwc"),
        (
            "depthwise 3x3 stride2, channels past a vector",
            conv_model(72, 72, 13, 3, 2, 1, groups=72),
            "depthwise_conv2d_nhwc",
        ),
        (
            "depthwise 5x5 dilation2, 20 channels",
            conv_model(20, 20, 11, 5, 1, 4, dilation=2, groups=20),
            "depthwise_conv2d_nhwc",
        ),
        (
            "depthwise batch 2, unpadded",
            conv_model(16, 16, 9, 3, 1, 0, groups=16, batch=2),
            "depthwise_conv2d_nhwc",
        ),
    ],
)
def test_peer_matches_the_task(label, proto, kind):
    target = cpu_target(2)
    parts = _partition(proto, target)
    found = [
        (t, e.dispatched[0])
        for t, e in zip(parts.tasks, parts.extracted)
        if find_peer(e.dispatched[0]) is not None
    ]
    assert [find_peer(m).kind for _, m in found] == [kind], label
    _check_peer(found[0][1], target)


def epilogue_model(tail: str, kind: str = "conv", channels: int = 16) -> onnx.ModelProto:
    """A 3x3 convolution (``channels`` -> ``channels``, 10x10, + bias; ``kind="depthwise"``:
    one group a channel) or a GEMM (24x40 x 40x40, + bias) whose output ``a`` goes through
    ``tail``: ``residual relu6``
    (``+ x``, then Clip(0, 6)), ``sigmoid`` (a step the shim's epilogue does not have) or
    ``reuse`` (``relu(a) * a``: the bias-added buffer is read after the ReLU)."""
    gemm = kind == "gemm"
    shape = [24, 40] if gemm else [1, channels, 10, 10]
    if gemm:
        nodes = [
            helper.make_node("MatMul", ["x", "w"], ["m"]),
            helper.make_node("Add", ["m", "b"], ["a"]),
        ]
        weights = [_weight("w", (40, 40)), _weight("b", (40,))]
    else:
        groups = channels if kind == "depthwise" else 1
        nodes = [
            helper.make_node(
                "Conv", ["x", "w", "b"], ["a"], kernel_shape=[3, 3], pads=[1] * 4, group=groups
            )
        ]
        weights = [_weight("w", (channels, channels // groups, 3, 3)), _weight("b", (channels,))]
    if tail == "residual relu6":
        nodes += [
            helper.make_node("Add", ["a", "x"], ["s"]),
            helper.make_node("Clip", ["s", "lo", "hi"], ["y"]),
        ]
        weights += [
            numpy_helper.from_array(np.array(0.0, "float32"), "lo"),
            numpy_helper.from_array(np.array(6.0, "float32"), "hi"),
        ]
    elif tail == "sigmoid":
        nodes += [helper.make_node("Sigmoid", ["a"], ["y"])]
    else:
        nodes += [
            helper.make_node("Relu", ["a"], ["r"]),
            helper.make_node("Mul", ["r", "a"], ["y"]),
        ]
    graph = helper.make_graph(
        nodes,
        "epilogue",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    ("kind", "tail", "channels", "epilogue"),
    [
        ("conv", "residual relu6", 16, ("bias", "residual", "max 0", "min 6")),
        ("depthwise", "residual relu6", 16, ("bias", "residual", "max 0", "min 6")),
        ("depthwise", "residual relu6", 72, ("bias", "residual", "max 0", "min 6")),
        ("gemm", "residual relu6", 16, ("bias", "residual", "max 0", "min 6")),
        ("conv", "sigmoid", 16, ("bias",)),
        ("gemm", "reuse", 16, ("bias",)),
    ],
)
def test_the_call_does_the_epilogue_it_can(kind, tail, channels, epilogue):
    """The peer call applies the task's bias, residual add and clamp as it stores its output
    (the shim's epilogue); a step it does not have (a sigmoid), or a buffer read again after
    the run (``relu(a) * a``), ends the run there and the rest stays TIR. Every variant agrees
    with the task's TIR."""
    target = cpu_target(2)
    task = _conv_task(epilogue_model(tail, kind, channels), target)
    call = find_peer(task)
    assert call.epilogue == epilogue
    assert call.to_json()["epilogue"] == list(epilogue)
    script = peer_task_module(task, call=call)["main"].script().splitlines()
    blocks = [
        line
        for line in script
        if line.strip().startswith("with T.sblock(") and '"root"' not in line
    ]
    # the call's block, then what stays TIR (one loop: its blocks are inlined into the last)
    assert len(blocks) == (1 if tail == "residual relu6" else 2)
    for variant in peer_variants(task):
        assert variant.epilogue == epilogue
        _check_peer(task, target, variant)


def _conv_task(proto: onnx.ModelProto, target) -> tvm.IRModule:
    parts = _partition(proto, target)
    (task,) = [e.dispatched[0] for e in parts.extracted if find_peer(e.dispatched[0])]
    return task


@pytest.mark.parametrize(
    ("label", "proto", "default"),
    [
        ("12x12", conv_model(64, 64, 12, 3, 1, 1), "winograd_f2"),
        ("24x24", conv_model(64, 64, 24, 3, 1, 1), "winograd_f4"),
        ("13x13 partial tiles", conv_model(64, 72, 13, 3, 1, 1), "winograd_f2"),
        ("26x26 partial tiles", conv_model(64, 64, 26, 3, 1, 1), "winograd_f4"),
        ("few channels", conv_model(8, 24, 24, 3, 1, 1), DIRECT),
        ("unpadded, channels not a multiple of 8", conv_model(12, 20, 12, 3, 1, 0), DIRECT),
        ("7x7", conv_model(64, 64, 7, 3, 1, 1), DIRECT),
        ("batch 3, pad 2", conv_model(64, 64, 13, 3, 1, 2, batch=3), "winograd_f2"),
    ],
)
def test_every_conv_variant_matches_the_task(label, proto, default):
    """A 3x3 stride-1 convolution has five variants (im2col on the packed-weight GEMM or on
    OpenBLAS, Winograd F(2x2) and F(4x4), oneDNN's), the default first; each agrees with the
    task's TIR (F(4x4) within its error bound)."""
    target = cpu_target(2)
    task = _conv_task(proto, target)
    variants = peer_variants(task)
    assert variants[0] == find_peer(task) and variants[0].algorithm == default, label
    assert sorted(v.algorithm for v in variants) == sorted(
        ["im2col", "packed", "winograd_f2", "winograd_f4", *ONEDNN]
    )
    assert {v.to_json()["function"] for v in variants} == {
        "tunehub_peer_conv2d_nhwc",
        "tunehub_peer_conv2d_nhwc_packed",
        "tunehub_peer_conv2d_nhwc_winograd",
        *(["tunehub_peer_conv2d_nhwc_onednn"] if ONEDNN else []),
    }
    for call in variants:
        _check_peer(task, target, call)


def test_only_3x3_stride_1_convolutions_have_winograd_variants():
    target = cpu_target(2)
    for proto in (
        conv_model(8, 16, 13, 3, 2, 1),
        conv_model(3, 16, 20, 7, 2, 3),
        conv_model(8, 8, 12, 3, 1, 2, dilation=2),
        conv_model(4, 16, 12, 3, 1, 1),
    ):
        task = _conv_task(proto, target)
        assert sorted(v.algorithm for v in peer_variants(task)) == sorted(
            ["packed", "im2col", *ONEDNN]
        )
    gemm = [e.dispatched[0] for e in _partition(gemm_model(24, 40, 56), target).extracted]
    assert [(v.kind, v.algorithm) for m in gemm for v in peer_variants(m)] == [
        ("gemm", "packed"),
        ("gemm", ""),
        ("gemm", "q8"),
        ("gemm", "q4"),
        *(("gemm", a) for a in ONEDNN),
    ]
    task = _conv_task(conv_model(8, 16, 13, 3, 2, 1), target)
    with pytest.raises(ValueError, match="not a peer variant"):
        peer_task_module(task, call=dataclasses.replace(find_peer(task), algorithm="winograd_f2"))


@pytest.mark.parametrize(
    ("proto", "algorithm"),
    [
        (conv_model(64, 64, 24, 3, 1, 1), "winograd_f4"),
        (conv_model(64, 40, 9, 1, 1, 0), "packed"),
        (conv_model(16, 40, 9, 3, 2, 1), DIRECT),
        (conv_model(32, 32, 12, 3, 1, 1, groups=32), "onednn" if ONEDNN else ""),
        (gemm_model(24, 40, 56), "packed"),
    ],
)
def test_cached_weights_are_transformed_again_when_they_change(proto, algorithm):
    """The shim caches a weight's Winograd transform, packed panels or oneDNN layout by
    address: new values
    written into the same weight tensor (as a measurement's fresh arguments may land at a freed
    address) are transformed again, not served from the cache."""
    target = cpu_target(2)
    parts = _partition(proto, target)
    (task,) = [e.dispatched[0] for e in parts.extracted if find_peer(e.dispatched[0])]
    call = find_peer(task)
    assert call.algorithm == algorithm
    load_peers()
    peer = tvm.tirx.build(peer_task_module(task, call=call), target=target.tvm_target())
    args = _random_args(task)
    tensors = [tvm.runtime.tensor(a) for a in args]
    weight = [i for i, p in enumerate(task["main"].params) if str(p.name) == call.inputs[1]][0]
    for _ in range(2):
        peer(*tensors)
        out = tensors[-1].numpy()
        np.testing.assert_allclose(
            out, _run(task, args, target), rtol=1e-4, atol=WINOGRAD_F4_ERROR * np.abs(out).max()
        )
        args[weight] = RNG.standard_normal(args[weight].shape).astype("float32")
        tensors[weight].copyfrom(args[weight])  # same address, new values


@pytest.mark.parametrize(
    ("label", "proto"),
    [
        ("dense", gemm_model(24, 40, 56)),
        ("rows past a block, columns past a panel", gemm_model(131, 300, 70)),
        ("few rows, many panels", gemm_model(5, 64, 200)),
        ("one row", gemm_model(1, 40, 200)),
        ("many rows, a small weight (row blocks over the threads)", gemm_model(400, 24, 72)),
    ],
)
def test_every_gemm_variant_matches_the_task(label, proto):
    """A GEMM against a weight runs on the packed-weight GEMM by default and has OpenBLAS, the
    GEMMs over 8- and 4-bit weights (which compute these float32 weights as the default would) and
    oneDNN's matmul (where the library has oneDNN) as its other variants; a single row (a
    GEMV) has OpenBLAS's sgemv first. Each agrees with the task's TIR."""
    target = cpu_target(2)
    parts = _partition(proto, target)
    (task,) = [e.dispatched[0] for e in parts.extracted if find_peer(e.dispatched[0])]
    variants = peer_variants(task)
    rows = int(task["main"].params[0].shape[0])
    first = ["packed", "", "q8", "q4"] if rows > 1 else ["", "packed", "q8", "q4"]
    assert [v.algorithm for v in variants] == [*first, *ONEDNN], label
    for call in variants:
        _check_peer(task, target, call)


ISA_CHECK = """
import sys
sys.path.insert(0, sys.argv[1])
from tests.compiler import test_peers as t
from compiler.target import cpu_target
for proto in (t.gemm_model(131, 300, 70), t.gemm_model(5, 64, 200), t.gemm_model(400, 24, 72),
              t.epilogue_model("residual relu6", "depthwise", 72),
              t.conv_model(16, 40, 9, 3, 2, 1), t.conv_model(64, 72, 13, 3, 1, 1),
              t.conv_model(72, 72, 13, 3, 2, 1, groups=72)):
    task = t._conv_task(proto, cpu_target(2))
    for call in t.peer_variants(task):
        t._check_peer(task, cpu_target(2), call)
print("ok")
"""


@pytest.mark.parametrize("isa", ["avx2", "none"])
def test_packed_variants_match_under_every_isa(isa):
    """The packed GEMM's AVX2 micro-kernel (``TUNEHUB_PEERS_ISA=avx2`` on an AVX-512 machine)
    and its OpenBLAS fallback (``none``) give the task's results too, in every variant
    (Winograd's GEMMs run on the same kernels), and so does the depthwise kernel's AVX2 and
    baseline build; each in a fresh process (the shim chooses once per process)."""
    env = {**os.environ, "TUNEHUB_PEERS_ISA": isa}
    done = subprocess.run(
        [sys.executable, "-c", ISA_CHECK, str(REPO)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok")


@needs_onednn
@pytest.mark.parametrize(
    ("label", "proto"),
    [
        ("3x3 pad1", conv_model(16, 32, 12, 3, 1, 1)),
        ("3x3 stride2", conv_model(8, 16, 13, 3, 2, 1)),
        ("7x7 stride2 rgb stem", conv_model(3, 16, 20, 7, 2, 3)),
        ("3x3 dilation2", conv_model(8, 8, 12, 3, 1, 2, dilation=2)),
        ("1x1 stride2: the last input column is never read", conv_model(16, 24, 8, 1, 2, 0)),
        ("batch 3: more images than workers", conv_model(64, 64, 13, 3, 1, 2, batch=3)),
        ("depthwise 3x3", conv_model(32, 32, 12, 3, 1, 1, groups=32)),
        ("depthwise 3x3 stride2", conv_model(72, 72, 13, 3, 2, 1, groups=72)),
        ("depthwise 5x5 dilation2", conv_model(20, 20, 11, 5, 1, 4, dilation=2, groups=20)),
        ("depthwise batch 2, unpadded", conv_model(16, 16, 9, 3, 1, 0, groups=16, batch=2)),
        ("conv + bias + residual + relu6", epilogue_model("residual relu6", "conv", 16)),
        ("depthwise + bias + residual + relu6", epilogue_model("residual relu6", "depthwise", 72)),
        ("gemm: rows past a block, columns past a panel", gemm_model(131, 300, 70)),
        ("gemm: few rows, many columns", gemm_model(5, 64, 200)),
        ("gemm + bias + residual + relu6", epilogue_model("residual relu6", "gemm")),
    ],
)
def test_onednn_variant_matches_the_task(label, proto):
    """Every convolution, depthwise convolution and GEMM over a weight has a oneDNN variant
    (convolutions: the output rows split into one slab a TVM worker, each a single-threaded
    primitive, the epilogue as the primitive's bias, binary-add and clip post-ops; a GEMM: one
    block of columns a worker, the shim's epilogue after), and it agrees with the task's TIR,
    run three times (primitives and reordered weights come from the caches after the first)."""
    target = cpu_target(2)
    task = _conv_task(proto, target)
    (call,) = [v for v in peer_variants(task) if v.algorithm == "onednn"]
    assert call.to_json()["function"].endswith("_onednn"), label
    for _ in range(3):
        _check_peer(task, target, call)


@needs_onednn
def test_onednn_calls_leave_the_callers_openmp_thread_count_alone():
    """A oneDNN peer runs each slab with its thread's OpenMP count at 1 (so oneDNN never wakes
    an OpenMP team beside TVM's pool, whatever the caller set: torch sets it on the main
    thread, which runs a TVM launch's task 0) and gives the caller its own count back."""
    import ctypes

    gomp = ctypes.CDLL("libgomp.so.1")  # the one oneDNN's runtime resolved to in this process
    target = cpu_target(2)
    task = _conv_task(conv_model(32, 32, 12, 3, 1, 1, groups=32), target)
    (call,) = [v for v in peer_variants(task) if v.algorithm == "onednn"]
    gomp.omp_set_num_threads(3)
    try:
        _check_peer(task, target, call)
        assert gomp.omp_get_max_threads() == 3
    finally:
        gomp.omp_set_num_threads(os.cpu_count() or 1)


@needs_onednn
def test_a_failing_library_call_raises():
    """A shim call that fails (here oneDNN's: a slab of output rows that reads only padding)
    raises in the kernel, so a measurement fails and a model run raises, instead of leaving
    the output unwritten."""
    target = cpu_target(2)
    task = _conv_task(conv_model(4, 8, 1, 1, 1, 6), target)  # 1x1 input, 6 rows of padding
    (call,) = [v for v in peer_variants(task) if v.algorithm == "onednn"]
    load_peers()
    with pytest.raises(RuntimeError, match="tunehub_peer_conv2d_nhwc_onednn failed"):
        _run(peer_task_module(task, call=call), _random_args(task), target)


WITHOUT_ONEDNN = """
import sys
sys.path.insert(0, sys.argv[1])
from tests.compiler import test_peers as t
from compiler.peers.library import onednn_available, onednn_unavailable_reason, peer_library
from compiler.target import cpu_target
assert peer_library() is not None and not onednn_available()
assert "TUNEHUB_ONEDNN=0" in onednn_unavailable_reason()
assert "onednn" not in peer_library().describe()
for proto in (t.conv_model(16, 32, 12, 3, 1, 1), t.conv_model(32, 32, 12, 3, 1, 1, groups=32)):
    task = t._conv_task(proto, cpu_target(2))
    variants = t.peer_variants(task)
    assert variants and all(v.algorithm != "onednn" for v in variants), variants
    t._check_peer(task, cpu_target(2))
print("ok")
"""


def test_a_machine_without_onednn_keeps_the_other_peers():
    """With oneDNN turned off (``TUNEHUB_ONEDNN=0``, as on a machine without its wheels) the
    shim is built without it: no ``onednn`` variant is offered, the reason is given, and every
    other peer works."""
    env = {**os.environ, "TUNEHUB_ONEDNN": "0"}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_ONEDNN, str(REPO)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok")


def test_operators_the_library_does_not_cover_have_no_peer():
    """Grouped convolutions other than depthwise (two channels a group, or two filters a
    channel) have no peer; nor has any task on the legacy NCHW path."""
    for grouped in (
        conv_model(8, 8, 10, 3, 1, 1, groups=4),
        conv_model(8, 16, 10, 3, 1, 1, groups=8),
    ):
        assert all(find_peer(e.dispatched[0]) is None for e in _partition(grouped).extracted)
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
        mod, target, [(t.key, e.dispatched[0]) for t, e in zip(parts.tasks, parts.extracted)]
    )
    return export_library(executable, folder / "model.so", link_peers=bool(keys)), keys


FRESH_PROCESS = """
import sys, numpy as np, tvm
from tvm import relax
vm = relax.VirtualMachine(tvm.runtime.load_module(sys.argv[1]), tvm.cpu())
x = np.load(sys.argv[2])
print(repr(vm["main"](tvm.runtime.tensor(x)).numpy().tolist()))
"""


@pytest.mark.parametrize(
    ("proto", "algorithm"),
    [
        (conv_model(64, 32, 12, 1, 1, 0), "packed"),
        (conv_model(64, 64, 24, 3, 1, 1), "winograd_f4"),
        (conv_model(8, 16, 12, 3, 1, 1), DIRECT),
    ],
)
def test_zero_trial_artifact_runs_in_a_fresh_process(tmp_path, proto, algorithm):
    """The artifact links the shim, OpenBLAS and (where the shim has it) oneDNN: a process with
    nothing but the TVM runtime loads and runs it (no peer library loaded, no TuneHub import)
    and matches ONNX Runtime, with its convolution on the packed-weight GEMM, on Winograd or on
    oneDNN."""
    import onnxruntime as ort

    assert find_peer(_conv_task(proto, cpu_target(2))).algorithm == algorithm
    library, keys = _zero_trial_library(proto, tmp_path)
    assert len(keys) == 1
    needed = subprocess.run(["ldd", str(library)], capture_output=True, text=True).stdout
    assert "openblas" in needed
    assert ("libdnnl.so.3" in needed) == bool(ONEDNN)
    x = RNG.standard_normal(
        [int(d.dim_value) for d in proto.graph.input[0].type.tensor_type.shape.dim]
    ).astype("float32")
    np.save(tmp_path / "x.npy", x)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, str(library), str(tmp_path / "x.npy")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = np.array(eval(done.stdout.strip().splitlines()[-1]), dtype="float32")  # noqa: S307
    (ref,) = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})
    atol = WINOGRAD_F4_ERROR * np.abs(ref).max() if algorithm == "winograd_f4" else 1e-4
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=atol)


@pytest.mark.parametrize("peers_env", ["1", "0"])
def test_compile_without_a_database_is_the_zero_trial_build(tmp_path, peers_env):
    """``tunehub compile`` with no database: peers (or, with ``TUNEHUB_PEERS=0``, none, and the
    manifest says why) plus default schedules; verified either way."""
    model = tmp_path / "gemm.onnx"
    onnx.save(gemm_model(32, 64, 48), model)
    env = {**os.environ, "TUNEHUB_PEERS": peers_env}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "compile",
            str(model),
            "-o",
            str(tmp_path / "out"),
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert summary["verification"]["passed"] and manifest["zero_trial"] is True
    if peers_env == "1":
        assert len(manifest["peers"]["tasks"]) == 1
        assert manifest["peers"]["runtime_library"]["library"] == "openblas"
    else:
        assert manifest["peers"] is None and "TUNEHUB_PEERS=0" in manifest["peers_skipped"]
