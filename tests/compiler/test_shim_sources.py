"""The C++ shims compile without a warning under ``-Wall -Wextra`` (the flags every shim build
uses, :data:`compiler.peers.library.WARNINGS`), and ``pip install .`` ships every shim source."""

from __future__ import annotations

import fnmatch
import subprocess
import tomllib
from pathlib import Path

import pytest

from compiler.peers import library
from compiler.peers.cuda_library import SHIM_SOURCE as CUDA_SHIM

ROOT = Path(__file__).resolve().parents[2]


def _syntax_check(source: Path, extra: list[str]) -> subprocess.CompletedProcess[str]:
    flags = [library.cxx(), "-std=c++17", "-fsyntax-only", *library.WARNINGS, "-Werror", *extra]
    return subprocess.run([*flags, str(source)], capture_output=True, text=True, check=False)


def test_the_cpu_shim_compiles_without_warnings() -> None:
    try:
        blas, onednn = library.find_blas(), library.find_onednn()
    except (OSError, RuntimeError) as err:
        pytest.skip(f"no BLAS/oneDNN to compile the CPU shim against: {err}")
    done = _syntax_check(library.SHIM_SOURCE, [*blas.defines(), *onednn.compile_flags()])
    assert done.returncode == 0, done.stderr


def test_the_cuda_shim_compiles_without_warnings() -> None:
    done = _syntax_check(CUDA_SHIM, [])
    assert done.returncode == 0, done.stderr


def test_every_shim_source_is_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["compiler.peers"]
    sources = {
        p.name for p in (ROOT / "compiler" / "peers").iterdir() if p.suffix in (".cc", ".inc")
    }
    # setuptools matches package-data entries as glob patterns (``shim_*.inc``).
    missing = {s for s in sources if not any(fnmatch.fnmatchcase(s, p) for p in patterns)}
    assert not missing, f"not shipped by pip install: {sorted(missing)}"
