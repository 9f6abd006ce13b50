"""Compilation targets and the hardware they run on.

A :class:`TargetSpec` is what every tuning record is stored against: the canonical target JSON
(sorted keys of ``Target.export()``, since ``str(Target)`` is not canonical) plus a hardware
fingerprint (CPU model and cores, GPU name later) and the TVM version. Records tuned for one
``mcpu``, core count or GPU are not evidence for another, so all of these are part of the key.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import tvm

from compiler.errors import ModelError


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


def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


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
    def device(self) -> str:
        """The TVM runtime device string for this target (``"cpu"`` or ``"cuda"``)."""
        return "cuda" if self.kind == "cuda" else "cpu"

    def describe(self) -> str:
        fp = self.fingerprint
        if self.kind == "cuda":
            return f"cuda ({fp.get('gpu', '?')})"
        return f"cpu {fp.get('mcpu')} x{fp.get('cores')} ({fp.get('cpu_model')})"


def cpu_target(num_cores: int | None = None) -> TargetSpec:
    """The CPU target for this machine: LLVM with the host's ``mcpu`` (never plain SSE code).

    ``num_cores`` defaults to the cores this process may use.
    """
    cores = num_cores or _usable_cores()
    if cores < 1:
        raise ModelError("bad_target", f"num_cores must be at least 1, got {cores}")
    mcpu = str(tvm.target.codegen.llvm_get_system_cpu())
    target = tvm.target.Target({"kind": "llvm", "num-cores": cores, "mcpu": mcpu})
    fingerprint = {
        "arch": platform.machine(),
        "cores": cores,
        "cpu_model": _cpu_model_name(),
        "mcpu": mcpu,
    }
    return TargetSpec(
        kind="cpu",
        target_json=canonical_target_json(target),
        fingerprint_json=json.dumps(fingerprint, sort_keys=True, separators=(",", ":")),
    )


def resolve_target(name: str, num_cores: int | None = None) -> TargetSpec:
    """Map a user-facing target name to a :class:`TargetSpec`.

    Raises :class:`ModelError` (code ``bad_target``) for names TuneHub does not support here.
    """
    if name in ("cpu", "llvm"):
        return cpu_target(num_cores)
    raise ModelError("bad_target", f"unknown target {name!r}: supported targets are 'cpu'")
