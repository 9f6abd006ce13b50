"""A small genuine .pt2 model and archive edits shared by the .pt2 tests.

``tests/compiler/test_pt2_safety.py`` (the scanner and the hardened loader) and
``tests/service/test_upload_limits.py`` (the same archives uploaded over REST) both use these.
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch


class TinyNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.register_buffer("scale", torch.tensor([2.0]))
        # a plain tensor attribute becomes an export constant
        self.offset = torch.arange(4.0).reshape(1, 4, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x)) * self.scale + self.offset


@dataclass(frozen=True)
class Genuine:
    path: Path
    model: torch.nn.Module
    example: torch.Tensor
    root: str


def understated_member(genuine: Genuine, dst: Path, *, deflated: bool) -> Path:
    """Add ``extra/payload`` whose local and central headers declare fewer bytes than its data
    holds, with the CRC of the declared prefix (what zipfile checks): stored 5000 bytes declared
    as 10, or a deflate stream of 8 MiB declared as 4096 bytes (under the zip-bomb ratio check)."""
    payload = b"\0" * (8 * 1024**2) if deflated else b"A" * 5000
    declared = 4096 if deflated else 10
    method = zipfile.ZIP_DEFLATED if deflated else zipfile.ZIP_STORED
    with zipfile.ZipFile(genuine.path) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            zout.writestr(name, zin.read(name))
        zout.writestr(f"{genuine.root}/extra/payload", payload, compress_type=method)
    data = bytearray(dst.read_bytes())
    name = f"{genuine.root}/extra/payload".encode()
    crc = zlib.crc32(payload[:declared])
    local = data.index(name) - 30
    assert data[local : local + 4] == b"PK\x03\x04"
    struct.pack_into("<I", data, local + 14, crc)
    struct.pack_into("<I", data, local + 22, declared)
    central = data.rindex(b"PK\x01\x02")
    assert data[central + 46 : central + 46 + len(name)] == name
    struct.pack_into("<I", data, central + 16, crc)
    struct.pack_into("<I", data, central + 24, declared)
    dst.write_bytes(bytes(data))
    return dst
