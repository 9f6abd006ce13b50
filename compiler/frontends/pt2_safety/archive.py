"""The ``.pt2`` layout of a checked zip (:mod:`compiler.frontends.pt2_safety.zipcheck`): the one
archive folder, ``archive_format``, no compiled or non-tensor payloads, every member torch could
unpickle scanned (:mod:`compiler.frontends.pt2_safety.pickles`), every program's JSON validated
(:mod:`compiler.frontends.pt2_safety.expressions`); :func:`inspect_pt2_archive` is the entry point
and :class:`Pt2ArchiveReport` what it found."""

from __future__ import annotations

import io
import os
import re
import zipfile
from dataclasses import dataclass
from typing import Any, BinaryIO

from compiler.errors import ModelError
from compiler.frontends.pt2_safety.constants import (
    AOTINDUCTOR_DIR,
    ARCHIVE_FORMAT_PATH,
    ARCHIVE_FORMAT_VALUE,
    CONSTANTS_DIR,
    CUSTOM_OBJ_FILENAME_PREFIX,
    EXECUTORCH_DIR,
    MODELS_DIR,
    OPAQUE_OBJ_FILENAME_PREFIX,
    SAMPLE_INPUTS_DIR,
    WEIGHTS_DIR,
)
from compiler.frontends.pt2_safety.expressions import _validate_model_json
from compiler.frontends.pt2_safety.pickles import (
    PickleScan,
    _looks_like_pickle,
    _unsafe,
    scan_pickle,
)
from compiler.frontends.pt2_safety.zipcheck import (
    _ZIP_MAGIC,
    _Budget,
    _check_member_headers,
    _load_json_member,
    _open_source,
    _open_zip,
    _read_member,
)

_SAFE_PATH_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


@dataclass(frozen=True)
class Pt2Member:
    """One zip member: full name, sizes, and how it was treated (see ``Pt2ArchiveReport``)."""

    name: str
    uncompressed_bytes: int
    compressed_bytes: int
    kind: str  # "raw_tensor" | "pickle" | "torch_save_zip" | "json" | "other" | "directory"


@dataclass(frozen=True)
class Pt2ArchiveReport:
    """What :func:`inspect_pt2_archive` found in an archive it accepted.

    ``members`` lists the outer archive's members; ``pickles_scanned`` names every pickle stream
    that was scanned (``outer!inner`` for a ``data.pkl`` inside a nested ``torch.save`` zip);
    ``globals_seen`` is every ``module.name`` those pickles reference (always within
    :data:`ALLOWED_GLOBALS`).
    """

    root: str
    members: tuple[Pt2Member, ...]
    total_uncompressed_bytes: int
    total_compressed_bytes: int
    models: tuple[str, ...]
    pickles_scanned: tuple[str, ...]
    globals_seen: frozenset[str]

    @property
    def member_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members)


def _payload_members(config: Any, shown: str, directory: str) -> tuple[set[str], set[str]]:
    """(raw tensor members, members torch would unpickle) referenced by a weights/constants
    config."""
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise ModelError(
            "bad_pt2", f"malformed .pt2 member {shown!r}: expected {{'config': {{...}}}}"
        )
    raw: set[str] = set()
    pickled: set[str] = set()
    for fqn, meta in entries.items():
        path_name = meta.get("path_name") if isinstance(meta, dict) else None
        if (
            not isinstance(path_name, str)
            or not _SAFE_PATH_NAME.fullmatch(path_name)
            or path_name in (".", "..")
        ):
            raise ModelError(
                "pt2_bad_member_name",
                f"{shown}: entry {fqn!r} has an unsafe path_name {path_name!r}",
            )
        if directory == CONSTANTS_DIR and path_name.startswith(
            (CUSTOM_OBJ_FILENAME_PREFIX, OPAQUE_OBJ_FILENAME_PREFIX)
        ):
            kind = (
                "TorchScript/torchbind"
                if path_name.startswith(CUSTOM_OBJ_FILENAME_PREFIX)
                else "opaque Python"
            )
            raise _unsafe(
                directory + path_name,
                f"holds a {kind} object for constant {fqn!r}, which torch would unpickle without "
                "restrictions (only tensor constants are supported)",
            )
        (pickled if meta.get("use_pickle") is True else raw).add(directory + path_name)
    return raw, pickled


def _is_pickle_location(rel: str) -> bool:
    return rel.endswith((".pt", ".pth", ".pkl", ".pickle"))


def _scan_payload(
    data: bytes, shown: str, required: bool, budget: _Budget, depth: int, scans: list[PickleScan]
) -> str:
    """Scan a member torch might unpickle; return its kind."""
    if data[:4] == _ZIP_MAGIC:
        if depth > 0:
            raise ModelError("bad_pt2", f"member {shown!r} nests zip archives too deeply")
        _inspect_torch_save_zip(data, shown, budget, depth + 1, scans)
        return "torch_save_zip"
    if len(data) > 262 and data[257:262] == b"ustar":
        raise _unsafe(
            shown, "is a legacy tar-format torch.save file, whose inner pickles torch would load"
        )
    if required or _looks_like_pickle(data[:2]):
        scans.append(scan_pickle(data, member=shown, strict=required))
        return "pickle"
    return "other"


def _split_root(infos: list[zipfile.ZipInfo], label: str) -> tuple[str, dict[str, zipfile.ZipInfo]]:
    """torch's PyTorchFileReader resolves every record inside the first member's top folder: require
    all members to live there, and map names relative to it to their entries."""
    root = infos[0].filename.split("/", 1)[0]
    by_rel: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        head, sep, rel = info.filename.partition("/")
        if not sep or head != root:
            raise ModelError(
                "pt2_bad_member_name",
                f"{label}: member {info.filename!r} is not inside the archive folder "
                f"{root + '/'!r} like every member torch writes",
            )
        if rel:
            by_rel[rel] = info
    return root, by_rel


def _inspect_torch_save_zip(
    data: bytes, label: str, budget: _Budget, depth: int, scans: list[PickleScan]
) -> None:
    """A nested ``torch.save`` zip (e.g. the example inputs): scan its ``data.pkl``; refuse
    TorchScript."""
    zf = _open_zip(io.BytesIO(data), f"nested archive {label!r}")
    with zf:
        infos = _check_member_headers(zf, f"nested archive {label!r}", budget, f"{label}!")
        if not infos:
            raise ModelError("bad_pt2", f"nested archive {label!r} is empty")
        _split_root(infos, f"nested archive {label!r}")
        for info in infos:
            rel = info.filename.partition("/")[2]
            shown = f"{label}!{info.filename}"
            if rel == "constants.pkl" or rel.startswith("code/"):
                raise ModelError(
                    "unsafe_pt2",
                    f"refusing .pt2 file: {label!r} is a TorchScript archive ({info.filename}), "
                    "which torch.load would hand to torch.jit.load",
                )
            if info.is_dir():
                continue
            raw_storage = re.fullmatch(r"data/\d+", rel) is not None
            content = _read_member(zf, info, shown, keep=not raw_storage)
            if not raw_storage:
                _scan_payload(content, shown, rel.endswith(".pkl"), budget, depth, scans)


def _inspect_fileobj(
    fh: BinaryIO, label: str, max_uncompressed_bytes: int, max_members: int
) -> Pt2ArchiveReport:
    budget = _Budget(max_uncompressed_bytes, max_members, max_uncompressed_bytes, max_members)
    zf = _open_zip(fh, label)
    with zf:
        infos = _check_member_headers(zf, label, budget, "")
        if not infos:
            raise ModelError("bad_pt2", f"{label} is an empty zip archive")
        root, by_rel = _split_root(infos, label)

        fmt = by_rel.get(ARCHIVE_FORMAT_PATH)
        if (
            fmt is None
            or _read_member(zf, fmt, fmt.filename, keep=True).strip()
            != ARCHIVE_FORMAT_VALUE.encode()
        ):
            raise ModelError(
                "bad_pt2",
                f"{label} is a zip archive but not a torch.export.save .pt2 file "
                f"(missing {root}/{ARCHIVE_FORMAT_PATH} = 'pt2')",
            )
        for rel, info in by_rel.items():
            if rel.startswith((AOTINDUCTOR_DIR, EXECUTORCH_DIR)):
                raise ModelError(
                    "unsafe_pt2",
                    f"refusing .pt2 file: it contains compiled native code ({info.filename}); "
                    "torch would load the AOTInductor library from the archive. Upload the plain "
                    "torch.export.save output",
                )
            if rel.startswith(CONSTANTS_DIR) and rel[len(CONSTANTS_DIR) :].startswith(
                (CUSTOM_OBJ_FILENAME_PREFIX, OPAQUE_OBJ_FILENAME_PREFIX)
            ):
                raise _unsafe(
                    info.filename,
                    "is a non-tensor constant object, which torch would unpickle without "
                    "restrictions",
                )

        raw: set[str] = set()
        pickled: set[str] = set()
        json_members: set[str] = set()
        models: list[str] = []
        for rel, info in by_rel.items():
            config_dir = (
                WEIGHTS_DIR if re.fullmatch(r"data/weights/.+_weights_config\.json", rel)
                else CONSTANTS_DIR if re.fullmatch(r"data/constants/.+_constants_config\.json", rel)
                else None
            )  # fmt: skip
            if config_dir is not None:
                cfg_raw, cfg_pickled = _payload_members(
                    _load_json_member(zf, info, info.filename), info.filename, config_dir
                )
                raw |= cfg_raw
                pickled |= cfg_pickled
                json_members.add(rel)
            elif rel.startswith(MODELS_DIR) and not info.is_dir():
                # torch deserializes *every* member under models/ as a program (whatever its suffix)
                _validate_model_json(
                    _read_member(zf, info, info.filename, keep=True), info.filename
                )
                models.append(rel[len(MODELS_DIR) :].removesuffix(".json"))
                json_members.add(rel)
        raw -= pickled  # a member some entry says torch unpickles is scanned, whatever else it is

        scans: list[PickleScan] = []
        members: list[Pt2Member] = []
        for info in infos:
            rel = info.filename.partition("/")[2]
            if info.is_dir() or not rel:
                kind = "directory"
            elif rel in json_members:
                kind = "json"
            elif rel in raw:
                _read_member(zf, info, info.filename, keep=False)  # CRC/size check only
                kind = "raw_tensor"
            elif rel.startswith(SAMPLE_INPUTS_DIR) and rel not in pickled:
                _read_member(zf, info, info.filename, keep=False)  # never unpickled: see above
                kind = "sample_inputs"
            else:
                content = _read_member(zf, info, info.filename, keep=True)
                required = rel in pickled or _is_pickle_location(rel)
                kind = _scan_payload(content, info.filename, required, budget, 0, scans)
            members.append(Pt2Member(info.filename, info.file_size, info.compress_size, kind))

    return Pt2ArchiveReport(
        root=root,
        members=tuple(members),
        total_uncompressed_bytes=sum(m.uncompressed_bytes for m in members),
        total_compressed_bytes=sum(m.compressed_bytes for m in members),
        models=tuple(sorted(models)),
        pickles_scanned=tuple(s.member for s in scans),
        globals_seen=frozenset(g for s in scans for g in s.globals),
    )


def inspect_pt2_archive(
    data: bytes | bytearray | memoryview | str | os.PathLike[str] | BinaryIO,
    *,
    max_uncompressed_bytes: int,
    max_members: int,
    display_name: str | None = None,
) -> Pt2ArchiveReport:
    """Check an untrusted ``.pt2`` archive without importing or running anything from it.

    ``data`` is the file's bytes, its path, or a seekable binary file object (left open, position
    undefined afterwards); messages call it ``display_name`` (default: its file name). Nothing in
    the archive is unpickled, ``eval``\\ ed or imported; torch is not
    imported.

    Promises, when it returns: the file is a well-formed zip (no data before/inside it, no duplicate
    or overlapping members, only stored/deflated unencrypted members, CRCs valid) with at most
    ``max_members`` members (nested ``torch.save`` zips included) that decompress to at most
    ``max_uncompressed_bytes`` in total, all under one top folder, with safe relative names and no
    symlinks; it is a ``torch.export.save`` archive (``archive_format`` is ``pt2``) without
    AOTInductor / ExecuTorch payloads or non-tensor constants; every member torch could unpickle
    (``use_pickle`` payloads, ``*.pt``/``*.pkl``, anything that looks like a pickle, the
    ``data.pkl`` of nested ``torch.save`` zips; not the sample inputs, which TuneHub never lets
    torch read: kind ``sample_inputs``) references only :data:`ALLOWED_GLOBALS` with
    data-only opcodes; and every ``expr_str`` / ``guards_code`` string in ``models/*.json`` is a
    plain symbolic-shape expression.

    Raises :class:`~compiler.errors.ModelError` with code ``bad_pt2``, ``pt2_truncated``,
    ``pt2_too_large``, ``pt2_too_many_members``, ``pt2_bad_member_name``, ``pt2_symlink``,
    ``unsafe_pickle`` or ``unsafe_pt2`` (see :mod:`compiler.frontends.pt2_safety`).
    """
    if max_uncompressed_bytes <= 0 or max_members <= 0:
        raise ValueError("max_uncompressed_bytes and max_members must be positive")
    fh, label, owned = _open_source(data)
    label = display_name or label
    try:
        return _inspect_fileobj(fh, f".pt2 file {label!r}", max_uncompressed_bytes, max_members)
    finally:
        if owned:
            fh.close()
