"""Library kernels as peers of tuned schedules (issue 21).

A task whose anchor is a GEMM or an NHWC convolution has one more candidate besides its
MetaSchedule records: the same fused PrimFunc with the anchor computed by OpenBLAS
(:mod:`compiler.peers.rewrite`; the epilogue stays TIR). The tuner measures it side by side with
the task's best schedules and the build takes it only for the tasks where it won
(:func:`apply_peers`); an artifact that uses one links the shim and OpenBLAS
(:mod:`compiler.peers.library`). Only CPU targets on the current compile options
(:data:`compiler.compile_options.CPU_DEFAULT`) and CUDA targets have peers (on CUDA, GEMMs by
cuBLAS and convolutions by cuDNN: :mod:`compiler.peers.cuda_library`); legacy NCHW CPU targets
keep their path.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

import tvm
from tvm import tirx

from compiler.keys import workload_key
from compiler.peers.algorithms import FORMAT_ALGORITHMS
from compiler.peers.calls import CUDA_DTYPES, PeerCall
from compiler.peers.cuda_library import cuda_peer_library, cuda_unavailable_reason
from compiler.peers.library import PeerLibrary, peer_library, unavailable_reason
from compiler.peers.library import load_peers as _load_cpu_peers
from compiler.peers.match import find_peer, gemm_rows, peer_variants
from compiler.peers.rewrite import peer_function
from compiler.target import TargetSpec

__all__ = [
    "CUDA_HALF_GEMM_MIN_ROWS",
    "PeerCall",
    "PeerLibrary",
    "apply_peers",
    "cuda_peer_library",
    "device_of",
    "library_for",
    "library_unavailable_reason",
    "find_peer",
    "load_peers",
    "peer_library",
    "peer_task_module",
    "peer_variants",
    "peers_supported",
    "unavailable_reason",
    "zero_trial_call",
    "zero_trial_peer",
]

#: A zero-trial CUDA build computes a half-precision GEMM of at least this many rows with cuBLAS
#: (tensor cores); DLight's default schedule keeps the rest. DLight's matmul rule has no
#: tensor-core schedule there: a 2048³ float16 GEMM took 0.632 ms under it and 0.027 ms on the
#: cuBLAS peer (``bench/results/gpu_peers_2026-12-02.md``, H200), and a Qwen2.5-0.5B decode step
#: at batch 8 (8-row GEMMs) took 19.7 ms with it (``gpu_llm_2026-12-06_b8.md``). One row is a
#: decode step's GEMV: DLight's GEMV rule (:mod:`compiler.lowering.gpu_gemv`) reads the weight once,
#: as cuBLAS does, without the call's overhead. float32 GEMMs stay DLight's: on BERT at sequence
#: 128 its default beat the peer on four of five tasks.
CUDA_HALF_GEMM_MIN_ROWS = 2
_HALF_CODES = frozenset(
    code for (dtype, _), code in CUDA_DTYPES.items() if dtype in ("float16", "bfloat16")
)


def peers_supported(target: TargetSpec) -> bool:
    """Whether ``target``'s build path can take library peers (see the module docstring)."""
    return target.kind == "cuda" or (target.kind == "cpu" and not target.compile_options.is_legacy)


def device_of(target: TargetSpec) -> str:
    """Which shim ``target``'s peers call: ``cuda`` or ``cpu``."""
    return "cuda" if target.kind == "cuda" else "cpu"


def library_for(target: TargetSpec) -> Any:
    """The peer library ``target``'s peers call (a :class:`PeerLibrary` or
    :class:`compiler.peers.cuda_library.CudaPeerLibrary`), or ``None``: not available here, or
    ``target`` takes no peers."""
    if not peers_supported(target):
        return None
    return cuda_peer_library() if target.kind == "cuda" else peer_library()


def library_unavailable_reason(target: TargetSpec) -> str:
    """Why :func:`library_for` is ``None`` for ``target`` (empty when it is not)."""
    if not peers_supported(target):
        return f"{target.describe()} takes no library peers"
    return cuda_unavailable_reason() if target.kind == "cuda" else unavailable_reason()


def load_peers() -> None:
    """Load every peer library this machine has into this process (a runner worker's
    initializer: must be importable by reference). Never raises (see
    :func:`compiler.peers.library.load_peers`); the CUDA one only where it was built."""
    _load_cpu_peers()
    library = cuda_peer_library() if _has_cuda() else None
    if library is not None:
        try:
            library.load()
        except OSError as err:
            import logging  # noqa: PLC0415

            logging.getLogger("tunehub.peers").warning(
                "the CUDA peer library did not load: %s", err
            )


def zero_trial_peer(task: tvm.IRModule, target: TargetSpec) -> bool:
    """Whether a zero-trial build (no tuning database) of ``target`` computes ``task`` (a task
    module) with its library peer: on a CPU target every task that has one (the shim's
    algorithms were chosen by measurement: :mod:`compiler.peers.algorithms`); on CUDA a
    half-precision GEMM of :data:`CUDA_HALF_GEMM_MIN_ROWS` rows or more. Whether the library is
    on this machine is the caller's to check."""
    if not peers_supported(target):
        return False
    device = device_of(target)
    call = find_peer(task, device)
    if call is None or device == "cpu":
        return call is not None
    return (
        call.kind == "gemm"
        and dict(call.config).get("dtype") in _HALF_CODES
        and gemm_rows(task, call) >= CUDA_HALF_GEMM_MIN_ROWS
    )


def zero_trial_call(task: tvm.IRModule, target: TargetSpec) -> PeerCall | None:
    """The peer call a zero-trial build of ``target`` makes for ``task`` (``None``: none, see
    :func:`zero_trial_peer`): :func:`find_peer`'s, except that on a target whose weights are
    ``q8_0`` or ``q4_0`` (:mod:`compiler.weights.weight_formats`) a GEMM over a weight, of any
    number of rows, reads it in that format (``q8``, ``q4``:
    :data:`~compiler.peers.algorithms.FORMAT_ALGORITHMS`), which the library then holds
    instead of its float32 values (:mod:`compiler.peers.held_weights`)."""
    if not zero_trial_peer(task, target):
        return None
    call = find_peer(task, device_of(target))
    if (
        call is not None
        and target.kind == "cpu"
        and (algorithm := FORMAT_ALGORITHMS.get(target.compile_options.weights))
        and call.kind == "gemm"
        and call.algorithm in ("", "packed")
        and algorithm in {v.algorithm for v in peer_variants(task)}
    ):
        call = replace(call, algorithm=algorithm)
    return call


def _has_cuda() -> bool:
    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # noqa: BLE001 - a runtime without CUDA
        return False


def _as_task(func: tirx.PrimFunc) -> tvm.IRModule:
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def peer_task_module(
    task_mod: tvm.IRModule, device: str = "cpu", *, call: PeerCall | None = None
) -> tvm.IRModule | None:
    """The peer of a task module (``extracted.dispatched[0]``) on ``device`` as a module that
    builds and runs with the task's arguments, or ``None`` when the task has no peer.
    ``call``: one of :func:`peer_variants` (default: :func:`find_peer`'s)."""
    if find_peer(task_mod, device) is None:
        return None
    return _as_task(peer_function(task_mod["main"], device, call=call))


def apply_peers(
    fused: tvm.IRModule, keys: Collection[str] | Mapping[str, PeerCall | None], device: str = "cpu"
) -> tuple[tvm.IRModule, dict[str, Any]]:
    """``fused`` (:func:`compiler.lowering.pipeline.fused_for_target`) with the PrimFunc of every
    task whose workload key is in ``keys`` replaced by its peer on ``device``; returns the module
    and, by key, the :class:`PeerCall` each replaced task makes. Keys of tasks without a peer
    are ignored.
    ``keys`` may also map each key to the variant to use (one of the task's
    :func:`peer_variants`; ``None``: :func:`find_peer`'s), as a caller that measured the
    variants does."""
    if not keys:
        return fused, {}
    wanted = set(keys)
    replaced: dict[str, Any] = {}
    out = fused.clone()
    for gvar, func in fused.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        key = workload_key(_as_task(func))
        if key not in wanted:
            continue
        call = find_peer(_as_task(func), device)
        if call is None:
            continue
        if isinstance(keys, Mapping) and keys[key] is not None:
            call = keys[key]
        out.update_func(gvar, peer_function(func, device, call=call))
        replaced[key] = call
    return out, replaced
