"""Where a search's time goes, from MetaSchedule's own profiler.

MetaSchedule times its own scopes when a ``ms.Profiler`` is entered (the evolutionary search's
sampling, mutation and cost-model scoring, sending candidates to the builder and the runner,
each measure callback). :func:`profiled` runs a search inside one, and :class:`SearchTime`
groups its scopes into the phases of a trial (:data:`PHASES`):

- ``sample``: the evolutionary search's initial population (random schedules from the design
  space, the database's best);
- ``mutate``: its genetic iterations' mutations and bookkeeping;
- ``predict``: the cost model scoring candidates;
- ``build``: compiling the chosen candidates (the builder's workers);
- ``run``: timing them (the runner's worker, or RPC servers);
- ``update``: training the cost model on the results;
- ``record``: the measure callbacks that store records and report progress (TuneHub's SQL
  database, the job rows, the progress bar);
- ``other``: the rest of the run (task scheduling, seeds measured before a batch, Python).

An 8-trial ``tunehub tune`` of the example MLP on a quiet 2-core Xeon (population 64,
2026-12-07): 10.4 s of search, 4.4 s building (the builder's workers starting included), 2.8 s
running, 1.3 s mutating, 0.4 s sampling. TVM-free apart from :func:`profiled`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

#: MetaSchedule's profiler scopes (TVM 0.27), by phase. ``Total`` is the profiled run's time.
PHASES: dict[str, tuple[str, ...]] = {
    "sample": ("EvoSearch/SampleInitPopulation", "EvoSearch/PickBestFromDatabase"),
    "mutate": (
        "EvoSearch/Evolve/Mutation",
        "EvoSearch/Evolve/Misc",
        "EvoSearch/PickWithEpsGreedy",
    ),
    "predict": ("EvoSearch/Evolve/PredictNormalizedScore",),
    "build": ("SendToBuilder",),
    "run": ("SendToRunner", "JoinRunnerFutures"),
    "update": ("MeasureCallback/UpdateCostModel",),
    "record": (
        "MeasureCallback/AddToDatabase",
        "MeasureCallback/PyMeasureCallback",
        "MeasureCallback/RemoveBuildArtifact",
    ),
}


@dataclass(frozen=True)
class SearchTime:
    """Seconds per phase of one search (:data:`PHASES`, plus ``other``), its total, and the
    trials it measured."""

    total_secs: float
    phases: tuple[tuple[str, float], ...]
    trials: int = 0

    @staticmethod
    def from_scopes(scopes: Mapping[str, float], trials: int = 0) -> SearchTime:
        """Group a profiler's scopes (name → seconds; ``Total``: the run) into phases. Scopes
        nested in another (``EvoSearch/Evolve/Misc/...``) are inside their parent's time and
        are not counted again; unknown scopes fall in ``other``."""
        total = float(scopes.get("Total", 0.0))
        phases = [
            (phase, sum(float(scopes.get(s, 0.0)) for s in names))
            for phase, names in PHASES.items()
        ]
        counted = sum(secs for _, secs in phases)
        phases.append(("other", max(0.0, total - counted)))
        return SearchTime(total, tuple(phases), trials)

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> SearchTime:
        """The split :meth:`to_json` wrote."""
        phases = tuple((str(k), float(v)) for k, v in data["phases_secs"].items())
        return SearchTime(float(data["total_secs"]), phases, int(data["trials"]))

    def to_json(self) -> dict[str, Any]:
        """``{"total_secs", "trials", "trials_per_sec", "phases_secs": {phase: secs}}``."""
        rate = self.trials / self.total_secs if self.total_secs > 0 and self.trials else None
        return {
            "total_secs": round(self.total_secs, 3),
            "trials": self.trials,
            "trials_per_sec": None if rate is None else round(rate, 3),
            "phases_secs": {phase: round(secs, 3) for phase, secs in self.phases},
        }

    def describe(self) -> str:
        """One line: the total and each phase's share, largest first."""
        if self.total_secs <= 0:
            return "search time: nothing timed"
        shares = sorted(self.phases, key=lambda p: -p[1])
        parts = ", ".join(f"{phase} {secs / self.total_secs:.0%}" for phase, secs in shares if secs)
        rate = f", {self.trials / self.total_secs:.2f} trials/s" if self.trials else ""
        return f"search time {self.total_secs:.1f} s{rate}: {parts}"


@contextmanager
def profiled() -> Iterator[Callable[[], dict[str, float]]]:
    """Run the body inside MetaSchedule's profiler; yields a function that returns its scopes
    (name → seconds), to call after the body: MetaSchedule sets ``Total`` (the body's time) when
    the profiler exits."""
    from tvm.s_tir import meta_schedule as ms  # noqa: PLC0415 - TVM only where a search runs

    with ms.Profiler() as profiler:
        yield lambda: {str(k): float(v) for k, v in profiler.get().items()}
