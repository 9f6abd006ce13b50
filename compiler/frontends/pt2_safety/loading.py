"""The entry points that load an untrusted ``.pt2`` file as ``ExportedProgram`` s
(:func:`load_exported_programs`, :func:`load_exported_program`): the archive inspection, the
program count, torch's loader under :mod:`compiler.frontends.pt2_safety.hardened`, the checks on the
loaded graph, and one user-facing ``ModelError`` for whatever torch raised."""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from typing import TYPE_CHECKING, BinaryIO

from compiler.errors import ModelError
from compiler.frontends.pt2_safety.archive import inspect_pt2_archive
from compiler.frontends.pt2_safety.constants import (
    DEFAULT_MAX_MEMBERS,
    DEFAULT_MAX_PROGRAMS,
    DEFAULT_MAX_UNCOMPRESSED_BYTES,
    MODELS_DIR,
)
from compiler.frontends.pt2_safety.expressions import validate_guard_code
from compiler.frontends.pt2_safety.hardened import _hardened_torch_loading, _Refused

if TYPE_CHECKING:  # torch is imported lazily: inspecting a file must not need it
    import torch


def _describe_load_failure(exc: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    lines = [line.strip() for line in text.splitlines() if line.strip()] or [type(exc).__name__]
    if isinstance(exc, _Refused):
        return f"refusing .pt2 file: {lines[0][:300]}"
    if isinstance(exc, pickle.UnpicklingError) or "weights only load failed" in text.lower():
        detail = next(
            (
                line
                for line in lines
                if re.search(r"WeightsUnpickler error:|GLOBAL|Unsupported|blocked", line)
            ),
            lines[0],
        )
        detail = detail.removeprefix("WeightsUnpickler error:").strip().split(". ")[0]
        return (
            "could not load the .pt2 file: PyTorch's weights-only unpickler refused one of its "
            f"pickled members ({detail[:300]})"
        )
    return (
        f"could not load the .pt2 file ({type(exc).__name__}: {lines[0][:300]}). TuneHub loads "
        "programs written by torch.export.save with PyTorch 2.13; re-export the model and upload "
        "the .pt2 file unchanged"
    )


_NODE_TARGET = re.compile(r"Failed deserializing node Node\(target='torch\.ops\.([\w.]+)'")


def _unknown_operator(exc: BaseException) -> str | None:
    """``ns.op.overload`` when torch failed to load a graph node calling an operator it does not
    know (one a library registers at import, like ``transformers::grouped_mm_fallback``)."""
    import torch

    match = _NODE_TARGET.search(str(exc))
    if match is None:
        return None
    name = match.group(1)
    namespace, _, rest = name.partition(".")
    try:
        packet = getattr(getattr(torch.ops, namespace), rest.partition(".")[0])
        getattr(packet, rest.partition(".")[2] or "default")
    except (AttributeError, RuntimeError):
        return name
    return None


def _check_loaded_program(ep: torch.export.ExportedProgram) -> None:
    """Defense in depth on the loaded graph: operator targets and guard code (run by
    ``ep.module()``)."""
    from torch._export.verifier import Verifier
    from torch._ops import HigherOrderOperator, OpOverload

    builtin_ops = Verifier().allowed_builtin_ops()
    for node in ep.graph.nodes:
        if node.op in ("call_module", "call_method"):
            raise ModelError(
                "unsafe_pt2", f"refusing .pt2 file: graph node {node.name} is a {node.op} node"
            )
        if node.op == "call_function" and not (
            isinstance(node.target, (OpOverload, HigherOrderOperator))
            or any(node.target is op for op in builtin_ops)
        ):
            raise ModelError(
                "unsafe_pt2",
                f"refusing .pt2 file: graph node {node.name} calls {node.target!r}, not an "
                "operator",
            )
    for guard in getattr(ep, "_guards_code", None) or []:
        validate_guard_code(guard)


def load_exported_program(
    path: str | os.PathLike[str],
    *,
    max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES,
    max_members: int = DEFAULT_MAX_MEMBERS,
    display_name: str | None = None,
) -> torch.export.ExportedProgram:
    """Load an untrusted single-program ``.pt2`` file as an ``ExportedProgram`` without executing
    code from it (:func:`load_exported_programs`; an archive of several programs is refused with
    ``bad_pt2``)."""
    programs = load_exported_programs(
        path,
        max_uncompressed_bytes=max_uncompressed_bytes,
        max_members=max_members,
        display_name=display_name,
    )
    if len(programs) != 1:
        display = display_name or os.path.basename(os.fspath(path))
        raise ModelError(
            "bad_pt2",
            f".pt2 file {display!r} holds {len(programs)} programs "
            f"({', '.join(programs)}); one was expected",
        )
    return next(iter(programs.values()))


def _program_names(fh: BinaryIO) -> tuple[str, ...]:
    """The programs (``<root>/models/<name>.json`` members) of the checked archive, by name."""
    fh.seek(0)
    with zipfile.ZipFile(fh) as archive:
        return tuple(
            sorted(
                rel[len(MODELS_DIR) :].removesuffix(".json")
                for rel in (name.partition("/")[2] for name in archive.namelist())
                if rel.startswith(MODELS_DIR) and not rel.endswith("/")
            )
        )


def _check_program_count(names: tuple[str, ...], max_programs: int, display: str) -> None:
    """Refuse (``ModelError("pt2_too_many_programs")``) an archive of more than
    ``max_programs`` programs, before any of them is loaded."""
    if len(names) > max_programs:
        raise ModelError(
            "pt2_too_many_programs",
            f".pt2 file {display!r} holds {len(names)} programs, over the limit of "
            f"{max_programs} programs per model (TUNEHUB_MAX_PT2_PROGRAMS)",
        )


def load_exported_programs(
    path: str | os.PathLike[str],
    *,
    max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES,
    max_members: int = DEFAULT_MAX_MEMBERS,
    max_programs: int = DEFAULT_MAX_PROGRAMS,
    display_name: str | None = None,
) -> dict[str, torch.export.ExportedProgram]:
    """Load an untrusted ``.pt2`` file as its ``ExportedProgram`` s, by name, without executing
    code from it.

    An archive of ``torch.export.save`` holds one program (named ``model``); one written by
    ``torch.export.pt2_archive._package.package_pt2(f, exported_programs={...})`` holds one or
    several under any names (e.g. a decoder's ``prefill`` and ``decode``), returned in the
    archive's order. At most ``max_programs``: an archive with more is refused after the
    inspection, before anything is loaded.

    Opens the file once, runs :func:`inspect_pt2_archive` on it, then hands the same open file to
    ``torch.export.load`` (one program named ``model``) or ``load_pt2`` (any other: several, or one
    under another name, since ``torch.export.load`` reads only the one named ``model``) inside
    :func:`_hardened_torch_loading` (weights-only ``torch.load``; pickle, TorchScript,
    AOTInductor loaders disabled; sympify inputs validated), and finally checks that every graph
    node calls an operator and that the guard code is a plain expression.

    Raises :class:`~compiler.errors.ModelError`: the inspection's codes,
    ``pt2_too_many_programs``, or ``bad_pt2`` with a one-line, user-facing message if torch
    fails to load the checked file (the torch exception is chained as ``__cause__`` for server
    logs). Messages name the file ``display_name`` (default: the
    path's file name), so a caller loading a temp copy never shows its temp name.
    """
    display = display_name or os.path.basename(os.fspath(path))
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise ModelError("bad_pt2", f"cannot read .pt2 file {display!r}: {exc.strerror}") from None
    with fh:
        inspect_pt2_archive(
            fh,
            max_uncompressed_bytes=max_uncompressed_bytes,
            max_members=max_members,
            display_name=display,
        )
        names = _program_names(fh)
        _check_program_count(names, max_programs, display)
        plain = names == ("model",)  # what torch.export.save writes
        fh.seek(0)
        import torch
        from torch.export.pt2_archive._package import load_pt2

        with _hardened_torch_loading() as capture:
            try:
                programs = (
                    {"model": torch.export.load(fh)}
                    if plain
                    else dict(load_pt2(fh).exported_programs)
                )
            except ModelError:
                raise
            except Exception as exc:  # noqa: BLE001 - any torch failure is a bad_pt2 refusal
                cause = capture.cause or exc
                if isinstance(cause, ModelError):
                    raise cause from None
                unknown = _unknown_operator(cause)
                if unknown is not None:
                    raise ModelError(
                        "unsupported_ops",
                        f"torch.export model calls {unknown}, an operator PyTorch itself does "
                        "not define: a library registers it when it is imported, and TuneHub "
                        "runs no code from uploads. Export the model with PyTorch operators",
                    ) from cause
                raise ModelError("bad_pt2", _describe_load_failure(cause)) from cause
    if not programs:
        raise ModelError("bad_pt2", f".pt2 file {display!r} holds no program")
    for program in programs.values():
        _check_loaded_program(program)
    return programs
