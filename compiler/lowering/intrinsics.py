"""Register only the tensor intrinsics a target can use.

MetaSchedule's ``TuneContext`` runs ``import tvm.s_tir.tensor_intrin``, whose package imports the
intrinsics of every backend (CUDA, ROCm, Hexagon, ARM, RISC-V, x86) by parsing TVMScript: 11 s on
an idle 2-core machine and ~60 s under load, in every process that tunes. A CPU target needs
only its own architecture's intrinsics (0.4 s for x86). :func:`load_tensor_intrinsics` installs
the package as a namespace without running its ``__init__`` and imports just the submodules the
target kind needs; later ``import tvm.s_tir.tensor_intrin`` statements find it already loaded.
Submodules stay importable on demand (``import tvm.s_tir.tensor_intrin.cuda``).
"""

from __future__ import annotations

import importlib
import importlib.util
import platform
import sys
import threading
import types

_PACKAGE = "tvm.s_tir.tensor_intrin"
_lock = threading.Lock()

_SUBMODULES = {
    "cpu": {"x86_64": ("x86",), "aarch64": ("arm_cpu",), "riscv64": ("riscv_cpu",)},
    "cuda": ("cuda",),
}


def _install_namespace() -> None:
    if _PACKAGE in sys.modules:
        return
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or spec.submodule_search_locations is None:  # pragma: no cover
        raise ImportError(f"{_PACKAGE} not found")
    namespace = types.ModuleType(_PACKAGE, "Tensor intrinsics, loaded per target by TuneHub.")
    namespace.__path__ = list(spec.submodule_search_locations)
    namespace.__package__ = _PACKAGE
    namespace.__spec__ = spec
    sys.modules[_PACKAGE] = namespace


def load_tensor_intrinsics(target_kind: str) -> tuple[str, ...]:
    """Make the intrinsics of ``target_kind`` (``"cpu"`` or ``"cuda"``) available; return the
    submodules imported. Idempotent and thread-safe."""
    if target_kind == "cpu":
        names = _SUBMODULES["cpu"].get(platform.machine(), ())
    else:
        names = _SUBMODULES.get(target_kind, ())
    with _lock:
        _install_namespace()
        for name in names:
            importlib.import_module(f"{_PACKAGE}.{name}")
    return tuple(names)
