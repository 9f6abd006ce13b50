"""Stable keys for tuning workloads.

A workload (one fused subgraph's TIR, as an ``IRModule``) is keyed by its structural hash, so two
models that contain the same subgraph share one key, whatever the functions are named. The tuning
database, the task table and the API all use :func:`workload_key`; nothing else may hash workloads.
"""

from __future__ import annotations

import tvm_ffi

_MASK64 = (1 << 64) - 1


def workload_key(mod: object) -> str:
    """Return the 16-hex-digit structural hash of a workload ``IRModule`` (names ignored)."""
    return f"{tvm_ffi.structural_hash(mod) & _MASK64:016x}"
