"""The final build's last check: the tuned library against the zero-trial library, whole models.

The re-measurement before a final build (:mod:`tuner.final_build.remeasure`) times each task's
candidates alone, with hot caches; inside the whole model a kernel runs after other kernels, on
other data in cache, and a build of per-task winners can be slower end to end than the zero-trial
build (library peers and TVM's default schedules, :func:`compiler.build.builder.build_zero_trial`).
A ResNet-18 tuned 500 trials built at 10.4 ms against its zero-trial build's 8.7 ms
(``bench/results/models_2026-12-03.md``).

So every tuned final build (:func:`tuner.final_build.finalize.publish_tuned`: a job run in one
process and a worker's finalize lease) also builds the zero-trial library and times both whole
models on the same seeded inputs in alternating rounds (:func:`time_side_by_side`: round ``r`` times
them in the order rotated by ``r``; each time is :meth:`compiler.build.runner.LoadedLibrary.time`'s
median of ``repeat`` measurements). :func:`decide` applies the rule:

    the zero-trial library is published when the median of its rounds is more than 2 %
    (:data:`MARGIN`) below the tuned library's; otherwise the tuned library is.

Ties and differences within the margin go to the tuned build (what the job tuned). The
manifest's ``final_choice`` (:meth:`FinalChoice.to_json`) says which was published, both medians,
every round's times, the number of rounds and the rule, or, when nothing was compared, why
(``why_not``). A server that rebuilds a worker's artifact (:mod:`tuner.final_build.rebuild`) times
nothing: it follows the worker's reported choice (:meth:`FinalChoice.from_json`, ``decided_by``
``"worker"``); the zero-trial library uses no records, so following it trusts no evidence.

Setting: ``TUNEHUB_FINAL_COMPARE_ROUNDS`` (default 5; ``0`` turns the comparison off: the tuned
library is published, as before). TVM-free: the libraries are duck-typed.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compiler.build.runner import LoadedLibrary, Timing

#: The setting that sets the rounds (``0``: no comparison).
ROUNDS_ENV = "TUNEHUB_FINAL_COMPARE_ROUNDS"
#: How much faster (a fraction of the tuned median) the zero-trial library must be to be published.
MARGIN = 0.02
TUNED = "tuned"
ZERO_TRIAL = "zero_trial"
CHOICES = (TUNED, ZERO_TRIAL)
RULE = (
    f"zero_trial when its median over the rounds is more than {MARGIN:.0%} below the tuned "
    "build's, else tuned"
)
#: Most rounds read back from a worker's manifest.
MAX_ROUNDS = 100


@dataclass(frozen=True)
class CompareConfig:
    """How the two whole models are timed: ``rounds`` alternating rounds (below 1: not
    compared), each library timed once a round with ``repeat`` measurements of at least
    ``min_repeat_ms`` (fewer for a slow library, at least 3, so that a round of one library
    stays near ``max_round_secs``: :meth:`compiler.build.runner.LoadedLibrary.time`)."""

    rounds: int = 5
    repeat: int = 5
    min_repeat_ms: int = 25
    max_round_secs: float = 2.0

    @property
    def enabled(self) -> bool:
        return self.rounds >= 1

    @staticmethod
    def from_env() -> CompareConfig:
        """From ``TUNEHUB_FINAL_COMPARE_ROUNDS`` (default 5). Raises ``ValueError`` for a value
        that is not a non-negative integer."""
        text = os.environ.get(ROUNDS_ENV, str(CompareConfig.rounds)).strip()
        if not text.isdigit():
            raise ValueError(f"{ROUNDS_ENV} must be a non-negative integer, got {text!r}")
        return CompareConfig(rounds=int(text))


@dataclass(frozen=True)
class FinalChoice:
    """Which library a final build publishes (``published``: :data:`TUNED` or
    :data:`ZERO_TRIAL`) and the evidence: each round's time of the tuned and of the zero-trial
    library (empty: not compared, ``why_not`` says why). ``decided_by``: ``"measurement"`` (this
    build timed them), ``"worker"`` (a server's rebuild following the worker's manifest) or
    ``None`` (nothing was compared).
    ``note``: what happened after the decision (e.g. the zero-trial library failed
    verification, so the tuned one was published)."""

    published: str
    tuned_rounds_secs: tuple[float, ...] = ()
    zero_trial_rounds_secs: tuple[float, ...] = ()
    why_not: str | None = None
    decided_by: str | None = "measurement"
    note: str | None = None

    def __post_init__(self) -> None:
        if self.published not in CHOICES:
            raise ValueError(f"published must be one of {CHOICES}, got {self.published!r}")

    @staticmethod
    def not_compared(why: str) -> FinalChoice:
        """The tuned library, published without a comparison, because of ``why``."""
        return FinalChoice(TUNED, why_not=why, decided_by=None)

    @property
    def compared(self) -> bool:
        return bool(self.tuned_rounds_secs and self.zero_trial_rounds_secs)

    @property
    def tuned_secs(self) -> float | None:
        """The median of the tuned library's rounds (``None``: not compared)."""
        return statistics.median(self.tuned_rounds_secs) if self.compared else None

    @property
    def zero_trial_secs(self) -> float | None:
        """The median of the zero-trial library's rounds (``None``: not compared)."""
        return statistics.median(self.zero_trial_rounds_secs) if self.compared else None

    def to_json(self) -> dict[str, Any]:
        """The manifest's ``final_choice``."""
        tuned, zero = self.tuned_secs, self.zero_trial_secs
        out: dict[str, Any] = {
            "published": self.published,
            "compared": self.compared,
            "tuned_ms": None if tuned is None else tuned * 1e3,
            "zero_trial_ms": None if zero is None else zero * 1e3,
            "rounds": len(self.tuned_rounds_secs) if self.compared else 0,
            "rule": RULE,
        }
        if self.decided_by is not None:
            out["decided_by"] = self.decided_by
        if self.compared:
            out["tuned_rounds_ms"] = [s * 1e3 for s in self.tuned_rounds_secs]
            out["zero_trial_rounds_ms"] = [s * 1e3 for s in self.zero_trial_rounds_secs]
        if self.why_not is not None:
            out["why_not"] = self.why_not
        if self.note is not None:
            out["note"] = self.note
        return out

    @staticmethod
    def from_json(entry: Any, decided_by: str = "worker") -> FinalChoice | None:
        """A ``final_choice`` read back from a manifest someone else wrote (a worker's: never
        trusted as more than a choice), or ``None`` when it is missing or not understood.
        ``published`` must be one of :data:`CHOICES`; round times are kept only when both
        lists are finite, positive, equally long and at most :data:`MAX_ROUNDS` long."""
        if not isinstance(entry, Mapping) or entry.get("published") not in CHOICES:
            return None
        tuned = _rounds_secs(entry.get("tuned_rounds_ms"))
        zero = _rounds_secs(entry.get("zero_trial_rounds_ms"))
        if len(tuned) != len(zero):
            tuned = zero = ()
        why_not = entry.get("why_not")
        return FinalChoice(
            published=str(entry["published"]),
            tuned_rounds_secs=tuned,
            zero_trial_rounds_secs=zero,
            why_not=why_not[:500] if isinstance(why_not, str) else None,
            decided_by=decided_by,
        )


def _rounds_secs(values: Any) -> tuple[float, ...]:
    """Milliseconds from a manifest as seconds, or ``()`` unless all are finite and positive."""
    if not isinstance(values, list) or not 0 < len(values) <= MAX_ROUNDS:
        return ()
    out = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return ()
        if not (math.isfinite(value) and value > 0):
            return ()
        out.append(float(value) / 1e3)
    return tuple(out)


def decide(
    tuned: Sequence[Timing], zero_trial: Sequence[Timing], margin: float = MARGIN
) -> FinalChoice:
    """The rule (module docstring) over each round's :class:`compiler.build.runner.Timing` of the
    two libraries (the same number of rounds, at least one): :data:`ZERO_TRIAL` when the median of
    the zero-trial rounds' medians is below ``(1 - margin)`` times the tuned one, else
    :data:`TUNED`."""
    if not tuned or len(tuned) != len(zero_trial):
        raise ValueError(
            f"decide needs as many rounds of each library (at least one), got "
            f"{len(tuned)} and {len(zero_trial)}"
        )
    tuned_secs = tuple(t.median_secs for t in tuned)
    zero_secs = tuple(t.median_secs for t in zero_trial)
    faster = statistics.median(zero_secs) < (1.0 - margin) * statistics.median(tuned_secs)
    return FinalChoice(ZERO_TRIAL if faster else TUNED, tuned_secs, zero_secs)


def time_side_by_side(
    libraries: Sequence[LoadedLibrary], inputs: list[Any], config: CompareConfig
) -> list[list[Timing]]:
    """Each library's :class:`compiler.build.runner.Timing` of every round, in the order given:
    ``config.rounds`` rounds on the same ``inputs``, round ``r`` timing the libraries in the
    order rotated by ``r`` (two libraries: A B, B A, A B, ...), so neither always runs first."""
    timings: list[list[Timing]] = [[] for _ in libraries]
    count = len(libraries)
    for round_index in range(config.rounds):
        for step in range(count):
            index = (round_index + step) % count
            timings[index].append(
                libraries[index].time(
                    inputs,
                    repeat=config.repeat,
                    min_repeat_ms=config.min_repeat_ms,
                    max_total_secs=config.max_round_secs,
                )
            )
    return timings


def final_choice_summary(manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """A manifest's ``final_choice`` for a job's summary: without ``tuned_build`` (the table of
    the build that was not published); ``None`` when the manifest has none."""
    entry = manifest.get("final_choice")
    if not isinstance(entry, Mapping):
        return None
    return {key: value for key, value in entry.items() if key != "tuned_build"}
