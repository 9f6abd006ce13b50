"""Noise-proof winners: re-measure each task's top records side by side before the final build.

A record's time was measured once, at some moment of a shared machine; the same schedule measured
hours apart here differs by 15-50 % (``bench/results/cost_model_2026-12-01.md``), so a task's best
record is often a lucky measurement rather than the fastest schedule. Before a job's final build,
:func:`remeasure_tasks` takes each task's top records (``top``, default 3), builds them with the
tuner's builder and times them with the tuner's runner, all tasks' candidates in one list per
round and the order rotated each round, ``rounds`` rounds (default 5): every candidate of a task is
timed under the same conditions. Each round times a candidate once, for at least the runner's
``min_repeat_ms`` (one repeat: the rounds are the repeats; with the tuner's five repeats a round,
MobileNetV2's final build spent ~4 of its ~5 minutes here, py-spy 2026-12-02). The
winner of a task is the candidate with the lowest median over rounds; the build uses it
(:func:`records_for_build`), and the re-measurements are stored beside their records
(:class:`db.NewRemeasurement`, never changing a record's own measurement).

Both ways a job finishes use it: a job run in one process (:func:`tuner.jobs.job.run_job`, records
from the SQL database) and a worker's finalize lease (records fetched from the server; the
re-measurements travel in the artifact's manifest and the server stores them when it accepts the
artifact). A candidate that no longer builds or runs is left out of its task's choice; a task
whose candidates all fail keeps its best record.

Library peers (issue 21, :mod:`compiler.peers`): a task whose anchor a library implements has
more candidates, its peer variants (the task's PrimFunc with the anchor computed by OpenBLAS,
a convolution as im2col or Winograd, or by cuBLAS / cuDNN on a CUDA target), timed in the same
rounds as the task's records; where one wins, the build applies that variant
(:attr:`TaskRemeasure.peer_won`, :func:`peer_keys`). Peers are measured on this machine only (an
RPC device would need the library too) and never without the target's peer library
(:func:`compiler.peers.library_for`).

TVM's default schedule (:mod:`compiler.lowering.default_schedules`: the CPU defaults, or DLight's
GPU rules) is a candidate too: a record found by a short search can be slower than the default, a
peer's library call plus its epilogue kernel can be too, and a task whose default wins builds
without its records (:attr:`TaskRemeasure.default_won`; :func:`records_for_build` leaves its
records out), so a tuned build is never slower on a task than the zero-trial build.

Settings: ``TUNEHUB_REMEASURE_TOP`` (``0`` or ``1``: records are not re-measured against each
other; a task's best record is still timed against its peer), ``TUNEHUB_REMEASURE_ROUNDS`` and
``TUNEHUB_PEERS`` (``0``: no peers).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tvm
from tvm.s_tir import meta_schedule as ms

from compiler.lowering.default_schedules import default_task_module
from compiler.peers import device_of, library_for, peer_task_module, peer_variants, peers_supported
from db.metaschedule_database import replay
from db.types import canonical_trace_json, mean_run_secs, measurement, spread, trace_hash
from tuner.measuring.builder_runner import MeasureConfig, RpcConfig, make_builder, make_runner

logger = logging.getLogger("tunehub.remeasure")


@dataclass(frozen=True)
class RemeasureConfig:
    """How many top records of a task are re-measured (``top``; below 2 turns it off: there is
    nothing to choose between) and in how many rounds."""

    top: int = 3
    rounds: int = 5

    @property
    def enabled(self) -> bool:
        return self.top >= 2 and self.rounds >= 1

    @staticmethod
    def from_env() -> RemeasureConfig:
        """From ``TUNEHUB_REMEASURE_TOP`` / ``TUNEHUB_REMEASURE_ROUNDS`` (defaults 3 and 5).
        Raises ``ValueError`` for a value that is not a non-negative integer."""
        values = []
        for name, default in (("TUNEHUB_REMEASURE_TOP", 3), ("TUNEHUB_REMEASURE_ROUNDS", 5)):
            text = os.environ.get(name, str(default)).strip()
            if not text.isdigit():
                raise ValueError(f"{name} must be a non-negative integer, got {text!r}")
            values.append(int(text))
        return RemeasureConfig(top=values[0], rounds=values[1])


@dataclass(frozen=True)
class Candidate:
    """One candidate of a task, re-measured: a stored record (``record`` is its
    ``TuningRecord.as_json()`` list), a library peer (``peer``: what it calls, with which
    library; no record) or TVM's default schedule (``default``: which one; no record).
    ``rounds_secs`` is the mean run time of each round (empty: it failed to build or run).
    A peer also has ``peer_call``, the :class:`compiler.peers.PeerCall` the build applies (one
    of the task's variants: a convolution's ``im2col`` or Winograd algorithms)."""

    trace_hash: str
    record: tuple[Any, ...]
    recorded_secs: float
    rounds_secs: tuple[float, ...]
    peer: Mapping[str, Any] | None = None
    default: Mapping[str, Any] | None = None
    peer_call: Any = None

    @property
    def median_secs(self) -> float | None:
        return statistics.median(self.rounds_secs) if self.rounds_secs else None

    @property
    def spread(self) -> float | None:
        """``(max - min) / median`` of the rounds (:func:`db.types.spread`)."""
        return spread(self.rounds_secs)

    def to_json(self, chosen: bool) -> dict[str, Any]:
        if self.peer is not None or self.default is not None:
            kind = "peer" if self.peer is not None else "default"
            return {
                kind: dict(self.peer if self.peer is not None else self.default),  # type: ignore[arg-type]
                "rounds_ms": [s * 1e3 for s in self.rounds_secs],
                "median_ms": None if self.median_secs is None else self.median_secs * 1e3,
                "spread": self.spread,
                "chosen": chosen,
            }
        return {
            "trace_hash": self.trace_hash,
            "recorded_ms": self.recorded_secs * 1e3,
            "rounds_ms": [s * 1e3 for s in self.rounds_secs],
            "median_ms": None if self.median_secs is None else self.median_secs * 1e3,
            "spread": self.spread,
            "chosen": chosen,
        }


@dataclass(frozen=True)
class TaskRemeasure:
    """A task's candidates, best *recorded* first, and the re-measured winner."""

    key: str
    name: str
    candidates: tuple[Candidate, ...]

    @property
    def winner(self) -> Candidate | None:
        """The candidate with the lowest re-measured median (``None``: none could be timed)."""
        timed = [c for c in self.candidates if c.median_secs is not None]
        return min(timed, key=lambda c: c.median_secs) if timed else None  # type: ignore[arg-type, return-value]

    @property
    def changed(self) -> bool:
        """Whether the re-measured winner is not the best recorded record."""
        winner = self.winner
        return winner is not None and winner is not self.candidates[0]

    @property
    def peer_won(self) -> bool:
        """Whether the build computes this task with its library peer."""
        winner = self.winner
        return winner is not None and winner.peer is not None

    @property
    def default_won(self) -> bool:
        """Whether the build computes this task with TVM's default schedule."""
        winner = self.winner
        return winner is not None and winner.default is not None

    def to_json(self) -> dict[str, Any]:
        winner = self.winner
        return {
            "key": self.key,
            "name": self.name,
            "changed": self.changed,
            "candidates": [c.to_json(c is winner) for c in self.candidates],
        }


def _hash_of(entry: Sequence[Any]) -> str:
    return trace_hash(canonical_trace_json(entry[0]))


def _inputs(mod: Any, trace: Any, tvm_target: Any) -> tuple[Any, Any]:
    """The builder input and argument info of one schedule (``TuningRecord.as_json()[0]``), as
    MetaSchedule measures it (postprocessing replayed; weights in the layout the schedule
    reads). ``trace`` ``None``: ``mod`` is already scheduled (a library peer)."""
    scheduled = mod if trace is None else replay(mod, trace).mod
    args = ms.arg_info.ArgInfo.from_entry_func(scheduled, remove_preproc=True)
    return ms.builder.BuilderInput(scheduled, tvm_target), args


def time_side_by_side(
    schedules: Sequence[tuple[Any, Any]],
    target: Any,
    rounds: int,
    measure: MeasureConfig | None = None,
    rpc: RpcConfig | None = None,
) -> list[tuple[float, ...]]:
    """Time ``schedules`` (``(workload module, trace)`` pairs; trace ``None``: a module that is
    scheduled already) side by side: all built with the tuner's builder, then ``rounds`` rounds
    of the tuner's runner over all of them in one list, the order rotated each round, each
    schedule timed once a round (``measure``'s ``repeat`` is set to 1). Returns,
    per schedule in order, the mean run time of each round; empty for one that does not replay,
    build or run (never raises for it). ``target``: a :class:`compiler.target.TargetSpec`;
    ``measure`` defaults to its kind's settings."""
    tvm_target = target.tvm_target()
    inputs: list[tuple[Any, Any] | None] = []
    for mod, trace in schedules:
        try:
            inputs.append(_inputs(mod, trace, tvm_target))
        except Exception as err:  # noqa: BLE001 - TVM raises many kinds for a bad trace
            logger.warning("a schedule does not replay (%s)", err)
            inputs.append(None)
    times: list[list[float]] = [[] for _ in schedules]
    buildable = [i for i, item in enumerate(inputs) if item is not None]
    if not buildable:
        return [tuple(t) for t in times]
    measure = dataclasses.replace(measure or MeasureConfig.for_target(target.kind), repeat=1)
    builder, runner = make_builder(measure), make_runner(measure, rpc)
    built = dict(zip(buildable, builder.build([inputs[i][0] for i in buildable])))
    runnable = [i for i in buildable if built[i].error_msg is None]
    for round_index in range(rounds if runnable else 0):
        shift = round_index % len(runnable)
        order = runnable[shift:] + runnable[:shift]
        futures = runner.run(
            [
                ms.runner.RunnerInput(built[i].artifact_path, target.device, inputs[i][1])
                for i in order
            ]
        )
        for i, future in zip(order, futures):
            secs = mean_run_secs(future.result())
            if secs is not None:
                times[i].append(secs)
    for i in buildable:
        if built[i].artifact_path:  # each artifact sits in a folder of its own
            shutil.rmtree(os.path.dirname(built[i].artifact_path), ignore_errors=True)
    return [tuple(t) for t in times]


def _peer_candidates(
    extracted: Any, target: Any, rpc: RpcConfig | None
) -> list[tuple[Any, Any, Any]]:
    """``(peer module, peer description, PeerCall)`` of each of a task's peer variants
    (:func:`compiler.peers.peer_variants`); none without a peer, a library, or through RPC."""
    library = library_for(target) if rpc is None else None
    if library is None:
        return []
    task_mod, device = extracted.dispatched[0], device_of(target)
    out = []
    for call in peer_variants(task_mod, device):
        try:
            module = peer_task_module(task_mod, device, call=call)
        except Exception as err:  # noqa: BLE001 - a peer that cannot be made is left out
            logger.warning(
                "task %s: its library peer %s could not be made (%s)",
                extracted.task_name,
                call.algorithm or call.kind,
                err,
            )
            continue
        out.append((module, {**call.to_json(), **library.describe_for(call)}, call))
    return out


def _default_candidate(extracted: Any, target: Any) -> tuple[Any, Any] | None:
    """``(default-scheduled module, description)`` of a task on a target whose build gives
    unrecorded tasks TVM's default schedules, or ``None`` (other targets; no rule applies)."""
    if not peers_supported(target):
        return None
    try:
        made = default_task_module(extracted.dispatched[0], target.tvm_target())
    except Exception as err:  # noqa: BLE001 - a default that cannot be made is left out
        logger.warning(
            "task %s: its default schedule could not be made (%s)", extracted.task_name, err
        )
        return None
    return None if made is None else (made, DEFAULT_DESCRIPTION)


#: How a default-schedule candidate describes itself (manifest, library records).
DEFAULT_DESCRIPTION: Mapping[str, Any] = {
    "library": "tvm",
    "kind": "default",
    "function": "compiler.lowering.default_schedules",
    "config": {},
    "shim": "",
    "package": "apache-tvm",
    "version": tvm.__version__,
}


def remeasure_tasks(
    prepared: Any,
    records: Mapping[str, Sequence[Sequence[Any]]],
    config: RemeasureConfig,
    measure: MeasureConfig | None = None,
    rpc: RpcConfig | None = None,
) -> dict[str, TaskRemeasure]:
    """Re-measure the top ``config.top`` records of each of ``prepared``'s tasks, its library
    peer and TVM's default schedule (:func:`time_side_by_side`, all tasks' candidates together).

    ``records[task key]``: ``TuningRecord.as_json()`` lists, best recorded first (extra ones are
    ignored). A task is re-measured when it has two candidates or more, or a peer (timed even
    alone: its time goes into the estimate); the default schedule is one more candidate of such
    a task, and of a task with one record. With ``config`` off, only a task's best record, its
    peer and its default are timed. Returns the re-measured tasks by key, timed with
    ``measure`` (default: the target kind's) on this machine or through ``rpc``'s tracker,
    like the search's candidates. Never raises for a candidate that does not replay, build or
    run (it gets no rounds); returns ``{}`` when there is nothing to time or no rounds."""
    top = config.top if config.enabled else 1
    if config.rounds < 1:
        return {}
    jobs: list[tuple[Any, Candidate, Any, Any]] = []  # task, candidate, module, trace
    for task, extracted in zip(prepared.partition.tasks, prepared.partition.extracted):
        mod = extracted.dispatched[0]
        entries = [e for e in (records.get(task.key) or ()) if measurement(e[1])[0]][:top]
        peers = _peer_candidates(extracted, prepared.target, rpc) if task.tunable else []
        default = (
            _default_candidate(extracted, prepared.target)
            if task.tunable and (entries or peers)
            else None
        )
        if not peers and len(entries) + (default is not None) < 2:
            continue
        for entry in entries:
            candidate = Candidate(
                trace_hash=_hash_of(entry),
                record=tuple(entry),
                recorded_secs=measurement(entry[1])[1] or 0.0,
                rounds_secs=(),
            )
            jobs.append((task, candidate, mod, entry[0]))
        for module, description, call in peers:
            candidate = Candidate(
                trace_hash="",
                record=(),
                recorded_secs=0.0,
                rounds_secs=(),
                peer=description,
                peer_call=call,
            )
            jobs.append((task, candidate, module, None))
        if default is not None:
            candidate = Candidate(
                trace_hash="", record=(), recorded_secs=0.0, rounds_secs=(), default=default[1]
            )
            jobs.append((task, candidate, default[0], None))
    if not jobs:
        return {}
    rounds = time_side_by_side(
        [(mod, trace) for _, _, mod, trace in jobs], prepared.target, config.rounds, measure, rpc
    )
    out: dict[str, list[Candidate]] = {}
    names: dict[str, str] = {}
    for (task, candidate, _, _), secs in zip(jobs, rounds):
        names[task.key] = task.name
        out.setdefault(task.key, []).append(dataclasses.replace(candidate, rounds_secs=secs))
    result = {key: TaskRemeasure(key, names[key], tuple(c)) for key, c in out.items()}
    changed = sum(t.changed for t in result.values())
    peers = sum(t.peer_won for t in result.values())
    defaults = sum(t.default_won for t in result.values())
    logger.info(
        "re-measured %d candidates of %d tasks in %d rounds: %d winners changed, "
        "%d library peers and %d default schedules chosen",
        len(jobs),
        len(result),
        config.rounds,
        changed,
        peers,
        defaults,
    )
    return result


def peer_keys(remeasured: Mapping[str, TaskRemeasure]) -> dict[str, Any]:
    """The build's ``peers``: by task key, the :class:`compiler.peers.PeerCall` of each task
    whose re-measured winner is one of its library peers (the variant that won)."""
    return {
        key: task.winner.peer_call
        for key, task in remeasured.items()  # type: ignore[union-attr]
        if task.peer_won
    }


def records_for_build(
    records: Mapping[str, Sequence[Sequence[Any]]], remeasured: Mapping[str, TaskRemeasure]
) -> dict[str, list[list[Any]]]:
    """Per task key, the records the final build uses: a re-measured task's winner alone, its
    run times replaced by the rounds' times (what it measured side by side); none for a task
    whose default schedule won (it builds with the default); any other task's stored records
    unchanged."""
    out: dict[str, list[list[Any]]] = {key: [list(e) for e in v] for key, v in records.items()}
    for key, task in remeasured.items():
        winner = task.winner
        if winner is not None and winner.default is not None:
            out[key] = []
            continue
        if winner is None or winner.peer is not None:  # a peer's task keeps its records
            continue
        entry = list(winner.record)
        entry[1] = list(winner.rounds_secs)
        out[key] = [entry]
    return out


def remeasurements_json(remeasured: Mapping[str, TaskRemeasure]) -> list[dict[str, Any]]:
    """The manifest's ``remeasured`` list (one entry a re-measured task)."""
    return [task.to_json() for task in remeasured.values()]
