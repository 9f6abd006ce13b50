"""The zip container of an untrusted ``.pt2`` file, checked from its raw bytes: signature,
end records and central directory offsets, member names and flags, sizes against the limits
(zip bombs), and each member's bytes decompressed to exactly what its headers declare, CRC
checked. Nothing here knows the ``.pt2`` layout (:mod:`compiler.frontends.pt2_safety.archive`
does)."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import struct
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from compiler.errors import ModelError
from compiler.frontends.pt2_safety.constants import MAX_COMPRESSION_RATIO, ZIP_BOMB_MIN_BYTES

_CHUNK = 1024 * 1024
_ZIP_MAGIC = b"PK\x03\x04"
_EMPTY_ZIP_MAGIC = b"PK\x05\x06"
_MEMBER_NAME_OK = re.compile(r"[^\x00-\x1f\x7f\\:]+")


@dataclass
class _Budget:
    bytes_left: int
    members_left: int
    max_bytes: int
    max_members: int


def _open_source(
    data: bytes | bytearray | memoryview | str | os.PathLike[str] | BinaryIO,
) -> tuple[BinaryIO, str, bool]:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return io.BytesIO(bytes(data)), "<upload>", True
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        try:
            return open(path, "rb"), os.path.basename(path), True
        except OSError as exc:
            raise ModelError(
                "bad_pt2", f"cannot read .pt2 file {os.path.basename(path)!r}: {exc.strerror}"
            ) from None
    if hasattr(data, "read") and hasattr(data, "seek"):
        name = getattr(data, "name", None)
        return data, os.path.basename(name) if isinstance(name, str) else "<upload>", False
    raise TypeError(f"expected bytes, a path or a binary file object, got {type(data).__name__}")


def _looks_truncated(fh: BinaryIO) -> bool:
    """A plausible local file header at offset 0 but no central directory: the file was cut
    short."""
    fh.seek(0)
    header = fh.read(30)
    if len(header) < 30:
        return True
    _sig, _ver, _flags, method, _t, _d, _crc, _cs, _us, name_len, _xl = struct.unpack(
        "<4s5H3L2H", header
    )
    if method not in (0, 8) or not 0 < name_len <= 4096:
        return False
    name = fh.read(name_len)
    return len(name) == name_len and all(32 <= b < 127 or b >= 128 for b in name)


_END_RECORD = struct.Struct("<4s4H2LH")  # end of central directory record (22 bytes + comment)
_ZIP64_LOCATOR = struct.Struct("<4sLQL")  # zip64 end of central directory locator (20 bytes)
_ZIP64_END_RECORD = struct.Struct("<4sQ2H2L4Q")  # zip64 end of central directory record (56 bytes)
_MAX_COMMENT = 0xFFFF


def _central_directory_shift(fh: BinaryIO) -> int | None:
    """Bytes by which the central directory sits after where the end records place it.

    0 for a well-formed archive (torch writes zip64 end records even for small files); not 0 when
    data was prepended or inserted, or when a zip64 end record is not directly before its locator
    (CPython releases disagree on such "zip64 extensible data", so it is treated as a shift too).
    None when there is no end record (``zipfile`` reports that). Parsed from the bytes per the zip
    specification rather than through ``zipfile``'s private helpers, whose meaning changed in the
    CVE-2025-8291 fix (gh-139700) that Python 3.12/3.13 security releases carry.
    """
    fh.seek(0, os.SEEK_END)
    size = fh.tell()
    tail_start = max(0, size - _END_RECORD.size - _MAX_COMMENT)
    fh.seek(tail_start)
    tail = fh.read()
    # no archive comment (torch writes none), as zipfile tries first
    at = len(tail) - _END_RECORD.size
    if at < 0 or tail[at : at + 4] != _EMPTY_ZIP_MAGIC or tail[-2:] != b"\0\0":
        at = tail.rfind(_EMPTY_ZIP_MAGIC)
    if at < 0 or len(tail) - at < _END_RECORD.size:
        return None
    end_pos = tail_start + at
    *_, cd_size, cd_offset, _comment_len = _END_RECORD.unpack_from(tail, at)
    cd_end = end_pos
    locator_pos = end_pos - _ZIP64_LOCATOR.size
    if locator_pos >= 0:
        fh.seek(locator_pos)
        sig, _disk, zip64_pos, _disks = _ZIP64_LOCATOR.unpack(fh.read(_ZIP64_LOCATOR.size))
        if sig == b"PK\x06\x07":
            expected = locator_pos - _ZIP64_END_RECORD.size
            fh.seek(max(expected, 0))
            record = fh.read(_ZIP64_END_RECORD.size)
            if expected < 0 or zip64_pos != expected or record[:4] != b"PK\x06\x06":
                return zip64_pos - expected or -1
            *_, cd_size, cd_offset = _ZIP64_END_RECORD.unpack(record)
            cd_end = expected
    return cd_end - cd_size - cd_offset


def _check_central_directory_offset(fh: BinaryIO, label: str) -> None:
    """Reject archives whose end records misplace the central directory (data before/inside).

    Python's zipfile silently compensates for such a shift, torch's miniz reader does not; the two
    would then read different bytes for the same member.
    """
    if _central_directory_shift(fh) not in (0, None):
        raise ModelError(
            "bad_pt2",
            f"{label} is not a well-formed zip archive: its central directory offsets are "
            "inconsistent (extra data before or inside the archive)",
        )


def _open_zip(fh: BinaryIO, label: str) -> zipfile.ZipFile:
    fh.seek(0)
    magic = fh.read(4)
    if magic == _EMPTY_ZIP_MAGIC:
        raise ModelError(
            "bad_pt2", f"{label} is an empty zip archive, not a torch.export.save file"
        )
    if magic != _ZIP_MAGIC:
        raise ModelError(
            "bad_pt2",
            f"{label} is not a .pt2 file: it does not start with the zip signature "
            "(expected a file written by torch.export.save)",
        )
    _check_central_directory_offset(fh, label)  # before zipfile, whose reading varies by version
    fh.seek(0)
    try:
        zf = zipfile.ZipFile(fh, "r")
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        EOFError,
        OSError,
        ValueError,
        struct.error,
    ) as exc:
        if _looks_truncated(fh):
            raise ModelError(
                "pt2_truncated",
                f"{label} is truncated: the zip archive ends before its central directory "
                "(incomplete upload or copy?); upload the complete file",
            ) from None
        raise ModelError(
            "bad_pt2",
            f"{label} is corrupt: it starts like a zip archive but cannot be read as one ({exc})",
        ) from None
    return zf


def _check_member_headers(
    zf: zipfile.ZipFile, label: str, budget: _Budget, outer: str
) -> list[zipfile.ZipInfo]:
    infos = zf.infolist()
    budget.members_left -= len(infos)
    if budget.members_left < 0:
        raise ModelError(
            "pt2_too_many_members",
            f"{label} has too many members ({len(infos)}; the limit is {budget.max_members} in "
            "total)",
        )
    seen_names: set[str] = set()
    total = 0
    for info in infos:
        name = info.filename
        shown = f"{outer}{name}"
        parts = name.split("/")
        if (
            not name
            or name.startswith(("/", "\\"))
            or re.match(r"[A-Za-z]:", name)
            or ".." in parts
            or "." in parts
            or not _MEMBER_NAME_OK.fullmatch(name)
        ):
            raise ModelError(
                "pt2_bad_member_name",
                f"{label} contains a member with an unsafe name {shown!r} "
                "(absolute path, '..', backslash or control character)",
            )
        if not name.isascii() and not info.flag_bits & 0x800:
            raise ModelError(
                "pt2_bad_member_name",
                f"{label}: member name {shown!r} is not ASCII and not marked UTF-8",
            )
        if name in seen_names:
            raise ModelError(
                "pt2_bad_member_name",
                f"{label} contains the member {shown!r} twice (ambiguous archive)",
            )
        seen_names.add(name)
        mode = info.external_attr >> 16
        if info.create_system == 3 and stat.S_ISLNK(mode):
            raise ModelError(
                "pt2_symlink", f"{label} contains a symbolic link {shown!r}; links are not allowed"
            )
        if info.flag_bits & 0x1:
            raise ModelError("bad_pt2", f"{label}: member {shown!r} is encrypted")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ModelError(
                "bad_pt2",
                f"{label}: member {shown!r} uses zip compression method {info.compress_type}; "
                "only stored or deflated members are supported",
            )
        if info.file_size > budget.max_bytes:
            raise ModelError(
                "pt2_too_large",
                f"{label}: member {shown!r} would decompress to {info.file_size} bytes, over the "
                f"limit of {budget.max_bytes} bytes",
            )
        if info.file_size > ZIP_BOMB_MIN_BYTES and info.file_size > MAX_COMPRESSION_RATIO * max(
            info.compress_size, 1
        ):
            raise ModelError(
                "pt2_too_large",
                f"{label}: member {shown!r} expands "
                f"{info.file_size // max(info.compress_size, 1)}:1 ({info.compress_size} -> "
                f"{info.file_size} bytes); refusing a likely zip bomb",
            )
        total += info.file_size
    budget.bytes_left -= total
    if budget.bytes_left < 0:
        raise ModelError(
            "pt2_too_large",
            f"{label} would decompress to more than the limit of {budget.max_bytes} bytes in total "
            "(zip bomb or model too large)",
        )
    ordered = sorted(infos, key=lambda i: i.header_offset)
    for prev, cur in zip(ordered, ordered[1:]):
        if (
            cur.header_offset
            < prev.header_offset + 30 + len(prev.orig_filename.encode()) + prev.compress_size
        ):
            raise ModelError(
                "pt2_too_large",
                f"{label}: members {prev.filename!r} and {cur.filename!r} overlap (zip bomb "
                "construction)",
            )
    return infos


_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # local file header (30 bytes, then name and extra)
_DATA_DESCRIPTOR_FLAG = 0x08
_ZIP64_SIZE = 0xFFFFFFFF


def _member_chunks(zf: zipfile.ZipFile, info: zipfile.ZipInfo, shown: str) -> Iterator[bytes]:
    """Yield a member's decompressed bytes, proving they are exactly what its headers declare.

    ``zipfile`` trusts the central directory's sizes and cuts the output there, so a member whose
    header understated its size (with a CRC of the cut data) read as valid while its data went on:
    hidden bytes for another zip reader, or a deflate stream expanding far past the limits. Here the
    local header must agree with the central directory (method, and CRC and sizes unless a data
    descriptor follows the data), a stored member's two sizes must be equal, and a deflate stream
    must end exactly at ``compress_size`` input bytes having produced exactly ``file_size`` bytes,
    with the CRC over all of them. Raises ``ModelError`` (``bad_pt2`` or ``pt2_too_large``).
    """
    fp = zf.fp
    if fp is None:
        raise ModelError(
            "bad_pt2", f"member {shown!r} of the .pt2 file cannot be read (archive closed)"
        )
    fp.seek(info.header_offset)
    header = fp.read(_LOCAL_HEADER.size)
    if len(header) < _LOCAL_HEADER.size:
        raise ModelError(
            "bad_pt2", f"member {shown!r} of the .pt2 file is corrupt (local header cut short)"
        )
    sig, _ver, flags, method, _t, _d, crc, csize, usize, name_len, extra_len = _LOCAL_HEADER.unpack(
        header
    )
    if sig != _ZIP_MAGIC or method != info.compress_type:
        raise ModelError(
            "bad_pt2",
            f"member {shown!r} of the .pt2 file is corrupt (local header disagrees with the "
            "directory)",
        )
    if not flags & _DATA_DESCRIPTOR_FLAG and (
        crc != info.CRC
        or (csize != _ZIP64_SIZE and csize != info.compress_size)
        or (usize != _ZIP64_SIZE and usize != info.file_size)
    ):
        raise ModelError(
            "pt2_too_large",
            f"member {shown!r}: its local header and the central directory declare different sizes "
            "or checksums (a header that understates the member's size)",
        )
    if method == zipfile.ZIP_STORED and info.compress_size != info.file_size:
        raise ModelError(
            "pt2_too_large",
            f"member {shown!r} is stored uncompressed but declares {info.compress_size} stored and "
            f"{info.file_size} unpacked bytes (a header that understates the member's size)",
        )
    encoding = "utf-8" if info.flag_bits & 0x800 else "cp437"
    if fp.read(name_len) != info.orig_filename.encode(encoding, "replace"):
        raise ModelError(
            "bad_pt2",
            f"member {shown!r} of the .pt2 file is corrupt (file name in directory and header "
            "differ)",
        )
    fp.seek(info.header_offset + _LOCAL_HEADER.size + name_len + extra_len)
    left = info.compress_size
    produced = 0
    checksum = 0
    decompressor = zlib.decompressobj(-15) if method == zipfile.ZIP_DEFLATED else None
    while left > 0:
        raw = fp.read(min(_CHUNK, left))
        if not raw:
            raise ModelError("bad_pt2", f"member {shown!r} of the .pt2 file is cut short")
        left -= len(raw)
        pending = raw
        while pending:
            if decompressor is None:
                chunk, pending = pending, b""
            else:
                if decompressor.eof:
                    raise ModelError(
                        "pt2_too_large",
                        f"member {shown!r}: its compressed data ends before its declared "
                        "compressed size",
                    )
                try:  # bounded: never more than one byte past what the header declares
                    chunk = decompressor.decompress(pending, info.file_size - produced + 1)
                except zlib.error as exc:
                    raise ModelError(
                        "bad_pt2", f"member {shown!r} of the .pt2 file is corrupt ({exc})"
                    ) from None
                pending = decompressor.unconsumed_tail
            produced += len(chunk)
            if produced > info.file_size:
                raise ModelError(
                    "pt2_too_large", f"member {shown!r} decompresses to more than its declared size"
                )
            checksum = zlib.crc32(chunk, checksum)
            if chunk:
                yield chunk
    if decompressor is not None and (not decompressor.eof or decompressor.unused_data):
        raise ModelError(
            "pt2_too_large",
            f"member {shown!r}: its compressed data does not end where its header says "
            "(a header that understates the member's size)",
        )
    if produced != info.file_size:
        raise ModelError(
            "pt2_too_large",
            f"member {shown!r} decompresses to {produced} bytes, not its declared {info.file_size}",
        )
    if checksum != info.CRC:
        raise ModelError("bad_pt2", f"member {shown!r} of the .pt2 file is corrupt (bad CRC-32)")


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, shown: str, keep: bool) -> bytes:
    """Decompress a member (exactly its declared size, CRC-checked); return it if ``keep``."""
    chunks: list[bytes] = []
    try:
        for chunk in _member_chunks(zf, info, shown):
            if keep:
                chunks.append(chunk)
    except ModelError:
        raise
    except (OSError, ValueError, EOFError, struct.error) as exc:
        raise ModelError(
            "bad_pt2", f"member {shown!r} of the .pt2 file is corrupt ({exc})"
        ) from None
    return b"".join(chunks)


def _load_json_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, shown: str) -> Any:
    data = _read_member(zf, info, shown, keep=True)
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ModelError("bad_pt2", f"malformed JSON in .pt2 member {shown!r}: {exc}") from None
