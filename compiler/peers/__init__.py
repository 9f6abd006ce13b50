"""Library kernels as peers of tuned schedules (issue 21).

A task whose anchor is a GEMM or an NHWC convolution has one more candidate besides its
MetaSchedule records: the same fused PrimFunc with the anchor computed by OpenBLAS
(:mod:`compiler.peers.rewrite`; the epilogue stays TIR). The tuner measures it side by side with
the task's best schedules and the build takes it only for the tasks where it won
(:func:`apply_peers`); an artifact that uses one links the shim and OpenBLAS
(:mod:`compiler.peers.library`). Only CPU targets on the current compile options
(:data:`compiler.compile_options.CPU_DEFAULT`) have peers: legacy NCHW and CUDA targets keep
their paths.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import tvm
from tvm import tirx

from compiler.keys import workload_key
from compiler.peers.library import PeerLibrary, load_peers, peer_library, unavailable_reason
from compiler.peers.rewrite import PeerCall, find_peer, peer_function, peer_variants
from compiler.target import TargetSpec

__all__ = [
    "PeerCall",
    "PeerLibrary",
    "apply_peers",
    "find_peer",
    "load_peers",
    "peer_library",
    "peer_task_module",
    "peer_variants",
    "peers_supported",
    "unavailable_reason",
]


def peers_supported(target: TargetSpec) -> bool:
    """Whether ``target``'s build path can take library peers (see the module docstring)."""
    return target.kind == "cpu" and not target.compile_options.is_legacy


def _as_task(func: tirx.PrimFunc) -> tvm.IRModule:
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def peer_task_module(task_mod: tvm.IRModule, *, call: PeerCall | None = None
                     ) -> tvm.IRModule | None:
    """The peer of a task module (``extracted.dispatched[0]``) as a module that builds and runs
    with the task's arguments, or ``None`` when the task has no peer.
    ``call``: one of :func:`peer_variants` (default: :func:`find_peer`'s)."""
    if find_peer(task_mod) is None:
        return None
    return _as_task(peer_function(task_mod["main"], call=call))


def apply_peers(
    fused: tvm.IRModule, keys: Collection[str] | Mapping[str, PeerCall | None]
) -> tuple[tvm.IRModule, dict[str, Any]]:
    """``fused`` (:func:`compiler.lowering.fused_for_target`) with the PrimFunc of every task
    whose workload key is in ``keys`` replaced by its peer; returns the module and, by key, the
    :class:`PeerCall` each replaced task makes. Keys of tasks without a peer are ignored.
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
        call = find_peer(_as_task(func))
        if call is None:
            continue
        if isinstance(keys, Mapping) and keys[key] is not None:
            call = keys[key]
        out.update_func(gvar, peer_function(func, call=call))
        replaced[key] = call
    return out, replaced
