"""The CUDA peer library on this machine: cuBLAS and cuDNN behind a small C++ shim
(``shim_cuda.cc``).

A CUDA task whose anchor is a GEMM (float32, or float16 with float32 accumulation) or an NCHW
float32 convolution has one more candidate: the same PrimFunc with the anchor computed by
``cublasGemmEx`` / ``cublasGemmStridedBatchedEx`` or ``cudnnConvolutionForward`` from its host
code (:func:`compiler.peers.rewrite.peer_function` with ``device="cuda"``; the epilogue stays
one TIR kernel). cuBLAS and cuDNN are the ones torch's CUDA wheels bring (PyPI
``nvidia-cublas*``, ``nvidia-cudnn*``), else the CUDA toolkit's (``/usr/local/cuda``). Like the
CPU shim (:mod:`compiler.peers.library`), :func:`cuda_peer_library` compiles it once per
machine into the cache (``TUNEHUB_CACHE_DIR``) with the system C++ compiler and no header:

- ``libtunehub_cuda_peers.so``, loaded ``RTLD_GLOBAL`` into a measuring process;
- ``tunehub_cuda_peers.o``, linked into an artifact's ``model.so`` with cuBLAS, cuDNN, the CUDA
  driver
  and tvm-ffi (for TVM's current stream), so a fresh process needs only those and the TVM
  runtime.

:func:`cuda_peer_library` returns ``None`` (and :func:`cuda_unavailable_reason` says why) on a
machine without cuBLAS, cuDNN, the CUDA driver or a compiler, or with ``TUNEHUB_PEERS=0``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from compiler.peers.library import WARNINGS, _cache_dir, _compile, _load, build_or_reason, cxx

SHIM_SOURCE = Path(__file__).with_name("shim_cuda.cc")
LIBRARY = "cublas"


@dataclass(frozen=True)
class SharedLibrary:
    """A system or wheel shared library a shim links: its file, and what brought it."""

    path: Path
    package: str
    version: str

    def link_flags(self) -> list[str]:
        return [f"-L{self.path.parent}", f"-l:{self.path.name}", f"-Wl,-rpath,{self.path.parent}"]


@dataclass(frozen=True)
class CudaPeerLibrary:
    """A built CUDA shim; the same interface as :class:`compiler.peers.library.PeerLibrary`."""

    shared: Path
    object_file: Path
    cublas: SharedLibrary
    links: tuple[SharedLibrary, ...]  # cuDNN, the CUDA driver, tvm-ffi
    shim_hash: str

    def load(self) -> None:
        """Load the shim ``RTLD_GLOBAL`` into this process (idempotent); ``OSError`` if not."""
        _load(str(self.shared))

    def link_options(self) -> list[str]:
        """The linker options a ``model.so`` with :attr:`object_file` linked in needs."""
        flags = ["-Wl,--no-as-needed", *self.cublas.link_flags()]
        for item in self.links:
            flags += item.link_flags()
        return flags

    def describe(self) -> dict[str, Any]:
        """What an artifact's manifest says it needs at run time."""
        cudnn = self.links[0]
        return {
            "library": LIBRARY,
            "package": self.cublas.package,
            "version": self.cublas.version,
            "path": str(self.cublas.path),
            "cudnn": {"package": cudnn.package, "version": cudnn.version, "path": str(cudnn.path)},
            "shim": self.shim_hash,
        }

    def describe_for(self, call: Any) -> dict[str, Any]:
        """What a measurement of ``call`` ran (every CUDA peer: :meth:`describe`)."""
        return self.describe()


def _versioned(folder: Path, stem: str) -> Path | None:
    """``folder/stem.so.N`` (the highest N), else ``folder/stem.so``, else ``None``."""
    found = sorted(folder.glob(f"{stem}.so.*"), key=lambda p: len(p.name))
    found = [p for p in found if re.fullmatch(rf"{stem}\.so\.\d+", p.name)] or found
    plain = folder / f"{stem}.so"
    return found[0] if found else plain if plain.exists() else None


def _find_nvidia(package: str, stem: str) -> SharedLibrary:
    """``stem.so.N`` from a PyPI ``nvidia-<package>*`` wheel, else the CUDA toolkit's. Raises
    ``RuntimeError``."""
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if not name.startswith(f"nvidia-{package}"):
            continue
        for file in dist.files or ():
            if re.fullmatch(rf"{stem}\.so\.\d+", Path(str(file)).name):
                return SharedLibrary(
                    Path(str(dist.locate_file(file))).resolve(), name, dist.version
                )
    for folder in (Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "lib64",):
        path = _versioned(folder, stem)
        if path is not None:
            return SharedLibrary(path, "cuda-toolkit", path.name.rsplit(".so.", 1)[-1])
    raise RuntimeError(f"no {stem} found (torch's CUDA wheels bring nvidia-{package})")


def find_cublas() -> SharedLibrary:
    """cuBLAS from a PyPI ``nvidia-cublas*`` wheel, else the CUDA toolkit's."""
    return _find_nvidia("cublas", "libcublas")


def find_cudnn() -> SharedLibrary:
    """cuDNN from a PyPI ``nvidia-cudnn*`` wheel, else the CUDA toolkit's."""
    return _find_nvidia("cudnn", "libcudnn")


def find_cuda_driver() -> SharedLibrary:
    """The CUDA driver library (``libcuda.so.1``) as the dynamic linker knows it. Raises
    ``RuntimeError``."""
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    except OSError:
        listing = ""
    for line in listing.splitlines():
        if line.strip().startswith("libcuda.so.1 ") and "x86-64" in line:
            return SharedLibrary(Path(line.rsplit("=>", 1)[-1].strip()), "cuda-driver", "")
    for folder in (
        Path("/usr/lib/x86_64-linux-gnu"),
        Path("/usr/lib64"),
        Path("/usr/local/cuda/compat"),
    ):
        if (folder / "libcuda.so.1").exists():
            return SharedLibrary(folder / "libcuda.so.1", "cuda-driver", "")
    raise RuntimeError("no CUDA driver (libcuda.so.1) on this machine")


def _tvm_ffi() -> SharedLibrary:
    import tvm_ffi  # noqa: PLC0415

    path = Path(tvm_ffi.__file__).parent / "lib" / "libtvm_ffi.so"
    return SharedLibrary(path, "apache-tvm-ffi", metadata.version("apache-tvm-ffi"))


def _build() -> CudaPeerLibrary:
    compiler = cxx()
    cublas, links = find_cublas(), (find_cudnn(), find_cuda_driver(), _tvm_ffi())
    source_hash = hashlib.sha256(
        SHIM_SOURCE.read_bytes() + str((cublas, links)).encode()
    ).hexdigest()[:16]
    folder = _cache_dir() / "peers" / f"cuda-{source_hash}"
    common = [compiler, "-O2", "-std=c++17", "-fPIC", *WARNINGS]
    obj, shared = folder / "tunehub_cuda_peers.o", folder / "libtunehub_cuda_peers.so"
    if not obj.exists():
        _compile(SHIM_SOURCE, obj, [*common, "-c"])
    if not shared.exists():
        flags = ["-shared", "-Wl,--no-as-needed", *cublas.link_flags()]
        for item in links:
            flags += item.link_flags()
        _compile(SHIM_SOURCE, shared, [*common, *flags])
    return CudaPeerLibrary(shared, obj, cublas, links, source_hash)


@functools.cache
def _built() -> tuple[CudaPeerLibrary | None, str]:
    return build_or_reason(_build)


def cuda_peer_library() -> CudaPeerLibrary | None:
    """This machine's CUDA peer library, built on first use; ``None`` when it cannot be had."""
    return _built()[0]


def cuda_unavailable_reason() -> str:
    """Why :func:`cuda_peer_library` is ``None`` (empty when it is not)."""
    return _built()[1]
