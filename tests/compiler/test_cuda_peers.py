"""CUDA library peers (issue 21): a GEMM or convolution task of a CUDA target computed by cuBLAS
or cuDNN from its host code, the epilogue one TIR kernel; a whole model built with them.

TVM lowers and packages CUDA code on a machine without a GPU, so the detection, the rewrite and
the build run everywhere; running the peers needs a GPU and cuBLAS (skipped otherwise).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from tvm.s_tir import meta_schedule as ms

from bench.bench_gpu import gemm_module
from compiler.build.builder import build
from compiler.peers import (
    CUDA_HALF_GEMM_MIN_ROWS,
    find_peer,
    library_for,
    peer_task_module,
    peers_supported,
    zero_trial_peer,
)
from compiler.peers.calls import CUDA_DTYPES
from compiler.prepare import prepare_model
from compiler.target import GpuInfo, cpu_target, cuda_target, detect_gpu
from tests.onnx_factory import two_layer_model

H200 = GpuInfo("NVIDIA H200", "9.0", 132, 49152, 1024, 32, 150_754_820_096)
GPU = detect_gpu()


def test_gemm_peer_calls_cublas_and_writes_a_float16_output_itself() -> None:
    # float16 accumulated in float32 and cast back: cuBLAS stores the float16 output itself.
    half = find_peer(gemm_module(256, "float16"), "cuda")
    assert half is not None and half.output == "D" and half.function == "tunehub_cuda_gemm"
    assert dict(half.config)["dtype"] == CUDA_DTYPES[("float16", "float16")]
    single = find_peer(gemm_module(256, "float32"), "cuda")
    assert (
        single is not None and dict(single.config)["dtype"] == CUDA_DTYPES[("float32", "float32")]
    )
    # The CPU peer takes no float16 and no casts.
    assert find_peer(gemm_module(256, "float16")) is None
    script = peer_task_module(gemm_module(256, "float16"), "cuda").script()
    assert "tunehub_cuda_gemm" in script and "blockIdx" not in script  # no epilogue kernel
    assert peers_supported(cuda_target(H200)) and peers_supported(cpu_target())


@pytest.mark.parametrize("rows", [1, 16])
def test_a_zero_trial_build_gives_bfloat16_gemms_of_several_rows_to_cublas(rows, tmp_path) -> None:
    """bfloat16 linear layers (float32 accumulation, cast back; one with a bias): their GEMMs
    call cuBLAS in bfloat16 (the cast folded into the call where it is the whole epilogue); a
    zero-trial build takes the peer for 16 rows (a prefill) and leaves one row (a decode step's
    GEMV) to DLight's GEMV rule."""
    import torch

    class TwoLinear(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = torch.nn.Linear(64, 128)
            self.down = torch.nn.Linear(128, 32, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(torch.relu(self.up(x)))

    torch.manual_seed(0)
    module = TwoLinear().to(torch.bfloat16).eval()
    example = (torch.zeros(1, rows, 64, dtype=torch.bfloat16),)
    torch.export.save(torch.export.export(module, example), tmp_path / "linear.pt2")
    prepared = prepare_model(tmp_path / "linear.pt2", cuda_target(H200))
    calls = {}
    for task, extracted in zip(prepared.partition.tasks, prepared.partition.extracted):
        call = find_peer(extracted.dispatched[0], "cuda")
        if call is not None:
            calls[task.name] = (call, zero_trial_peer(extracted.dispatched[0], prepared.target))
    codes = {dict(call.config)["dtype"] for call, _ in calls.values()}
    assert codes <= {CUDA_DTYPES[("bfloat16", "bfloat16")], CUDA_DTYPES[("bfloat16", "float32")]}
    assert CUDA_DTYPES[("bfloat16", "bfloat16")] in codes  # a cast folded into the call
    wanted = rows >= CUDA_HALF_GEMM_MIN_ROWS
    assert calls and all(chosen == wanted for _, chosen in calls.values())


def test_a_model_builds_for_cuda_with_its_gemms_on_cublas() -> None:
    """A two-layer MLP's GEMM tasks (one with a ReLU epilogue) on cuBLAS: each task's host code
    calls the shim and its epilogue is a kernel bound to blocks and threads; the CUDA build
    (compile_relax's pipeline with the peers applied after fusion) succeeds."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "mlp.onnx"
        path.write_bytes(two_layer_model().SerializeToString())
        prepared = prepare_model(path, cuda_target(H200))
    tasks = list(zip(prepared.partition.tasks, prepared.partition.extracted))
    keys = {t.key for t, e in tasks if find_peer(e.dispatched[0], "cuda") is not None}
    assert len(keys) == 2
    for task, extracted in tasks:
        if task.key in keys:
            script = peer_task_module(extracted.dispatched[0], "cuda").script()
            assert "tunehub_cuda_gemm" in script
            assert ("blockIdx.x" in script) == ("relu" in task.name)  # the epilogue's kernel
    executable = build(prepared.mod, prepared.target, ms.database.MemoryDatabase(), peers=keys)
    assert executable is not None


def test_nchw_convolutions_get_cudnn_peers(example_model) -> None:
    """The small CNN's convolutions (NCHW on CUDA, with bias/ReLU epilogues) call cuDNN from
    their host code; the build with them succeeds."""
    prepared = prepare_model(example_model("small_cnn", "onnx"), cuda_target(H200))
    tasks = list(zip(prepared.partition.tasks, prepared.partition.extracted))
    calls = {t.key: find_peer(e.dispatched[0], "cuda") for t, e in tasks}
    convs = {t.key for t, _ in tasks if "conv2d" in t.name}
    assert convs and all(calls[k] is not None and calls[k].kind == "conv2d_nchw" for k in convs)
    assert all(
        find_peer(e.dispatched[0], "cuda") is None
        for t, e in tasks
        if t.key not in convs and "matmul" not in t.name
    )
    for task, extracted in tasks:
        if task.key in convs:
            script = peer_task_module(extracted.dispatched[0], "cuda").script()
            assert "tunehub_cuda_conv2d_nchw" in script and "blockIdx.x" in script
    keys = {k for k, call in calls.items() if call is not None}
    assert build(prepared.mod, prepared.target, ms.database.MemoryDatabase(), peers=keys)


def test_a_float16_convolution_calls_cudnn_in_half_precision(tmp_path) -> None:
    """A float16 program's convolution (float16 in, float32 accumulated, cast back to float16,
    then the batch norm and ReLU: a ResNet's) calls cuDNN's half-precision convolution, which
    writes the cast's float16 buffer itself; the float32 one keeps float32 (dtype 0). The build
    succeeds."""
    import torch
    from torch import nn

    for dtype, code in ((torch.float16, ("float16",) * 2), (torch.float32, ("float32",) * 2)):
        conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        model = nn.Sequential(conv, nn.BatchNorm2d(8), nn.ReLU()).eval().to(dtype)
        path = tmp_path / f"conv_{code[0]}.pt2"
        x = torch.randn(1, 3, 6, 6, dtype=dtype)
        torch.export.save(torch.export.export(model, (x,)), path)
        prepared = prepare_model(path, cuda_target(H200))
        tasks = list(zip(prepared.partition.tasks, prepared.partition.extracted))
        calls = {t.key: find_peer(e.dispatched[0], "cuda") for t, e in tasks}
        convs = [(t, e) for t, e in tasks if "conv2d" in t.name]
        assert len(convs) == 1 and "divide" not in convs[0][0].name  # the norm is folded
        call = calls[convs[0][0].key]
        assert call is not None and call.kind == "conv2d_nchw"
        assert dict(call.config)["dtype"] == CUDA_DTYPES[code]
        script = peer_task_module(convs[0][1].dispatched[0], "cuda").script()
        assert "tunehub_cuda_conv2d_nchw" in script
        keys = {k for k, c in calls.items() if c is not None}
        assert build(prepared.mod, prepared.target, ms.database.MemoryDatabase(), peers=keys)


@pytest.mark.gpu
@pytest.mark.skipif(GPU is None, reason="no CUDA GPU (tvm.cuda(0).exist is false)")
def test_cuda_peers_run_and_match_onnx_runtime(tmp_path) -> None:
    from compiler.build.artifact import publish_artifact  # noqa: PLC0415
    from compiler.build.runner import LoadedLibrary  # noqa: PLC0415
    from compiler.build.verify import verify  # noqa: PLC0415

    target = cuda_target(GPU)
    if library_for(target) is None:
        pytest.skip("no cuBLAS peer library on this machine")
    path = tmp_path / "mlp.onnx"
    path.write_bytes(two_layer_model().SerializeToString())
    prepared = prepare_model(path, target)
    keys = {
        t.key
        for t, e in zip(prepared.partition.tasks, prepared.partition.extracted)
        if find_peer(e.dispatched[0], "cuda") is not None
    }
    executable = build(prepared.mod, target, ms.database.MemoryDatabase(), peers=keys)
    loaded = LoadedLibrary.from_executable(executable, "cuda")
    assert verify(prepared.model, loaded.run, device="cuda").passed
    manifest = publish_artifact(
        executable,
        prepared.model,
        target,
        tmp_path / "out",
        tasks=[t.to_json() for t in prepared.partition.tasks],
        link_peers=True,
    )
    assert manifest["verification"]["passed"]
