"""Limits of the server's helper processes: they die with the server, within a memory bound.

:func:`child_limits` gives a ``preexec_fn`` for :mod:`subprocess`: ``PR_SET_PDEATHSIG`` (the
child gets SIGKILL when the process that started it dies, even by ``kill -9``), an address-space
limit (``RLIMIT_AS``), a CPU-time limit and no core dumps. It only makes system calls (the libc
handle is opened in the parent), as a ``preexec_fn`` in a threaded server must.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


def die_with_parent(parent: int) -> None:
    """In a child: SIGKILL when its parent dies; if the parent ``parent`` is already gone (it
    died between the fork and this call), exit now."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def child_limits(memory_bytes: int, cpu_secs: float) -> Callable[[], None]:
    """A ``preexec_fn``: die with this process, at most ``memory_bytes`` of address space and
    ``cpu_secs`` of wall time's worth of CPU time on every core (plus a minute of slack for
    start-up), no core file."""
    parent = os.getpid()
    cpu = int(cpu_secs * (os.cpu_count() or 1)) + 60

    def limit() -> None:  # pragma: no cover - runs in the child
        die_with_parent(parent)
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return limit
