"""The last step of a job: re-measure the top schedules, compile with the winners, verify, publish.

:func:`choose_winners` re-measures each task's top records side by side (:mod:`tuner.remeasure`)
and gives the database the build uses; both callers below run it first.

:func:`publish_tuned` is shared by a job run in one process (:func:`tuner.job.run_job`, database:
the SQL adapter) and by a distributed worker's finalize lease (database:
:func:`database_from_records`, an in-memory MetaSchedule database holding the best record of each
task fetched from the server). It promises what ``publish_artifact`` promises: the library is
verified against the reference framework from disk before anything is published; otherwise
:class:`compiler.errors.VerificationError` and nothing is written.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm
from tvm.s_tir import meta_schedule as ms

from compiler.artifact import peers_extra, peers_manifest, publish_artifact
from compiler.build import build, build_zero_trial
from compiler.prepare import PreparedModel
from compiler.runner import LoadedLibrary, Timing
from compiler.verify import random_inputs, time_reference
from db.metaschedule_database import record_as_json, replay_error
from db.types import measurement
from tuner.measure import MeasureConfig, RpcConfig
from tuner.remeasure import (
    RemeasureConfig,
    TaskRemeasure,
    peer_keys,
    records_for_build,
    remeasure_tasks,
    remeasurements_json,
)

logger = logging.getLogger("tunehub.finalize")


def database_from_records(
    prepared: PreparedModel, records: Mapping[str, Sequence[Sequence[Any]]]
) -> ms.database.MemoryDatabase:
    """An in-memory MetaSchedule database with ``records[task key]`` (``TuningRecord.as_json()``
    lists, best first) committed for each of the model's tasks. Tasks without records compile
    with TVM's default schedules."""
    database = ms.database.MemoryDatabase()
    for task, extracted in zip(prepared.partition.tasks, prepared.partition.extracted):
        entries = records.get(task.key) or ()
        if not entries:
            continue
        mod = extracted.dispatched[0]
        workload = database.commit_workload(mod)
        for entry in entries:
            # One bad record never fails the build: it is skipped, the next best is used.
            problem = replay_error(mod, entry[0]) if entry else "an empty record"
            if problem is None:
                try:
                    record = ms.database.TuningRecord.from_json(list(entry), workload)
                except Exception as err:  # noqa: BLE001 - TVM raises many kinds
                    problem = f"{type(err).__name__}: {err}"
            if problem is not None:
                logger.warning(
                    "task %s: a record was skipped (it does not replay: %s)",
                    task.name,
                    problem[:300],
                )
                continue
            database.commit_tuning_record(record)
    return database


def expected_args_info(mod: tvm.IRModule) -> list | None:
    """The argument info (``TuningRecord.as_json()[3]``) of a workload's records, as plain JSON;
    ``None`` when it cannot be derived (then it is not checked)."""
    import json  # noqa: PLC0415

    try:
        infos = ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True)
        return json.loads(json.dumps([_plain(a.as_json()) for a in infos]))
    except Exception:  # noqa: BLE001
        return None


def _plain(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    try:
        return [_plain(v) for v in value]
    except TypeError:
        return str(value)


def reference_timing(prepared: PreparedModel) -> dict[str, Any] | None:
    """The reference framework's median latency on the same seeded inputs, for CPU targets:
    ONNX Runtime for ONNX models, torch eager for ``.pt2``, with as many threads as this process
    may use (the library's thread pool uses them all). ``None`` on GPU targets (a CPU reference
    is no bar there). Costs 21 calls of the reference."""
    if prepared.target.kind != "cpu":
        return None
    threads = len(os.sched_getaffinity(0))
    secs = time_reference(prepared.model, threads=threads)
    framework = "onnxruntime" if prepared.model.format == "onnx" else "torch"
    return {"framework": framework, "threads": threads, "median_ms": secs * 1e3}


@dataclass(frozen=True)
class TaskOutcome:
    """One task of a job as its artifact's schedule table reports it: what the job did with it
    (``tune``, ``reuse``, ``skip``, ``defer``) and why, its weight, FLOPs, the job's trials on
    it and its best measured latency (``None``: no valid record; it builds with TVM's default),
    and its ``implementation``: ``"schedule"`` (tuned TIR), ``"default"`` (TVM's default
    schedule measured faster than its records) or the library peer's (e.g. ``"openblas gemm"``)."""

    key: str
    name: str
    action: str
    reason: str
    weight: int
    flops: float
    trials: int
    best_secs: float | None
    implementation: str = "schedule"

    def to_json(self) -> dict[str, Any]:
        return {
            "implementation": self.implementation,
            "key": self.key,
            "name": self.name,
            "action": self.action,
            "reason": self.reason,
            "weight": self.weight,
            "flops": self.flops,
            "trials": self.trials,
            "best_ms": None if self.best_secs is None else self.best_secs * 1e3,
        }


def estimated_secs(outcomes: Sequence[TaskOutcome]) -> float | None:
    """The model's latency as its tasks' best records add up (weight x best), or ``None`` when
    a task has no valid record (or there are no tasks)."""
    if not outcomes or any(o.best_secs is None for o in outcomes):
        return None
    return sum(o.weight * o.best_secs for o in outcomes)  # type: ignore[operator]


def top_records(prepared: PreparedModel, database: Any, k: int) -> dict[str, list[list[Any]]]:
    """Per task key, the ``k`` best valid records ``database`` (any MetaSchedule database, e.g.
    the SQL adapter) holds for the task, best first, as ``TuningRecord.as_json()`` lists."""
    out: dict[str, list[list[Any]]] = {}
    for task, extracted in zip(prepared.partition.tasks, prepared.partition.extracted):
        mod = extracted.dispatched[0]
        if not database.has_workload(mod):
            continue
        workload = database.commit_workload(mod)
        out[task.key] = [record_as_json(r) for r in database.get_top_k(workload, k)]
    return out


@dataclass(frozen=True)
class Winners:
    """What the final build uses: ``database`` holds, per task, the re-measured winner (or the
    best stored records of a task that was not re-measured); ``remeasured`` by task key."""

    database: Any
    remeasured: Mapping[str, TaskRemeasure]

    @property
    def peers(self) -> dict[str, Any]:
        """By key, the tasks the build computes with a library peer, and the variant
        (:class:`compiler.peers.PeerCall`) each measured fastest."""
        return peer_keys(self.remeasured)

    def outcomes(self, outcomes: Sequence[TaskOutcome]) -> list[TaskOutcome]:
        """``outcomes`` with each re-measured task's best time replaced by its winner's
        re-measured median (what the build's schedule or peer measured side by side)."""
        out = []
        for outcome in outcomes:
            task = self.remeasured.get(outcome.key)
            winner = task.winner if task is not None else None
            if winner is not None:
                outcome = dataclasses.replace(outcome, best_secs=winner.median_secs)
            if winner is not None and winner.peer is not None:
                outcome = dataclasses.replace(
                    outcome, implementation=f"{winner.peer['library']} {winner.peer['kind']}"
                )
            elif winner is not None and winner.default is not None:
                outcome = dataclasses.replace(outcome, implementation="default")
            out.append(outcome)
        return out

    def to_json(self) -> list[dict[str, Any]]:
        return remeasurements_json(self.remeasured)


def choose_winners(
    prepared: PreparedModel,
    records: Mapping[str, Sequence[Sequence[Any]]],
    config: RemeasureConfig,
    measure: MeasureConfig | None = None,
    rpc: RpcConfig | None = None,
) -> Winners:
    """Re-measure each task's top ``records`` side by side (:mod:`tuner.remeasure`) and return
    the database the final build uses. With ``config`` off, the database holds ``records``."""
    remeasured = remeasure_tasks(prepared, records, config, measure, rpc)
    return Winners(
        database_from_records(prepared, records_for_build(records, remeasured)), remeasured
    )


def publish_tuned(
    prepared: PreparedModel,
    database: Any,
    out_dir: Path,
    *,
    job_id: int,
    trials_measured: int,
    outcomes: Sequence[TaskOutcome],
    force: bool = False,
    remeasured: list[dict[str, Any]] | None = None,
    peers: Collection[str] = (),
    not_run_because: str | None = None,
) -> tuple[dict[str, Any], Timing | None]:
    """Build ``prepared`` with ``database``'s best schedules and the library peers of the tasks
    keyed in ``peers`` (:attr:`Winners.peers`), verify and time it, write ``out_dir``
    (``model.so`` + ``manifest.json``, whose ``schedules`` are ``outcomes``, ``estimated_ms``
    :func:`estimated_secs` of them, ``remeasured`` what :meth:`Winners.to_json` reported and
    ``peers`` the library the artifact needs); return the manifest and the timing.
    ``not_run_because``: this machine cannot run the target's code; the library is built and
    written, not verified or timed (:func:`compiler.artifact.publish_artifact`), timing ``None``."""
    timing: dict[str, Timing] = {}
    estimate = estimated_secs(outcomes)
    extra = {
        "tuned": True,
        "job_id": job_id,
        "trials_measured": trials_measured,
        "schedules": [o.to_json() for o in outcomes],
        "estimated_ms": None if estimate is None else estimate * 1e3,
        "remeasured": remeasured or [],
        "peers": peers_manifest(peers, prepared.target),
    }

    def timed_extra(library: LoadedLibrary) -> dict[str, Any]:
        timing["t"] = library.time(random_inputs(prepared.model.inputs))
        return {
            **extra,
            "measured": timing["t"].to_json(),
            "reference": reference_timing(prepared),
        }

    executable = build(prepared.mod, prepared.target, database, peers=peers)
    manifest = publish_artifact(
        executable,
        prepared.model,
        prepared.target,
        out_dir,
        tasks=[t.to_json() for t in prepared.partition.tasks],
        extra=extra if not_run_because else timed_extra,
        force=force,
        link_peers=bool(peers),
        not_run_because=not_run_because,
    )
    return manifest, timing.get("t")


def publish_zero_trial(
    prepared: PreparedModel,
    out_dir: Path,
    *,
    job_id: int | None = None,
    force: bool = False,
    not_run_because: str | None = None,
) -> dict[str, Any]:
    """The zero-trial library of ``prepared``: every task with a library peer on it, the others
    on TVM's default schedules (:func:`compiler.build.build_zero_trial`), no records; verified,
    timed and written to ``out_dir`` like every artifact (:func:`publish_artifact`: nothing is
    written when the verification fails, :class:`compiler.errors.VerificationError`). The
    manifest says ``zero_trial``, the peers used (``peers``) or why none (``peers_skipped``)
    and, for a job's preview, its ``job_id``. Returns the manifest. ``not_run_because``: built,
    not verified or timed (as :func:`publish_tuned`)."""
    tasks = [
        (t.key, e.dispatched[0])
        for t, e in zip(prepared.partition.tasks, prepared.partition.extracted)
    ]
    executable, peers = build_zero_trial(prepared.mod, prepared.target, tasks)
    extra: dict[str, Any] = {
        "tuned": False,
        "zero_trial": True,
        **peers_extra(peers, prepared.target),
    }
    if job_id is not None:
        extra["job_id"] = job_id

    def timed_extra(library: LoadedLibrary) -> dict[str, Any]:
        timing = library.time(random_inputs(prepared.model.inputs))
        return {**extra, "measured": timing.to_json(), "reference": reference_timing(prepared)}

    return publish_artifact(
        executable,
        prepared.model,
        prepared.target,
        out_dir,
        tasks=[t.to_json() for t in prepared.partition.tasks],
        extra=extra if not_run_because else timed_extra,
        force=force,
        link_peers=bool(peers),
        not_run_because=not_run_because,
    )


def tvm_module(mod_json: str) -> tvm.IRModule:
    """The TIR module of a workload from its stored JSON (``tvm.ir.save_json``)."""
    return tvm.ir.load_json(mod_json)


def finalize_outcomes(
    prepared: PreparedModel, tasks: Sequence[Any], best: Mapping[str, Sequence[Sequence[Any]]]
) -> list[TaskOutcome]:
    """The schedule table of a finalize lease: each of the model's tasks with the job's task
    row (``tasks``: :class:`tuner.work.JobTaskInfo`, by workload key) and its best record
    (``best[key]``: ``TuningRecord.as_json()`` lists). A task the job tuned is ``tune``, one it
    took from the database ``reuse``, one the job had no row for ``skip``."""
    by_key = {t.workload_key: t for t in tasks}
    outcomes = []
    for task in prepared.partition.tasks:
        known = by_key.get(task.key)
        records = best.get(task.key) or ()
        outcomes.append(
            TaskOutcome(
                key=task.key,
                name=task.name,
                weight=task.weight,
                flops=task.flops,
                action="tune" if known and known.trials_done else "reuse" if known else "skip",
                reason="" if known else (task.skip_reason or "not tunable"),
                trials=known.trials_done if known else 0,
                best_secs=measurement(records[0][1])[1] if records else None,
            )
        )
    return outcomes
