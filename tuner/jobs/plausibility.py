"""One plausibility rule for every measurement the server stores from outside (issue 31).

A measurement is the time of one call of a task's kernel, in seconds: a tuning record's mean
(:func:`tuner.jobs.record_checks.check_records`), a re-measurement's or a library record's median of
rounds (:mod:`tuner.final_build.remeasure_store`). It is *implausible* when it is faster than any of
three physical limits of the task on its kind of target (:class:`Limits`):

(a) **compute**: the task's FLOPs at :data:`PEAK_FLOPS`;
(b) **memory**: the bytes the task must write at the least (its outputs,
    :func:`tuner.jobs.workload_bytes.output_bytes`) at :data:`PEAK_BYTES_PER_SEC`;
(c) **the call**: :data:`MIN_CALL_SECS`, what any kernel call through TVM's time evaluator
    takes at the least, however little it does.

Each ceiling is generous on purpose: a false hold costs an honest worker its record, so a limit
must be above what any machine of the kind can do, not what a typical one does. Implausible
measurements are *held* (stored, flagged, never a best), never refused. TVM-free: the API
process imports it.

Why these values (measured and reasoned 2026-12, see the issue-31 report):

- ``PEAK_FLOPS`` (unchanged from issue 18): CPU 50e12 FLOP/s, CUDA 2e15 FLOP/s.
- ``PEAK_BYTES_PER_SEC``: the output of a kernel that fits in the caches is written at cache
  speed, not DRAM's, and a measurement repeats the call on the same buffers, so outputs stay in
  cache. CPU **100e12 B/s**: above the combined L1 store rate of the largest two-socket x86
  servers (2 x 192 cores x 64 B/cycle x 3.7 GHz = 91e12 B/s), about 80x the DRAM bandwidth of
  such a server (2 x 12 channels of DDR5-6400 = 1.2e12 B/s). CUDA **50e12 B/s**: a GPU's global
  stores go through its L2; on an H200 back-to-back write kernels peaked at 4.7e12 B/s (1 GiB
  output) and 3.2e12 B/s (16 MiB, L2-resident, launch-bound), so 50e12 is 10x that and above the
  L2 bandwidth of any current GPU.
- ``MIN_CALL_SECS``: CPU **1e-9 s**: a one-element copy through ``time_evaluator`` took 14 ns
  per call on a 2.7 GHz EPYC core (about 38 cycles: the packed-function call and the argument
  checks the generated code makes on entry); the same cycles take 6.4 ns at 6 GHz, so the floor
  is 6x below the fastest clock on sale. CUDA **1e-7 s**: back-to-back empty kernel launches
  timed with CUDA events (what the time evaluator does) took 4.0-5.3 us each on an H200; the
  floor is 40x below that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

#: FLOP/s ceilings by target kind: a measurement implying more is held (limit a).
PEAK_FLOPS: Final = {"cpu": 50e12, "cuda": 2e15}
#: Bytes per second a kernel can write at most, by target kind (limit b; caches included).
PEAK_BYTES_PER_SEC: Final = {"cpu": 100e12, "cuda": 50e12}
#: The least time of any kernel call through TVM's time evaluator, by target kind (limit c).
MIN_CALL_SECS: Final = {"cpu": 1e-9, "cuda": 1e-7}

LimitName = Literal["time", "flops", "bytes", "call"]


@dataclass(frozen=True)
class Limits:
    """The three ceilings of one kind of target (see the module docstring for their values)."""

    kind: str
    peak_flops: float
    peak_bytes_per_sec: float
    min_call_secs: float

    @classmethod
    def for_kind(cls, kind: str) -> Limits:
        """The limits of target kind ``kind``; an unknown kind gets the most generous of every
        kind (the highest ceilings, the lowest floor), so it is never held more than a known
        one would be."""
        if kind in PEAK_FLOPS:
            return cls(kind, PEAK_FLOPS[kind], PEAK_BYTES_PER_SEC[kind], MIN_CALL_SECS[kind])
        return cls(
            kind,
            max(PEAK_FLOPS.values()),
            max(PEAK_BYTES_PER_SEC.values()),
            min(MIN_CALL_SECS.values()),
        )


@dataclass(frozen=True)
class TaskBounds:
    """What bounds a task's time from below on one kind of target: its ``flops`` (``None`` or
    0: unknown or none, no compute bound) and the bytes it must write at the least,
    ``min_bytes`` (``None``: unknown, no memory bound)."""

    kind: str
    flops: float | None = None
    min_bytes: int | None = None

    @property
    def limits(self) -> Limits:
        return Limits.for_kind(self.kind)


@dataclass(frozen=True)
class Hold:
    """Why a measurement is held: ``limit`` names the broken limit (``time``: not a finite,
    positive time at all; else the binding one of ``flops``, ``bytes``, ``call``),
    ``least_secs`` is the least time that limit allows, ``reason`` says it in a sentence."""

    limit: LimitName
    least_secs: float
    reason: str


def least_secs(bounds: TaskBounds) -> dict[LimitName, float]:
    """The least time each known limit allows one call of the task: ``call`` always,
    ``flops`` and ``bytes`` where the task's FLOPs and output bytes are known and positive."""
    limits = bounds.limits
    out: dict[LimitName, float] = {"call": limits.min_call_secs}
    if bounds.flops is not None and math.isfinite(bounds.flops) and bounds.flops > 0:
        out["flops"] = bounds.flops / limits.peak_flops
    if bounds.min_bytes is not None and bounds.min_bytes > 0:
        out["bytes"] = bounds.min_bytes / limits.peak_bytes_per_sec
    return out


def check(secs: float, bounds: TaskBounds) -> Hold | None:
    """``None`` when ``secs`` is a plausible time of one call of the task bounded by
    ``bounds``; else the :class:`Hold` naming the limit it breaks (of several, the one that
    allows the most time). Never raises for a number: NaN, infinities and times ``<= 0`` are
    held as ``time``."""
    if not isinstance(secs, int | float) or not math.isfinite(secs) or secs <= 0:
        return Hold("time", math.inf, f"{secs!r:.40} s is not a finite, positive time")
    limits = bounds.limits
    least = least_secs(bounds)
    name, floor = max(least.items(), key=lambda item: item[1])
    if secs >= floor:
        return None
    if name == "flops":
        reason = (
            f"{bounds.flops / secs:.3g} FLOP/s is above the {limits.kind} limit "
            f"{limits.peak_flops:.3g} (compute: at least {floor:.3g} s)"
        )
    elif name == "bytes":
        reason = (
            f"writing its {bounds.min_bytes} output bytes at {bounds.min_bytes / secs:.3g} B/s "
            f"is above the {limits.kind} limit {limits.peak_bytes_per_sec:.3g} B/s "
            f"(memory: at least {floor:.3g} s)"
        )
    else:
        reason = (
            f"{secs:.3g} s is below the least time of any {limits.kind} kernel call ({floor:.3g} s)"
        )
    return Hold(name, floor, reason)
