"""Helpers for the request-size tests (issue 31, case 2): a request's head sent alone over a raw
socket, streamed bodies of any size, and the server's peak memory while a request runs."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

MIB = 1 << 20
#: What the API process may grow by while it refuses a body of tens of MiB it never reads.
RSS_BOUND = 24 * MIB


@dataclass
class RawAnswer:
    status: int
    headers: dict[str, str]
    body: bytes


def head_only(url: str, method: str, path: str, headers: dict[str, str]) -> RawAnswer:
    """Send only the head of a request (``headers`` may declare a body of any size, or a chunked
    one) and read the answer the server gives without a byte of the body: a server that waits
    for the body instead times out here (``socket.timeout``, after 15 s)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=15) as sock:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {parts.hostname}:{parts.port}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed before an answer: {data!r}"
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        answer_headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            answer_headers[name.strip().lower()] = value.strip()
        length = int(answer_headers.get("content-length", "0"))
        while len(body) < length:
            chunk = sock.recv(65536)
            assert chunk, "connection closed in the answer's body"
            body += chunk
        return RawAnswer(int(status_line.split()[1]), answer_headers, body[:length])


def json_stream(total: int, chunk: int = MIB) -> Iterator[bytes]:
    """A valid JSON array of zeros, ``total`` bytes long (``total >= 3``; a parser would build
    ``total / 2`` objects), yielded ``chunk`` bytes at a time."""
    piece = b"0," * (chunk // 2)
    yield b"["
    sent = 1
    while sent + len(piece) + 2 <= total:
        yield piece
        sent += len(piece)
    yield b"0" + b" " * (total - sent - 2) + b"]"


def multipart_stream(total: int, boundary: str, part: str = "file") -> Iterator[bytes]:
    """A multipart/form-data body of ``total`` bytes: one file part named ``part`` of zeros."""
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="{part}"; filename="x.bin"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    yield head
    left = total - len(head) - len(tail)
    while left > 0:
        size = min(left, MIB)
        yield b"\0" * size
        left -= size
    yield tail


def tmp_leftovers(storage_dir: Path) -> list[Path]:
    """What lies in the store's ``tmp/`` beyond the live processes' own folders (each holds
    only its ``.owner`` lock file between requests): a refused request's leftovers."""
    tmp = storage_dir / "tmp"
    return [
        p
        for p in tmp.rglob("*")
        if not (p.is_dir() and p.parent == tmp) and not (p.name == ".owner" and p.parent != tmp)
    ]


def _vm(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} for {pid}")


def peak_growth(pid: int, action: Callable[[], Any]) -> tuple[Any, int]:
    """Run ``action()``; return its result and how far process ``pid``'s resident memory rose
    above its level before, at the highest: the kernel's high-water mark where it can be reset
    (``/proc/PID/clear_refs``), and psutil samples every few milliseconds in any case."""
    proc = psutil.Process(pid)
    base = proc.memory_info().rss
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    hwm_reset = _vm(pid, "VmHWM") <= base + 4 * MIB
    peak = base
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            with contextlib.suppress(psutil.Error):
                peak = max(peak, proc.memory_info().rss)
            time.sleep(0.003)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = action()
    finally:
        stop.set()
        sampler.join()
    if hwm_reset:
        peak = max(peak, _vm(pid, "VmHWM"))
    return result, peak - base
