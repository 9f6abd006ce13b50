"""The peer library on this machine: OpenBLAS (and oneDNN) behind a small C++ shim.

Library peers (:mod:`compiler.peers.rewrite`) call the C entry points of ``shim.cc``
(``tunehub_peer_gemm``, ``tunehub_peer_conv2d_nhwc``: OpenBLAS ``sgemm``; the convolution as
im2col + ``sgemm``; ``tunehub_peer_gemm_packed``, ``tunehub_peer_conv2d_nhwc_packed``: the same
on the shim's own GEMM, whose micro-kernels (AVX-512, or AVX2 + FMA; chosen by the CPU's
features, ``TUNEHUB_PEERS_ISA=avx2|none`` caps the choice, for tests) read the weight packed
once and cached, OpenBLAS where neither ISA is there; ``tunehub_peer_conv2d_nhwc_winograd``: a
3x3 stride-1 convolution as Winograd F(2x2, 3x3) or F(4x4, 3x3), its GEMMs on the packed
kernels; ``tunehub_peer_depthwise_conv2d_nhwc``: a depthwise convolution, vectors along the
channels; each also does the task's bias, residual add and clamp as it stores its output).
The BLAS is OpenBLAS from PyPI's ``scipy-openblas32`` wheel (a dependency of TuneHub, so
``pip install`` brings it; DYNAMIC_ARCH, so one binary picks its kernels for the CPU it runs
on); without it, the ILP64 OpenBLAS that numpy's own wheel bundles (the same build, 64-bit
sizes). :func:`peer_library` compiles the shim once per machine and BLAS into the cache
(``TUNEHUB_CACHE_DIR``, default ``~/.cache/tunehub``) with the system C++ compiler (it needs
no header: the BLAS and TVM's thread pool are declared in the shim):

- ``libtunehub_peers.so``, loaded ``RTLD_GLOBAL`` into a process (:meth:`PeerLibrary.load`) so
  that peer kernels built without it resolve their calls to it (MetaSchedule's runner, the
  re-measurement, an executable run before export);
- ``tunehub_peers.o``, linked into an artifact's ``model.so`` (:meth:`PeerLibrary.link_options`)
  so that a fresh process loading the artifact needs only the TVM runtime and OpenBLAS.

Where oneDNN is installed (PyPI's ``onednn-cpu-gomp`` and ``onednn-devel-cpu-gomp``, TuneHub
dependencies on x86-64 Linux), the shim is built with ``shim_onednn.inc`` too: convolutions and
depthwise convolutions by oneDNN's primitives (``tunehub_peer_*_onednn``, the ``onednn``
algorithm of :mod:`compiler.peers.algorithms`), and artifacts that link the shim then need
``libdnnl.so.3`` as well. Without it (or with ``TUNEHUB_ONEDNN=0``, or where the build against
it fails) the shim is built without those entry points, the ``onednn`` variants are not
offered, and :func:`onednn_unavailable_reason` says why.

Threads: each call's work is split into blocks on TVM's own thread pool, each block computed
single-threaded by the library, so the library uses exactly TVM's threads.
:func:`peer_library` returns ``None`` (and :func:`unavailable_reason` says why) on a machine
without the wheel or a compiler: peers are then skipped and builds use tuned schedules only.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, replace
from importlib.metadata import PackageNotFoundError, distribution, version
from pathlib import Path
from typing import Any

SHIM_SOURCE = Path(__file__).with_name("shim.cc")
#: A quoted ``#include`` of a shim source (its kernels, by concept: ``shim_*.inc``; the oneDNN
#: peers, ``shim_onednn.inc``), resolved next to ``shim.cc``: one translation unit.
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.MULTILINE)
#: Warning flags of every shim build (``-Wpsabi`` only notes that a vector type crosses a function
#: with per-function target attributes: the shim's kernels are compiled for one ISA each).
WARNINGS = ("-Wall", "-Wextra", "-Wno-psabi")
LIBRARY = "openblas"
#: The oneDNN wheels the shim is built against (the runtime library, the headers).
ONEDNN_PACKAGES = ("onednn-cpu-gomp", "onednn-devel-cpu-gomp")


@dataclass(frozen=True)
class PeerLibrary:
    """A built shim: the shared library to load, the object to link, and what it calls."""

    shared: Path
    object_file: Path
    blas: Blas
    shim_hash: str
    onednn: OneDnn | None = None
    #: Why :attr:`onednn` is ``None`` (empty when it is not).
    onednn_reason: str = ""

    def load(self) -> None:
        """Load the shim ``RTLD_GLOBAL`` into this process, so that peer kernels built without
        it resolve their calls to it (idempotent). Raises ``OSError`` when it cannot load."""
        _load(str(self.shared))

    def link_options(self) -> list[str]:
        """The linker options a ``model.so`` with :attr:`object_file` linked in needs."""
        onednn = self.onednn.link_flags() if self.onednn is not None else []
        return ["-Wl,--no-as-needed", *self.blas.link_flags(), *onednn]

    def describe(self) -> dict[str, Any]:
        """What an artifact's manifest says it needs at run time."""
        out = {
            "library": LIBRARY,
            "package": self.blas.package,
            "version": self.blas.version,
            "path": str(self.blas.path),
            "shim": self.shim_hash,
        }
        if self.onednn is not None:
            out["onednn"] = self.onednn.describe()
        return out

    def describe_for(self, call: Any) -> dict[str, Any]:
        """What a measurement of ``call`` (a :class:`compiler.peers.calls.PeerCall`) ran:
        oneDNN (package, version, the shim) for its ``onednn`` variants, else OpenBLAS and the
        shim (:meth:`describe` without the other library)."""
        if call.algorithm == "onednn" and self.onednn is not None:
            return {"library": "onednn", **self.onednn.describe(), "shim": self.shim_hash}
        return {key: value for key, value in self.describe().items() if key != "onednn"}


@dataclass(frozen=True)
class Blas:
    """An OpenBLAS shared library: where it is, which package brought it, whether it is the
    ILP64 build (``scipy_*64_`` symbols)."""

    path: Path
    package: str
    version: str
    ilp64: bool

    def link_flags(self) -> list[str]:
        return [f"-L{self.path.parent}", f"-l:{self.path.name}", f"-Wl,-rpath,{self.path.parent}"]

    def defines(self) -> list[str]:
        return ["-DTUNEHUB_BLAS_ILP64"] if self.ilp64 else []


@dataclass(frozen=True)
class OneDnn:
    """oneDNN from its PyPI wheels: the folder of ``libdnnl.so.3``, the include folder, the
    version."""

    lib_dir: Path
    include_dir: Path
    version: str

    def compile_flags(self) -> list[str]:
        return ["-DTUNEHUB_ONEDNN", f"-I{self.include_dir}"]

    def link_flags(self) -> list[str]:
        return [f"-L{self.lib_dir}", "-l:libdnnl.so.3", f"-Wl,-rpath,{self.lib_dir}", "-lgomp"]

    def describe(self) -> dict[str, str]:
        return {
            "package": ONEDNN_PACKAGES[0],
            "version": self.version,
            "path": str(self.lib_dir / "libdnnl.so.3"),
        }


def find_onednn() -> OneDnn:
    """oneDNN's wheels (:data:`ONEDNN_PACKAGES`). Raises ``RuntimeError`` when they are not
    installed or turned off (``TUNEHUB_ONEDNN=0``)."""
    if os.environ.get("TUNEHUB_ONEDNN", "1").strip() == "0":
        raise RuntimeError("turned off (TUNEHUB_ONEDNN=0)")
    found: dict[str, Path] = {}
    for package, wanted in zip(ONEDNN_PACKAGES, ("libdnnl.so.3", "dnnl.hpp")):
        try:
            dist = distribution(package)
        except PackageNotFoundError:
            raise RuntimeError(f"oneDNN is not installed (pip install {package})") from None
        path = next((dist.locate_file(f) for f in dist.files or [] if f.name == wanted), None)
        if path is None or not Path(path).exists():
            raise RuntimeError(f"{package} has no {wanted}")
        found[wanted] = Path(path).resolve()
    include = found["dnnl.hpp"].parent
    include = include.parent.parent if include.name == "dnnl" else include
    return OneDnn(found["libdnnl.so.3"].parent, include, version(ONEDNN_PACKAGES[0]))


def find_blas() -> Blas:
    """``scipy-openblas32``'s OpenBLAS, else numpy's bundled one. Raises ``RuntimeError``."""
    try:
        import scipy_openblas32  # noqa: PLC0415 - optional

        path = Path(scipy_openblas32.get_lib_dir()) / "libscipy_openblas.so"
        if path.exists():
            return Blas(path, "scipy-openblas32", version("scipy-openblas32"), ilp64=False)
    except (ImportError, PackageNotFoundError):
        pass
    import numpy  # noqa: PLC0415

    libs = Path(numpy.__file__).resolve().parent.parent / "numpy.libs"
    found = sorted(libs.glob("libscipy_openblas64_*.so"))
    if found:
        return Blas(found[0], "numpy", numpy.__version__, ilp64=True)
    raise RuntimeError("no OpenBLAS found (pip install scipy-openblas32)")


@functools.cache
def _load(path: str) -> None:
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def _cache_dir() -> Path:
    return Path(os.environ.get("TUNEHUB_CACHE_DIR", Path.home() / ".cache" / "tunehub"))


def _compile(source: Path, out: Path, flags: list[str]) -> None:
    """Compile into ``out`` atomically (a temp name, then a rename: concurrent processes race
    harmlessly). Raises ``RuntimeError`` with the compiler's message."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=out.suffix)
    os.close(fd)
    try:
        done = subprocess.run([*flags, str(source), "-o", tmp], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"building the peer shim failed: {done.stderr.strip()[-800:]}")
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)


def shim_sources() -> list[Path]:
    """``shim.cc`` and every file it includes with quotes (recursively, each once, in the order
    they are reached): what a build of the shim compiles, so what its cache key hashes (a change
    in any of them builds the shim anew). The oneDNN peers are among them whether or not a build
    uses them."""
    found: list[Path] = []
    pending = [SHIM_SOURCE]
    while pending:
        path = pending.pop(0)
        if path in found:
            continue
        found.append(path)
        pending += [path.parent / name for name in _INCLUDE.findall(path.read_text())]
    return found


def cxx() -> str:
    """The C++ compiler the shims are built with (``$CXX``, else ``g++``/``c++``). Raises
    ``RuntimeError`` when there is none."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++) on this machine")
    return compiler


def _build() -> PeerLibrary:
    """The shim with oneDNN where it is there and builds, else without (the library's
    ``onednn_reason`` says why); raises ``RuntimeError`` (no compiler, no BLAS, a shim that
    does not build)."""
    try:
        onednn = find_onednn()
    except RuntimeError as err:
        return replace(_build_with(None), onednn_reason=str(err))
    try:
        return _build_with(onednn)
    except RuntimeError as err:
        reason = f"the shim did not build against oneDNN {onednn.version}: {err}"
        logging.getLogger("tunehub.peers").warning("%s", reason)
        return replace(_build_with(None), onednn_reason=reason)


def _build_with(onednn: OneDnn | None) -> PeerLibrary:
    import tvm  # noqa: PLC0415

    compiler = cxx()
    blas = find_blas()
    runtime_dir = Path(tvm.__file__).parent / "lib"
    sources = b"".join(path.read_bytes() for path in shim_sources())
    source_hash = hashlib.sha256(sources + str(blas).encode() + str(onednn).encode()).hexdigest()[
        :16
    ]
    folder = _cache_dir() / "peers" / source_hash
    common = [
        compiler,
        "-O3",
        "-std=c++17",
        "-fPIC",
        *WARNINGS,
        *blas.defines(),
        *(onednn.compile_flags() if onednn is not None else []),
    ]
    obj = folder / "tunehub_peers.o"
    shared = folder / "libtunehub_peers.so"
    if not obj.exists():
        _compile(SHIM_SOURCE, obj, [*common, "-c"])
    if not shared.exists():
        _compile(
            SHIM_SOURCE,
            shared,
            [
                *common,
                "-shared",
                "-Wl,--no-as-needed",
                *blas.link_flags(),
                *(onednn.link_flags() if onednn is not None else []),
                f"-L{runtime_dir}",
                "-ltvm_runtime",
                f"-Wl,-rpath,{runtime_dir}",
            ],
        )
    return PeerLibrary(shared, obj, blas, source_hash, onednn)


@functools.cache
def _built() -> tuple[PeerLibrary | None, str]:
    return build_or_reason(_build)


def build_or_reason(build: Any) -> tuple[Any, str]:
    """``(build(), "")``, or ``(None, why not)``: peers turned off (``TUNEHUB_PEERS=0``), or
    ``build`` raised for a missing compiler, library or package (what a peer library's
    ``unavailable_reason`` reports)."""
    if os.environ.get("TUNEHUB_PEERS", "1").strip() == "0":
        return None, "turned off (TUNEHUB_PEERS=0)"
    try:
        return build(), ""
    except (ImportError, PackageNotFoundError, RuntimeError, OSError) as err:
        return None, str(err)


def peer_library() -> PeerLibrary | None:
    """This machine's peer library, built on first use; ``None`` when it cannot be had."""
    return _built()[0]


def unavailable_reason() -> str:
    """Why :func:`peer_library` is ``None`` (empty when it is not)."""
    return _built()[1]


def onednn_available() -> bool:
    """Whether this machine's peer library has the oneDNN peers."""
    library = peer_library()
    return library is not None and library.onednn is not None


def onednn_unavailable_reason() -> str:
    """Why :func:`onednn_available` is false (empty when it is not)."""
    library = peer_library()
    return unavailable_reason() if library is None else library.onednn_reason


def load_peers() -> None:
    """Load the shim into this process when the library is available (a runner worker's
    initializer; must be importable by reference). Never raises: a shim that does not load is
    logged, and the peers measured in this process then fail like any candidate that does not
    run."""
    library = peer_library()
    if library is None:
        return
    try:
        library.load()
    except OSError as err:
        logging.getLogger("tunehub.peers").warning("the peer library did not load: %s", err)
