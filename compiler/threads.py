"""TVM's CPU thread pool in TuneHub processes: as many threads as the target's cores.

TVM's runtime sizes its thread pool when a process first runs a parallel kernel, from
``TVM_NUM_THREADS`` or else, on x86, from *half* the logical CPUs (``threading::MaxConcurrency``
assumes every core is two hyper-threads). On a 2-vCPU VM that is one thread, while the CPU target
is compiled for two (:func:`compiler.target.cpu_target`: the CPUs this process may use) and ONNX
Runtime and torch are timed with two. Measured on such a VM (``bench/results/models_2026-12-02.md``,
the same artifacts re-timed side by side twice): ResNet-18's zero-trial library 24.7 ms a call
with TVM's default, 13.43 ms with ``TVM_NUM_THREADS=2`` (ONNX Runtime 12.0 and 12.21).

:func:`use_usable_cores` sets ``TVM_NUM_THREADS`` to the CPUs this process may use, unless it is
set already (a user's choice wins). The ``compiler`` package calls it on import, before any TVM
kernel runs, so every TuneHub process (CLI, server, workers, benchmarks, tests) and every child
it starts (MetaSchedule's builder and runner workers inherit the environment) runs kernels on as
many threads as the target was compiled for. A process that loads an artifact with nothing but
the TVM runtime should set ``TVM_NUM_THREADS`` to the manifest's target cores itself.
"""

from __future__ import annotations

import os

ENV = "TVM_NUM_THREADS"


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity mask; the CPU count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def use_usable_cores() -> int:
    """Set ``TVM_NUM_THREADS`` to :func:`usable_cores` unless it is set; return its value."""
    value = os.environ.get(ENV, "").strip()
    if not value.isdigit() or int(value) < 1:
        os.environ[ENV] = value = str(usable_cores())
    return int(value)
