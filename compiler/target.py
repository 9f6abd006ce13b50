"""Compilation targets and the hardware they run on.

A :class:`TargetSpec` is what every tuning record is stored against: the canonical target JSON
(sorted keys of ``Target.export()``, since ``str(Target)`` is not canonical) plus a hardware
fingerprint (CPU model and cores, GPU name later) and the TVM version. Records tuned for one
``mcpu``, core count or GPU are not evidence for another, so all of these are part of the key.

CUDA: ``resolve_target("cuda")`` reads the GPU of this machine (:func:`detect_gpu`) and maps its
compute capability to TVM's target tag for that generation (:data:`CUDA_TAGS`: an H100 or H200,
compute 9.0, gets ``nvidia/nvidia-h100`` with ``sm_90a``); its fingerprint names the GPU, compute
capability, multiprocessor count and memory, so records of an H100 and an H200 never mix.

CPU: the fingerprint also holds the target's :class:`~compiler.compile_options.CompileOptions`
(``"compile"``: convolution layout, prepacked weights), so records tuned under other options
live under another target key; tuning and the final build read them off the same spec.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import tvm

from compiler.compile_options import CPU_DEFAULT, CompileOptions
from compiler.errors import ModelError
from compiler.threads import usable_cores
from compiler.weights.weight_formats import check_weight_format


def _plain(value: Any) -> Any:
    """Convert TVM ffi containers (Map, Array, String) into plain JSON-able Python values."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or hasattr(value, "__len__"):
        return [_plain(v) for v in value]
    return str(value)


def canonical_target_json(target: tvm.target.Target) -> str:
    """Return the canonical JSON text of a TVM target: sorted keys, no whitespace variance."""
    return json.dumps(_plain(target.export()), sort_keys=True, separators=(",", ":"))


def _cpuinfo_value(key: str) -> str | None:
    """The value of the first ``key`` line of ``/proc/cpuinfo`` (``None`` where it has none or
    cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                name, _, value = line.partition(":")
                if name.strip() == key:
                    return value.strip()
    except OSError:
        pass
    return None


def _cpu_model_name() -> str:
    return _cpuinfo_value("model name") or platform.processor() or "unknown"


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The feature flags ``/proc/cpuinfo`` lists for this CPU (empty where it cannot be read):
    what run-time choices of instructions read (AVX-512, AMX, bfloat16)."""
    return frozenset((_cpuinfo_value("flags") or "").split())


@dataclass(frozen=True)
class GpuInfo:
    """What TuneHub reads off a CUDA device: enough to pick its target and fingerprint it."""

    name: str
    compute_version: str
    multi_processor_count: int
    max_shared_memory_per_block: int
    max_threads_per_block: int
    warp_size: int
    total_memory_bytes: int

    @property
    def capability(self) -> tuple[int, int]:
        major, _, minor = self.compute_version.partition(".")
        return int(major), int(minor or 0)


def detect_gpu(index: int = 0) -> GpuInfo | None:
    """The CUDA device ``index`` of this machine, or ``None`` when TVM sees no such GPU."""
    try:
        dev = tvm.cuda(index)
        if not dev.exist:
            return None
        return GpuInfo(
            name=str(dev.device_name),
            compute_version=str(dev.compute_version),
            multi_processor_count=int(dev.multi_processor_count),
            max_shared_memory_per_block=int(dev.max_shared_memory_per_block),
            max_threads_per_block=int(dev.max_threads_per_block),
            warp_size=int(dev.warp_size),
            total_memory_bytes=int(dev.total_global_memory or 0),
        )
    except (tvm.error.TVMError, RuntimeError, ValueError):  # no CUDA driver or runtime here
        return None


#: Compute capability -> TVM target tag of that generation (its ``arch`` and block limits).
#: Hopper (9.0) uses ``sm_90a`` so that Hopper-only instructions are allowed.
CUDA_TAGS: dict[tuple[int, int], str] = {
    (7, 0): "nvidia/nvidia-v100",
    (7, 5): "nvidia/nvidia-t4",
    (8, 0): "nvidia/nvidia-a100",
    (8, 6): "nvidia/nvidia-a10",
    (8, 9): "nvidia/geforce-rtx-4090",
    (9, 0): "nvidia/nvidia-h100",
    (10, 0): "nvidia/nvidia-b100",
}


@dataclass(frozen=True)
class TargetSpec:
    """A TVM target plus the hardware it is measured on.

    ``kind`` is ``"cpu"`` or ``"cuda"``; ``target_json`` is canonical (see
    :func:`canonical_target_json`); ``fingerprint`` is a sorted JSON object describing the machine.
    ``key`` identifies the pair and is what the tuning database scopes records by.
    """

    kind: str
    target_json: str
    fingerprint_json: str
    tvm_version: str = tvm.__version__

    @cached_property
    def key(self) -> str:
        digest = hashlib.sha256(f"{self.target_json}\n{self.fingerprint_json}".encode())
        return digest.hexdigest()[:16]

    @property
    def fingerprint(self) -> dict[str, Any]:
        return json.loads(self.fingerprint_json)

    def tvm_target(self) -> tvm.target.Target:
        """Rebuild the TVM target object (a new object on each call)."""
        return tvm.target.Target(json.loads(self.target_json))

    @property
    def compile_options(self) -> CompileOptions:
        """How this target lowers convolutions and weights (:mod:`compiler.compile_options`);
        CUDA targets and CPU targets stored before the options existed get the legacy path."""
        if self.kind != "cpu":
            return CompileOptions()
        return CompileOptions.from_json(self.fingerprint.get("compile"))

    def with_weights(self, weights: str) -> TargetSpec:
        """This target with the weight format ``weights`` (:mod:`compiler.weights.weight_formats`):
        the same machine and options otherwise, so a worker of one serves the other's jobs. A CUDA
        target (or a legacy CPU one) has only its own."""
        if self.kind != "cpu" or self.compile_options.is_legacy:
            return self
        fingerprint = self.fingerprint
        fingerprint["compile"] = replace(self.compile_options, weights=weights).to_json()
        return replace(
            self, fingerprint_json=json.dumps(fingerprint, sort_keys=True, separators=(",", ":"))
        )

    @property
    def device(self) -> str:
        """The TVM runtime device string for this target (``"cpu"`` or ``"cuda"``)."""
        return "cuda" if self.kind == "cuda" else "cpu"

    def describe(self) -> str:
        fp = self.fingerprint
        if self.kind == "cuda":
            arch = json.loads(self.target_json).get("arch", "?")
            return f"cuda {fp.get('gpu', '?')} ({arch}, compute {fp.get('compute_capability')})"
        return (
            f"cpu {fp.get('mcpu')} x{fp.get('cores')} ({fp.get('cpu_model')}, "
            f"{self.compile_options.describe()})"
        )


def cpu_target(num_cores: int | None = None, options: CompileOptions | None = None) -> TargetSpec:
    """The CPU target for this machine: LLVM with the host's ``mcpu`` (never plain SSE code).

    ``num_cores`` defaults to the cores this process may use; ``options`` to
    :data:`compiler.compile_options.CPU_DEFAULT` (benchmarks pass others to compare them).
    """
    cores = num_cores or usable_cores()
    if cores < 1:
        raise ModelError("bad_target", f"num_cores must be at least 1, got {cores}")
    mcpu = str(tvm.target.codegen.llvm_get_system_cpu())
    target = tvm.target.Target({"kind": "llvm", "num-cores": cores, "mcpu": mcpu})
    fingerprint = {
        "arch": platform.machine(),
        "cores": cores,
        "cpu_model": _cpu_model_name(),
        "mcpu": mcpu,
        "compile": (options or CPU_DEFAULT).to_json(),
    }
    return TargetSpec(
        kind="cpu",
        target_json=canonical_target_json(target),
        fingerprint_json=json.dumps(fingerprint, sort_keys=True, separators=(",", ":")),
    )


def cuda_target(gpu: GpuInfo) -> TargetSpec:
    """The CUDA target for ``gpu``: the tag of its compute capability (:data:`CUDA_TAGS`), or, for
    a generation without a tag, a target built from the limits the device reports.

    The host is plain LLVM (it only launches kernels). The fingerprint holds the GPU's name,
    compute capability, multiprocessor count and memory: different GPUs never share records.
    """
    tag = CUDA_TAGS.get(gpu.capability)
    if tag is not None:
        target = tvm.target.Target(tag, host={"kind": "llvm"})
    else:
        major, minor = gpu.capability
        target = tvm.target.Target(
            {
                "kind": "cuda",
                "arch": f"sm_{major}{minor}",
                "max_shared_memory_per_block": gpu.max_shared_memory_per_block,
                "max_threads_per_block": gpu.max_threads_per_block,
                "thread_warp_size": gpu.warp_size,
                "registers_per_block": 65536,
            },
            host={"kind": "llvm"},
        )
    fingerprint = {
        "gpu": gpu.name,
        "compute_capability": gpu.compute_version,
        "multiprocessors": gpu.multi_processor_count,
        "memory_gib": round(gpu.total_memory_bytes / 2**30),
        "host_arch": platform.machine(),
    }
    return TargetSpec(
        kind="cuda",
        target_json=canonical_target_json(target),
        fingerprint_json=json.dumps(fingerprint, sort_keys=True, separators=(",", ":")),
    )


def resolve_target(
    name: str,
    num_cores: int | None = None,
    *,
    gpu: GpuInfo | None = None,
    weights: str = "as_exported",
) -> TargetSpec:
    """Map a user-facing target name to a :class:`TargetSpec`.

    ``cpu`` (or ``llvm``): this machine's CPU. ``cuda``: this machine's first GPU (``gpu``, when
    given, replaces detection). ``weights``: the weight format of the CPU target's compile options
    (:mod:`compiler.weights.weight_formats`). Raises :class:`ModelError` (code ``bad_target``) for
    unknown names and for ``cuda`` on a machine without a CUDA GPU, ``bad_weights`` for an unknown
    format or one the target has no kernels for (CUDA keeps the weights as exported).
    """
    check_weight_format(weights)
    if name in ("cpu", "llvm"):
        return cpu_target(num_cores, replace(CPU_DEFAULT, weights=weights))
    if weights != "as_exported" and name == "cuda":
        raise ModelError(
            "bad_weights",
            f"--weights {weights} is a CPU weight format; target 'cuda' keeps the weights as "
            "exported (export the model in float16 or bfloat16 for half the bytes)",
        )
    if name == "cuda":
        gpu = gpu or detect_gpu()
        if gpu is None:
            raise ModelError(
                "bad_target", "target 'cuda' needs a CUDA GPU, and TVM finds none on this machine"
            )
        return cuda_target(gpu)
    raise ModelError(
        "bad_target", f"unknown target {name!r}: supported targets are 'cpu' and 'cuda'"
    )


def not_buildable_here(target: TargetSpec) -> str | None:
    """Why this machine cannot compile code for ``target`` (``None``: it can). CPU targets
    always build (LLVM cross-compiles for any ``mcpu``); CUDA targets need ``nvcc``, which TVM
    calls to compile kernels."""
    if target.kind != "cuda":
        return None
    import shutil  # noqa: PLC0415

    return None if shutil.which("nvcc") else "no CUDA compiler (nvcc) on this machine"


def not_runnable_here(target: TargetSpec) -> str | None:
    """Why this machine cannot run code built for ``target`` (``None``: it can): a CPU target
    of another architecture or ``mcpu`` (its instructions may not exist here), a CUDA target
    without a GPU of the same compute capability here."""
    fingerprint = target.fingerprint
    if target.kind == "cuda":
        gpu = detect_gpu()
        if gpu is None:
            return "no CUDA GPU on this machine"
        if gpu.compute_version != fingerprint.get("compute_capability"):
            return f"this machine's GPU is compute {gpu.compute_version}, the target's " + str(
                fingerprint.get("compute_capability")
            )
        return None
    here = str(tvm.target.codegen.llvm_get_system_cpu())
    if fingerprint.get("arch") != platform.machine() or fingerprint.get("mcpu") != here:
        return (
            f"this machine is {platform.machine()} {here}, the target "
            f"{fingerprint.get('arch')} {fingerprint.get('mcpu')}"
        )
    return None
