"""Build a Relax module into a runnable library for a target.

``build`` promises a TVM ``Executable``: with a MetaSchedule ``database`` it applies the best
schedule the database holds for each workload (for this target only: the database object is
scoped to one target) and falls back to TVM's default lowering for workloads without records;
without one it is the untuned fallback (naive loops on CPU: a fallback, never the product).
Both lower ``mod`` as tuning did (:mod:`compiler.lowering.pipeline`: the target's convolution layout
and, with a database, prepacked weights folded into the constants), so the library's ``main`` takes
the model's inputs in their own layout. Failures raise :class:`CompileError`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import tvm

from compiler.errors import CompileError
from compiler.lowering.pipeline import build_untuned, build_with_database
from compiler.peers import (
    library_for,
    library_unavailable_reason,
    load_peers,
    peer_library,
    peers_supported,
    zero_trial_call,
)
from compiler.target import TargetSpec
from compiler.weights.external import PARAMS_NAME, ExternalWeights, save_params


def build(
    mod: tvm.IRModule,
    target: TargetSpec,
    database: Any | None = None,
    peers: Collection[str] = (),
) -> Any:
    """Compile the normalized (unfused) Relax ``mod``; see the module docstring. ``peers``: the
    workload keys of the tasks built with their library peer (or a mapping from each key to
    the :class:`compiler.peers.PeerCall` variant to build, as a final build measured them;
    :mod:`compiler.peers`; without a ``database`` the other tasks get TVM's default schedules);
    export such an executable with ``link_peers``."""
    try:
        # CUDA always takes TuneHub's own CUDA pipeline (lowering._cuda_build: its GEMV
        # legalization and split-reduction rule, CUDA graphs), an empty database when untuned.
        if database is None and not peers and target.kind != "cuda":
            return build_untuned(mod, target)
        if peers:
            load_peers()  # the executable can then also run in this process, before export
        if database is None:
            from tvm.s_tir import meta_schedule as ms  # noqa: PLC0415 - only this path

            database = ms.database.MemoryDatabase()
        return build_with_database(mod, target, database, peers)
    except (RuntimeError, ValueError, TypeError) as err:  # TVM's errors (0.27 has no TVMError)
        raise CompileError(f"TVM failed to build the model for {target.describe()}: {err}") from err


def build_zero_trial(
    mod: tvm.IRModule, target: TargetSpec, tasks: Sequence[tuple[str, tvm.IRModule]]
) -> tuple[Any, frozenset[str]]:
    """The build without a tuning database (``tunehub compile`` with no ``--db``): every task of
    ``tasks`` (``(workload key, task module)``) that :func:`compiler.peers.zero_trial_peer`
    gives to its library peer uses it (the call :func:`compiler.peers.zero_trial_call`
    picks) (a CPU target with the current compile options: every
    task that has one; CUDA: half-precision GEMMs of several rows, on cuBLAS), and the others get
    TVM's default schedules (:mod:`compiler.lowering.default_schedules`; DLight on CUDA). Other
    targets, and a machine without the peer library, get :func:`build`'s untuned fallback for what
    has no peer. Returns the executable and the keys of the tasks built with their peer (export it
    with ``link_peers`` when any)."""
    if not peers_supported(target):
        return build(mod, target), frozenset()
    calls: dict[str, Any] = {}
    if library_for(target) is not None:
        calls = {key: call for key, task in tasks if (call := zero_trial_call(task, target))}
    keys = frozenset(calls)
    if target.kind == "cuda":
        return build(mod, target, peers=calls), keys
    from tvm.s_tir import meta_schedule as ms  # noqa: PLC0415 - only this path

    return build(mod, target, ms.database.MemoryDatabase(), peers=calls), keys


def export_library(
    executable: Any, path: Path, *, link_peers: bool = False, target: TargetSpec | None = None
) -> Path:
    """Write the executable as a shared library at ``path`` atomically (temp file + rename);
    an :class:`compiler.weights.external.ExternalWeights` also writes its weights as ``params.bin``
    beside it.
    ``link_peers``: link the peer shim and its library in (an executable built with ``peers``
    for ``target``, default a CPU target: OpenBLAS; CUDA: cuBLAS and cuDNN); raises
    :class:`CompileError` when this machine has no peer library for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    kwargs: dict[str, Any] = {}
    if link_peers:
        library = library_for(target) if target is not None else peer_library()
        if library is None:
            reason = (
                library_unavailable_reason(target)
                if target is not None
                else "no peer library on this machine"
            )
            raise CompileError(f"the artifact uses library peers: {reason}")
        kwargs = {"addons": [str(library.object_file)], "options": library.link_options()}
    weights = executable.params if isinstance(executable, ExternalWeights) else ()
    if weights:  # beside the library, written first: a library never lacks its weights
        fd, params_tmp = tempfile.mkstemp(suffix=".bin", prefix=".tmp-", dir=path.parent)
        os.close(fd)
        try:
            save_params(weights, params_tmp)
            os.replace(params_tmp, path.parent / PARAMS_NAME)
        except BaseException:
            Path(params_tmp).unlink(missing_ok=True)
            raise
        executable = executable.executable
    fd, tmp_name = tempfile.mkstemp(suffix=".so", prefix=".tmp-", dir=path.parent)
    os.close(fd)
    try:
        executable.export_library(tmp_name, **kwargs)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path
