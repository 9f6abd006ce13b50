"""Validate uploads in separate, memory- and time-limited processes, a bounded number at once.

Validation runs TVM on an untrusted file (import, constant folding, partition): a file built to
exhaust memory or time must cost a bounded amount and fail alone, never the API process. So each
validation runs in a child process:

* **forkserver children.** A child is forked from multiprocessing's fork server, a clean
  single-threaded process that imported the compiler once (``compiler.validation``, so TVM, ONNX
  and torch are loaded before any upload: a fresh interpreter would spend seconds importing them).
  Forking the API process itself would copy a multi-threaded server (locks held by other threads,
  open database connections); ``spawn`` would pay the imports on every upload. One child per
  upload, then it exits: no state or memory is carried from one upload to the next.
* **memory limit.** The child sets ``RLIMIT_AS`` to its address-space size at start plus
  ``memory_bytes``: the libraries already mapped (hundreds of MB of address space that cost no
  memory) are not counted against the budget, everything the validation allocates is; an
  allocation past it fails (``MemoryError`` / ``std::bad_alloc``) or kills the child, and the
  upload is refused. ``RLIMIT_AS`` rather than ``RLIMIT_DATA``: it also bounds ``mmap`` of any
  kind and is enforced the same way on every Linux; a cgroup would need privileges the service
  does not have. glibc's per-thread malloc arenas (64 MiB of address space each) are capped at 2
  so that thread count does not eat the budget.
* **dies with the server.** The child gets SIGKILL when the fork server ends
  (``PR_SET_PDEATHSIG``), and the fork server ends when the API process does, even by
  ``kill -9``: no validation outlives its server.
* **time limit.** The parent waits at most ``timeout_secs`` from the child's start (not counting
  a fork server still starting up) and then kills the child (SIGKILL).
* **bounded concurrency** is the caller's (``service.api.routes.models``: at most
  ``TUNEHUB_VALIDATION_CONCURRENCY`` at once, an upload waits at most
  ``TUNEHUB_VALIDATION_QUEUE_SECS`` for a slot, then 503 with ``Retry-After``).

Every way a child ends is a :class:`ModelError` with a message for the user, except a bug in
TuneHub (an unexpected exception in the child), which is a :class:`ValidationCrashed`. Temp files
the child writes go to a folder of its own that the parent removes whatever happened.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import resource
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from compiler.errors import ModelError
from compiler.frontends.model_spec import ModelFormat, ModelLimits
from compiler.shapes.buckets import BucketSpec
from compiler.target import TargetSpec
from compiler.validation import ValidatedModel
from tuner.final_build.process_limits import die_with_parent

_PRELOAD = [
    "compiler.validation",
    "compiler.prepare",
    "compiler.frontends.pt2_loader",
    "compiler.frontends.pt2_safety",
]
_M_ARENA_MAX = -8  # glibc mallopt parameter
_context: Any = None
_context_lock = threading.Lock()


class ValidationCrashed(RuntimeError):
    """The validation process failed in a way that is TuneHub's fault (logged, answered 500)."""


@dataclass(frozen=True)
class ValidationLimits:
    """How much one validation may use: seconds of wall time and bytes of memory beyond the
    validation process's start-up size."""

    timeout_secs: float
    memory_bytes: int


def _forkserver_context() -> Any:
    global _context
    with _context_lock:
        if _context is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(_PRELOAD)
            _context = context
        return _context


def _address_space_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _limit_memory(memory_bytes: int) -> None:
    try:
        ctypes.CDLL(None).mallopt(_M_ARENA_MAX, 2)
    except (OSError, AttributeError):
        pass
    limit = _address_space_bytes() + memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _child(conn: Connection, memory_bytes: int, tmp: str, job: tuple) -> None:
    """Body of the validation process: die with the fork server (which ends with the API
    process), limit memory, validate, send one message, exit."""
    die_with_parent(os.getppid())
    path, target, limits, expected_format, display_name, buckets = job
    try:
        tempfile.tempdir = tmp
        _limit_memory(memory_bytes)
        from compiler.validation import validate_upload  # noqa: PLC0415 - under the memory limit

        result = validate_upload(
            path,
            target,
            limits=limits,
            expected_format=expected_format,
            display_name=display_name,
            buckets=buckets,
        )
        message: tuple = ("ok", result)
    except ModelError as err:
        message = ("refused", err.code, err.message)
    except MemoryError:
        message = ("refused", "out_of_memory", _memory_message(memory_bytes))
    except BaseException as err:  # noqa: BLE001 - a TuneHub or TVM bug: reported, not a user error
        text = (str(err).strip().splitlines() or [""])[0][:500]
        message = ("crashed", f"{type(err).__name__}: {text}")
    try:
        conn.send(message)
    except MemoryError:
        conn.send(("refused", "out_of_memory", _memory_message(memory_bytes)))
    conn.close()


def _memory_message(memory_bytes: int) -> str:
    return (
        f"validating the model needed more than the {memory_bytes}-byte memory limit "
        "(TUNEHUB_VALIDATION_MEMORY_BYTES); it builds tensors too large to accept"
    )


def validate_in_child(
    path: Path,
    target: TargetSpec,
    *,
    limits: ModelLimits,
    expected_format: ModelFormat | None,
    display_name: str,
    process_limits: ValidationLimits,
    buckets: Mapping[str, BucketSpec] | None = None,
    tmp_root: Path | None = None,
) -> ValidatedModel:
    """Validate the file at ``path`` in a child process and return what it found (``buckets``:
    the shape buckets of a model with symbolic dimensions, :mod:`compiler.shapes.buckets`).

    Blocks the calling thread for at most ``process_limits.timeout_secs`` (plus process clean-up).
    Raises :class:`ModelError` (the file's fault: refused by the compiler, over the memory or
    time limit, or crashing the validator) or :class:`ValidationCrashed` (TuneHub's fault).
    Leaves no process and no temp file behind. Callers bound how many run at once.
    """
    tmp = tempfile.mkdtemp(prefix="tunehub-validate-", dir=tmp_root)
    try:
        return _Run(process_limits).run(
            path,
            target,
            limits,
            expected_format,
            display_name,
            tmp,
            dict(buckets or {}),
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def warm_up() -> None:
    """Start the fork server (it imports the compiler once, seconds); later calls return at once.

    Call it when the service starts, so that the first upload does not wait for the imports."""
    _forkserver_context()
    forkserver.ensure_running()


class _Run:
    def __init__(self, limits: ValidationLimits) -> None:
        self.limits = limits

    def run(
        self, path, target, limits, expected_format, display_name, tmp, buckets=None
    ) -> ValidatedModel:
        context = _forkserver_context()
        receiver, sender = context.Pipe(duplex=False)
        job = (path, target, limits, expected_format, display_name, buckets)
        process = context.Process(
            target=_child,
            args=(sender, self.limits.memory_bytes, tmp, job),
            name="tunehub-validate",
            daemon=True,
        )
        try:
            # start() returns once the fork server has forked the child; a fork server still
            # importing the compiler (the first upload after start-up, seconds on a loaded
            # machine) holds it here, so the time limit is counted from then: it bounds the
            # upload's own work.
            process.start()
            deadline = time.monotonic() + self.limits.timeout_secs
            sender.close()
            message = None
            if receiver.poll(max(0.0, deadline - time.monotonic())):
                try:
                    message = receiver.recv()
                except (EOFError, OSError):
                    message = None
            elif process.is_alive():
                process.kill()
                raise ModelError(
                    "validation_timeout",
                    f"validating the model took longer than the limit of "
                    f"{self.limits.timeout_secs:g} s (TUNEHUB_VALIDATION_TIMEOUT_SECS); it is too "
                    "large or too complex to accept",
                )
            process.join(5)
        finally:
            if process.is_alive():
                process.kill()
            if process.pid is not None:
                process.join()
            receiver.close()
        return self._outcome(message, process.exitcode)

    def _outcome(self, message: tuple | None, exitcode: int | None) -> ValidatedModel:
        if message is None:  # the child died without answering
            if exitcode in (-signal.SIGKILL, -signal.SIGABRT):  # OOM kill, uncaught bad_alloc
                raise ModelError("out_of_memory", _memory_message(self.limits.memory_bytes))
            if exitcode is not None and exitcode < 0:
                raise ModelError(
                    "validation_failed",
                    f"validating the model crashed the validation process (signal {-exitcode})",
                )
            raise ValidationCrashed(
                f"the validation process ended without an answer (exit {exitcode})"
            )
        if message[0] == "ok":
            return message[1]
        if message[0] == "refused":
            raise ModelError(message[1], message[2])
        raise ValidationCrashed(f"model validation failed: {message[1]}")
