"""Write a verified artifact directory: ``model.so`` + ``manifest.json``, all or nothing.

``publish_artifact`` builds everything in a hidden sibling folder, verifies the library *as
loaded from disk* against the reference framework, and only then renames the folder into place.
On any failure (including a failed verification) no output directory is left behind. A
bucketed model (:mod:`compiler.shapes.buckets`) is verified at every bucket, and its manifest's
``model.buckets`` lists them with each one's VM function and input shapes (what
:class:`compiler.build.runner.LoadedLibrary` dispatches on when it loads the artifact).
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import tempfile
from collections.abc import Callable, Collection, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import tvm

from compiler.build.artifact_layout import LIBRARY_NAME, MANIFEST_NAME
from compiler.build.builder import export_library
from compiler.build.runner import LoadedLibrary
from compiler.build.verify import VerificationResult, bucket_padding, verify
from compiler.errors import ModelError, VerificationError
from compiler.frontends.model_spec import LoadedModel
from compiler.llm.verify import verify_generation
from compiler.lowering.pipeline import cuda_graphs_enabled
from compiler.peers import library_for, library_unavailable_reason, peer_library
from compiler.target import TargetSpec
from compiler.weights.external import PARAMS_NAME

MANIFEST_VERSION = 1


def check_output_dir(out_dir: Path, *, force: bool) -> None:
    """Refuse a non-empty existing output directory unless ``force`` (then it is replaced)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ModelError(
            "bad_output", f"output path {str(out_dir)!r} exists and is not a directory"
        )
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise ModelError(
            "bad_output",
            f"output directory {str(out_dir)!r} is not empty (use --force to replace it)",
        )


def build_manifest(
    model: LoadedModel,
    target: TargetSpec,
    tasks: list[dict[str, Any]],
    verification: VerificationResult,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    try:
        tunehub_version = version("tunehub")
    except PackageNotFoundError:  # pragma: no cover - running from a plain checkout
        tunehub_version = "unknown"
    manifest: dict[str, Any] = {
        "manifest_version": MANIFEST_VERSION,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "library": LIBRARY_NAME,
        "versions": {"tunehub": tunehub_version, "tvm": tvm.__version__},
        "model": model.describe(),
        "target": {
            "key": target.key,
            "kind": target.kind,
            "target": json.loads(target.target_json),
            "fingerprint": target.fingerprint,
            **({"cuda_graphs": cuda_graphs_enabled()} if target.kind == "cuda" else {}),
        },
        "tasks": tasks,
        "verification": verification.to_json(),
    }
    manifest.update(extra or {})
    return manifest


def peers_manifest(
    keys: Collection[str], target: TargetSpec | None = None
) -> dict[str, Any] | None:
    """The manifest's ``peers``: the library an artifact built with the peers of tasks ``keys``
    for ``target`` (default: a CPU target) needs at run time
    (:meth:`compiler.peers.PeerLibrary.describe`), those tasks and, when ``keys`` maps them to
    the :class:`compiler.peers.PeerCall` each makes, those calls; ``None`` when it uses none."""
    library = (library_for(target) if target is not None else peer_library()) if keys else None
    if library is None:
        return None
    out: dict[str, Any] = {"runtime_library": library.describe(), "tasks": sorted(keys)}
    if isinstance(keys, Mapping):  # the variant each task calls (e.g. a Winograd algorithm)
        out["calls"] = {
            key: call.to_json() for key, call in sorted(keys.items()) if call is not None
        }
    return out


def peers_extra(keys: Collection[str], target: TargetSpec) -> dict[str, Any]:
    """The manifest fields about peers of a build that used the peers of tasks ``keys``:
    ``peers`` (:func:`peers_manifest`) and, when it used none because ``target`` has no peer
    library here, ``peers_skipped`` (why)."""
    out: dict[str, Any] = {"peers": peers_manifest(keys, target)}
    if not keys and (reason := library_unavailable_reason(target)):
        out["peers_skipped"] = reason
    return out


def publish_artifact(
    executable: Any,
    model: LoadedModel,
    target: TargetSpec,
    out_dir: Path,
    *,
    tasks: list[dict[str, Any]],
    extra: dict[str, Any] | Callable[[LoadedLibrary], dict[str, Any]] | None = None,
    force: bool = False,
    link_peers: bool = False,
    not_run_because: str | None = None,
) -> dict[str, Any]:
    """Export, verify from disk, write the manifest and move the directory into place.

    ``extra`` adds manifest fields (or is called with the loaded library, e.g. to time it).
    ``link_peers``: the executable calls library peers (``build(..., peers=...)``); the shim and
    OpenBLAS are linked into ``model.so``.
    ``not_run_because``: this machine cannot run ``target``'s code (another CPU, no GPU), so the
    library is built and written but neither loaded nor verified; the manifest's
    ``verification`` says it did not pass and why, and ``extra`` must be a mapping.
    Returns the manifest. Raises :class:`VerificationError` (nothing written) when the library's
    outputs do not match the reference, :class:`ModelError` for a bad ``out_dir``.
    """
    out_dir = out_dir.absolute()
    check_output_dir(out_dir, force=force)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        library_path = export_library(
            executable, staging / LIBRARY_NAME, link_peers=link_peers, target=target
        )
        weights = staging / PARAMS_NAME  # a large model's weights, beside the library
        extra_weights = (
            {"weights": {"file": PARAMS_NAME, "bytes": weights.stat().st_size}}
            if weights.is_file()
            else {}
        )
        if not_run_because is not None:
            manifest = build_manifest(model, target, tasks, _NOT_RUN, extra)  # type: ignore[arg-type]
            manifest.update(extra_weights)
            manifest["verification"]["message"] = f"not run: {not_run_because}"
            (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
            _move_into_place(staging, out_dir)
            return manifest
        library = LoadedLibrary(
            library_path,
            target.device,
            buckets=[b.to_json() for b in model.buckets],
            state=model.state,
        )
        verification = verify(model, library.run_fresh, device=target.device)
        if not verification.passed:
            raise VerificationError(f"artifact not published: the library {verification.message}")
        decoder = bool(model.state) or model.past_present is not None
        generation = verify_generation(model, library) if decoder else None
        if generation is not None and not generation.passed and _available(generation):
            raise VerificationError(f"artifact not published: the library's {generation.message}")
        if model.bucket_spec is not None and not decoder:  # may inputs be padded?
            library.padding = bucket_padding(model, library, device=target.device)
        extra_fields = extra(library) if callable(extra) else extra
        manifest = build_manifest(model, target, tasks, verification, extra_fields)
        if generation is not None:
            manifest["generation"] = generation.to_json()
        manifest.update(extra_weights)
        if library.padding is not None:
            manifest["model"]["buckets"]["padding"] = library.padding.to_json()
        (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
        _move_into_place(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


def _available(generation: Any) -> bool:
    """Whether a generation check could run at all (a past/present decoder whose padding was
    refused cannot generate: the manifest says why, and the library is still published)."""
    return bool(getattr(generation, "available", True))


#: The verification of a library that was built but not run here (``not_run_because``).
_NOT_RUN = VerificationResult(False, "none", 0.0, (), "not run")


def _move_into_place(staging: Path, out_dir: Path) -> None:
    if out_dir.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        out_dir.rename(trash / "old")
        staging.rename(out_dir)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        staging.rename(out_dir)
