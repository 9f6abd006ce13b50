"""CUDA targets: resolution and fingerprint, design space, default-schedule records, GPU runs.

Everything but the last tests runs without a GPU: TVM lowers and packages CUDA code on a machine
without one (the CUDA source is compiled when the library is loaded on a GPU). Tests that run
code on a GPU are skipped unless ``tvm.cuda(0).exist``.
"""

from __future__ import annotations

import json
import sys
import threading

import pytest
import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

import db
from compiler.errors import ModelError
from compiler.target import CUDA_TAGS, GpuInfo, cuda_target, detect_gpu, resolve_target
from db.metaschedule_database import MetaScheduleDatabase

H200 = GpuInfo("NVIDIA H200", "9.0", 132, 49152, 1024, 32, 150_754_820_096)
H100 = GpuInfo("NVIDIA H100 80GB HBM3", "9.0", 132, 49152, 1024, 32, 85_520_809_984)
HAS_GPU = detect_gpu() is not None


def needs_gpu(test):
    """Mark ``test`` ``gpu`` and skip it where there is no CUDA GPU."""
    skip = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU (tvm.cuda(0).exist is false)")
    return pytest.mark.gpu(skip(test))


def test_cuda_resolves_to_the_tag_of_the_compute_capability() -> None:
    spec = resolve_target("cuda", gpu=H200)
    target = json.loads(spec.target_json)
    assert spec.kind == "cuda" and spec.device == "cuda"
    assert target["kind"] == "cuda" and target["arch"] == "sm_90a"
    assert target["max_threads_per_block"] == 1024 and target["host"]["kind"] == "llvm"
    tag = tvm.target.Target(CUDA_TAGS[(9, 0)])
    assert target["max_shared_memory_per_block"] == int(tag.attrs["max_shared_memory_per_block"])
    assert spec.fingerprint == {
        "compute_capability": "9.0",
        "gpu": "NVIDIA H200",
        "host_arch": spec.fingerprint["host_arch"],
        "memory_gib": 140,
        "multiprocessors": 132,
    }
    assert spec.tvm_target().kind.name == "cuda"
    assert "NVIDIA H200" in spec.describe() and "sm_90a" in spec.describe()


def test_different_gpus_never_share_a_target_key() -> None:
    h200, h100 = cuda_target(H200), cuda_target(H100)
    assert h200.target_json == h100.target_json  # same code generation...
    assert h200.key != h100.key  # ...but records are kept apart by the fingerprint
    assert cuda_target(H200).key == h200.key  # and the key is stable


def test_unknown_generation_gets_a_target_from_the_device_limits() -> None:
    gpu = GpuInfo("Future GPU", "12.1", 84, 101376, 1024, 32, 32 * 2**30)
    target = json.loads(cuda_target(gpu).target_json)
    assert target["arch"] == "sm_121"
    assert target["max_shared_memory_per_block"] == 101376


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_a_clear_error() -> None:
    with pytest.raises(ModelError) as err:
        resolve_target("cuda")
    assert err.value.code == "bad_target" and "GPU" in str(err.value)
    with pytest.raises(ModelError, match="supported targets are 'cpu' and 'cuda'"):
        resolve_target("rocm")


def test_worker_cli_refuses_cuda_without_a_gpu(capsys, monkeypatch, tmp_path) -> None:
    if HAS_GPU:
        pytest.skip("this machine has a GPU")
    from service.cli import main

    monkeypatch.setenv("TUNEHUB_HOME", str(tmp_path))
    assert main(["worker", "--target", "cuda", "--exit-when-idle"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def _matmul(n: int, dtype: str) -> tvm.IRModule:
    from bench.bench_gpu import gemm_module

    return gemm_module(n, dtype)


def test_tensorcore_space_tensorizes_fp16_and_keeps_fp32_on_plain_rules() -> None:
    from compiler.lowering.intrinsics import load_tensor_intrinsics
    from tuner.engine.space import design_space

    # In a thread of its own: TVMScript's parser calls inspect.stack() for each of the ~500
    # intrinsics it parses, at a cost that grows with the depth of the calling stack (pytest's
    # is ~70 frames: minutes on a loaded 2-core machine); a new thread starts with a few.
    loader = threading.Thread(target=load_tensor_intrinsics, args=("cuda",))
    loader.start()
    loader.join()
    assert "tvm.s_tir.tensor_intrin.cuda" in sys.modules
    target = cuda_target(H200).tvm_target()

    def traces(dtype: str) -> str:
        ctx = ms.TuneContext(
            mod=_matmul(256, dtype),
            target=target,
            space_generator=design_space("cuda", target),
            task_name="t",
        )
        return "\n".join(str(s.trace) for s in ctx.generate_design_space())

    fp16 = traces("float16")
    assert "wmma_sync_16x16x16_f16f16f32" in fp16
    assert 'storage_scope="shared.dyn"' in fp16 or "shared.dyn" in fp16
    assert "wmma" not in traces("float32")
    assert design_space("cpu") == "post-order-apply"


def test_default_schedule_record_round_trips_through_the_database(tmp_path) -> None:
    """DLight's matmul trace holds index maps (TVM 0.27's TuningRecord.as_json fails on them):
    it is stored, read back as the best record, and the build replays it."""
    from tuner.task_scheduler.default_schedules import default_schedule

    spec = cuda_target(H200)
    target = spec.tvm_target()
    mod = _matmul(512, "float16")
    sch = default_schedule(mod, target)
    assert sch is not None and "transform_layout" in str(sch.trace)
    storage = db.open_storage(f"sqlite:///{tmp_path / 'seed.db'}", upgrade=True)
    try:
        database = MetaScheduleDatabase(storage, spec)
        workload = database.commit_workload(mod)
        args = ms.arg_info.ArgInfo.from_entry_func(mod)
        database.commit_tuning_record(
            ms.database.TuningRecord(sch.trace, workload, [1e-4], target, args)
        )
        (best,) = database.get_top_k(workload, 1)
        assert abs(float(best.run_secs[0]) - 1e-4) < 1e-12
        replayed = ms.tir_integration.compile_tir(database, mod, target)
        assert tvm_ffi.structural_equal(replayed.mod, sch.mod)
        tvm.compile(replayed.mod, target=target)
    finally:
        storage.close()


@pytest.mark.slow
def test_untuned_model_builds_for_cuda(example_model) -> None:
    """The MLP imports, partitions and builds with DLight's default GPU schedules (no GPU needed:
    the CUDA source is compiled when the library is loaded)."""
    from compiler.build.builder import build
    from compiler.prepare import prepare_model

    prepared = prepare_model(example_model("mlp", "pt2"), cuda_target(H200))
    assert len(prepared.partition.tasks) == 3
    assert all(t.target.kind.name == "cuda" for t in prepared.partition.extracted)
    executable = build(prepared.mod, prepared.target)
    assert executable is not None


def test_cuda_builds_capture_cuda_graphs_unless_turned_off(example_model, monkeypatch) -> None:
    """A CUDA build's VM code runs its static regions through ``vm.builtin.cuda_graph`` (captured
    once, replayed after); ``TUNEHUB_CUDA_GRAPHS=0`` builds the plain launches; the manifest of a
    CUDA artifact says which."""
    from compiler.build.artifact import build_manifest
    from compiler.build.builder import build
    from compiler.build.verify import VerificationResult
    from compiler.lowering.pipeline import CUDA_GRAPHS_ENV
    from compiler.prepare import prepare_model

    prepared = prepare_model(example_model("mlp", "pt2"), cuda_target(H200))
    graphs = build(prepared.mod, prepared.target).as_text()
    assert "vm.builtin.cuda_graph.run_or_capture" in graphs
    no_result = VerificationResult(False, "none", 0.0, (), "not run")
    assert build_manifest(prepared.model, prepared.target, [], no_result)["target"]["cuda_graphs"]
    monkeypatch.setenv(CUDA_GRAPHS_ENV, "0")
    assert "cuda_graph" not in build(prepared.mod, prepared.target).as_text()
    manifest = build_manifest(prepared.model, prepared.target, [], no_result)
    assert manifest["target"]["cuda_graphs"] is False


@pytest.mark.slow
@needs_gpu
def test_tuned_model_on_the_gpu_is_verified_against_torch(example_model, tmp_path) -> None:
    from compiler.prepare import prepare_model
    from tuner.engine.search import FAST_SEARCH
    from tuner.jobs.job import tune_model

    prepared = prepare_model(example_model("mlp", "pt2"), resolve_target("cuda"))
    storage = db.open_storage(f"sqlite:///{tmp_path / 'gpu.db'}", upgrade=True)
    try:
        summary = tune_model(
            storage, prepared, trials=12, output_dir=tmp_path / "out", search=FAST_SEARCH, seed=0
        )
    finally:
        storage.close()
    assert summary.verification["passed"]
    assert summary.verification["reference"] == "torch (cuda)"
    assert summary.measured is not None and summary.measured.median_secs > 0
    # The engine measures each task's default (DLight) schedule as a seed, within the budget.
    assert 1 <= summary.extra["search"]["default_schedules"] <= len(prepared.partition.tasks)
    assert summary.trials_measured <= 12 + 4  # the budget plus at most one batch
