"""The last step of a job: re-measure the top schedules, compile with the winners, verify, publish.

:func:`choose_winners` re-measures each task's top records side by side
(:mod:`tuner.final_build.remeasure`) and gives the database the build uses; both callers below run
it first.

:func:`publish_tuned` is shared by a job run in one process (:func:`tuner.jobs.job.run_job`,
database: the SQL adapter) and by a distributed worker's finalize lease (database:
:func:`database_from_records`, an in-memory MetaSchedule database holding the best record of each
task fetched from the server). It promises what ``publish_artifact`` promises: the library is
verified against the reference framework from disk before anything is published; otherwise
:class:`compiler.errors.VerificationError` and nothing is written. It also promises that the
published library is never slower end to end than the zero-trial build it replaces, as far as
side-by-side timing can tell: it builds both, times both whole models in alternating rounds
and publishes the faster (:mod:`tuner.final_build.final_choice`; the manifest's ``final_choice``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm
from tvm.s_tir import meta_schedule as ms

from compiler.build.artifact import peers_extra, peers_manifest, publish_artifact
from compiler.build.artifact_layout import LIBRARY_NAME
from compiler.build.builder import build, build_zero_trial, export_library
from compiler.build.runner import LoadedLibrary, Timing
from compiler.build.verify import model_inputs, time_reference
from compiler.errors import VerificationError
from compiler.peers import device_of, find_peer, library_for
from compiler.prepare import PreparedModel
from db.metaschedule_database import record_as_json, replay_error
from db.types import measurement
from tuner.final_build.final_choice import (
    ROUNDS_ENV,
    TUNED,
    ZERO_TRIAL,
    CompareConfig,
    FinalChoice,
    decide,
    time_side_by_side,
)
from tuner.final_build.remeasure import (
    RemeasureConfig,
    TaskRemeasure,
    peer_keys,
    records_for_build,
    remeasure_tasks,
    remeasurements_json,
)
from tuner.measuring.builder_runner import MeasureConfig, RpcConfig

logger = logging.getLogger("tunehub.finalize")

#: An executable and the keys of the tasks it computes with their library peer.
Built = tuple[Any, frozenset[str]]


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
    """Re-measure each task's top ``records`` side by side (:mod:`tuner.final_build.remeasure`) and
    return the database the final build uses. With ``config`` off, the database holds
    ``records``."""
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
    compare: CompareConfig | None = None,
    follow: FinalChoice | None = None,
) -> tuple[dict[str, Any], Timing | None]:
    """Build ``prepared`` with ``database``'s best schedules and the library peers of the tasks
    keyed in ``peers`` (:attr:`Winners.peers`), build its zero-trial library too, time both whole
    models side by side and publish the faster (:mod:`tuner.final_build.final_choice`); verify and
    time the published library, write ``out_dir`` (``model.so`` + ``manifest.json``); return the
    manifest and the published library's timing.

    The manifest's ``final_choice`` says which library was published and why. With the tuned
    library, ``schedules`` are ``outcomes``, ``estimated_ms`` :func:`estimated_secs` of them and
    ``peers`` the library the artifact needs. With the zero-trial library, ``schedules`` say
    what it runs (each task's peer or ``default``, no times: :func:`zero_trial_outcomes`),
    ``estimated_ms`` is ``None``, ``peers`` are its peers, and ``final_choice.tuned_build``
    keeps the tuned build's table, estimate and peers (not published). Either way ``tuned`` is
    true (a job's final build) and ``remeasured`` is what :meth:`Winners.to_json` reported.

    ``compare``: the comparison's setting (default :meth:`CompareConfig.from_env`; off: the
    tuned library, not compared). ``follow``: a choice made elsewhere (a server's rebuild
    following the worker's manifest): nothing is timed, ``follow.published`` is built.
    ``not_run_because``: this machine cannot run the target's code; the tuned library (or the
    followed choice) is built and written, not verified or timed
    (:func:`compiler.build.artifact.publish_artifact`), timing ``None``. A zero-trial library that
    fails to build, to time or to verify is not published: the tuned one is, and
    ``final_choice`` says why. Raises :class:`compiler.errors.VerificationError` (nothing
    written) when the published library does not verify.
    """
    estimate = estimated_secs(outcomes)
    tuned_extra = {
        "tuned": True,
        "job_id": job_id,
        "trials_measured": trials_measured,
        "schedules": [o.to_json() for o in outcomes],
        "estimated_ms": None if estimate is None else estimate * 1e3,
        "remeasured": remeasured or [],
        "peers": peers_manifest(peers, prepared.target),
    }
    tuned = build(prepared.mod, prepared.target, database, peers=peers)
    built = (tuned, frozenset(peers))
    zero, choice = _final_choice(prepared, built, follow, not_run_because, compare)
    if zero is not None and choice.published == ZERO_TRIAL:
        executable, zero_keys = zero
        extra = _zero_trial_extra(prepared, tuned_extra, outcomes, zero_keys, choice)
        try:
            return _publish(prepared, executable, out_dir, extra, zero_keys, force, not_run_because)
        except VerificationError as err:
            logger.warning("the zero-trial library failed verification: %s", err)
            why = f"the zero-trial library failed verification ({str(err)[:300]}); the tuned "
            why += "one is published"
            choice = dataclasses.replace(choice, published=TUNED, note=why)
    extra = {**tuned_extra, "final_choice": choice.to_json()}
    return _publish(prepared, tuned, out_dir, extra, peers, force, not_run_because)


def _final_choice(
    prepared: PreparedModel,
    tuned: Built,
    follow: FinalChoice | None,
    not_run_because: str | None,
    compare: CompareConfig | None,
) -> tuple[Built | None, FinalChoice]:
    """Which library :func:`publish_tuned` publishes, and the zero-trial build when it was
    made (compared, or followed): see :func:`publish_tuned` for the cases."""
    if follow is not None:
        if follow.published != ZERO_TRIAL:
            return None, follow
        zero = _zero_trial_build(prepared)
        if isinstance(zero, str):
            return None, dataclasses.replace(follow, published=TUNED, note=zero)
        return zero, follow
    if not_run_because is not None:
        why = f"the target's code cannot run here: {not_run_because}"
        return None, FinalChoice.not_compared(why)
    config = compare or CompareConfig.from_env()
    if not config.enabled:
        return None, FinalChoice.not_compared(f"{ROUNDS_ENV}=0: the comparison is off")
    zero = _zero_trial_build(prepared)
    if isinstance(zero, str):
        return None, FinalChoice.not_compared(zero)
    return zero, _compare(prepared, tuned, zero, config)


def _zero_trial_extra(
    prepared: PreparedModel,
    tuned_extra: Mapping[str, Any],
    outcomes: Sequence[TaskOutcome],
    zero_keys: frozenset[str],
    choice: FinalChoice,
) -> dict[str, Any]:
    """The manifest fields of a final build that publishes the zero-trial library: what the
    library runs (``schedules``, ``peers``, no estimate) and ``final_choice``, with the tuned
    build that was not published described in ``final_choice.tuned_build``."""
    schedules = [o.to_json() for o in zero_trial_outcomes(prepared, outcomes, zero_keys)]
    tuned_build = {key: tuned_extra[key] for key in ("schedules", "estimated_ms", "peers")}
    return {
        **tuned_extra,
        "schedules": schedules,
        "estimated_ms": None,
        **peers_extra(zero_keys, prepared.target),
        "final_choice": {**choice.to_json(), "tuned_build": tuned_build},
    }


def _publish(
    prepared: PreparedModel,
    executable: Any,
    out_dir: Path,
    extra: dict[str, Any],
    peers: Collection[str],
    force: bool,
    not_run_because: str | None,
) -> tuple[dict[str, Any], Timing | None]:
    """:func:`compiler.build.artifact.publish_artifact` of ``executable`` (built with the peers of
    ``peers``) with manifest fields ``extra``, plus, when it runs here, its timing on seeded
    inputs (``measured``) and the reference framework's (``reference``); returns the manifest
    and the timing (``None``: not run)."""
    timing: dict[str, Timing] = {}

    def timed_extra(library: LoadedLibrary) -> dict[str, Any]:
        timing["t"] = library.time(model_inputs(prepared.model))
        return {**extra, "measured": timing["t"].to_json(), "reference": reference_timing(prepared)}

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


def build_zero_trial_of(prepared: PreparedModel) -> Built:
    """``prepared``'s zero-trial executable (:func:`compiler.build.builder.build_zero_trial`) and
    the keys of the tasks it computes with their library peer."""
    tasks = [
        (t.key, e.dispatched[0])
        for t, e in zip(prepared.partition.tasks, prepared.partition.extracted)
    ]
    return build_zero_trial(prepared.mod, prepared.target, tasks)


def _zero_trial_build(prepared: PreparedModel) -> Built | str:
    """:func:`build_zero_trial_of` ``prepared``, or why it failed (never raises: a final build
    does not fail over its comparison)."""
    try:
        return build_zero_trial_of(prepared)
    except Exception as err:  # noqa: BLE001 - TVM raises many kinds
        logger.warning("the zero-trial build for the final comparison failed: %s", err)
        return f"the zero-trial build failed: {type(err).__name__}: {str(err)[:300]}"


def _compare(
    prepared: PreparedModel,
    tuned: Built,
    zero_trial: Built,
    config: CompareConfig,
) -> FinalChoice:
    """Time the tuned and the zero-trial build (each an executable and the keys of its peer
    tasks) side by side on seeded inputs (:func:`tuner.final_build.final_choice.time_side_by_side`)
    and
    :func:`tuner.final_build.final_choice.decide`; a comparison that fails publishes the tuned
    library, saying why. Each is exported (peers linked) and loaded from disk as it would be
    published: running an executable in this process (``LoadedLibrary.from_executable``: TVM's JIT)
    changes the bytes it exports afterwards, and a server's rebuild is checked against those
    bytes."""
    model = prepared.model
    try:
        with tempfile.TemporaryDirectory(prefix="tunehub-final-") as tmp:
            libraries = [
                _exported(prepared, executable, keys, Path(tmp) / name / LIBRARY_NAME)
                for name, (executable, keys) in ((TUNED, tuned), (ZERO_TRIAL, zero_trial))
            ]
            tuned_rounds, zero_rounds = time_side_by_side(libraries, model_inputs(model), config)
    except Exception as err:  # noqa: BLE001 - never fail a job over the comparison
        logger.warning("the final comparison failed: %s", err)
        return FinalChoice.not_compared(
            f"the comparison failed: {type(err).__name__}: {str(err)[:300]}"
        )
    choice = decide(tuned_rounds, zero_rounds)
    logger.info(
        "final build: tuned %.4f ms, zero-trial %.4f ms over %d rounds: publishing %s",
        (choice.tuned_secs or 0) * 1e3,
        (choice.zero_trial_secs or 0) * 1e3,
        config.rounds,
        choice.published,
    )
    return choice


def _exported(
    prepared: PreparedModel, executable: Any, peers: Collection[str], path: Path
) -> LoadedLibrary:
    """``executable`` (built with the peers of ``peers``) exported to ``path`` and loaded on
    the target's device with the model's buckets and state."""
    library = export_library(executable, path, link_peers=bool(peers), target=prepared.target)
    return LoadedLibrary(
        library,
        prepared.target.device,
        buckets=[b.to_json() for b in prepared.model.buckets],
        state=prepared.model.state,
    )


def zero_trial_outcomes(
    prepared: PreparedModel, outcomes: Sequence[TaskOutcome], peer_keys: Collection[str]
) -> list[TaskOutcome]:
    """``outcomes`` (what the job did with each task) as the zero-trial library computes them:
    a task in ``peer_keys`` with its peer (``implementation`` the library and call, e.g.
    ``"openblas gemm"``), every other task with TVM's default schedule (``"default"``); no
    times (``best_secs`` ``None``: nothing of it was measured alone)."""
    names = _peer_names(prepared, peer_keys)
    return [
        dataclasses.replace(
            outcome, implementation=names.get(outcome.key, "default"), best_secs=None
        )
        for outcome in outcomes
    ]


def _peer_names(prepared: PreparedModel, peer_keys: Collection[str]) -> dict[str, str]:
    """By task key in ``peer_keys``, the zero-trial peer it calls (``"<library> <kind>"``)."""
    library = library_for(prepared.target) if peer_keys else None
    if library is None:
        return {}
    device = device_of(prepared.target)
    names = {}
    for task, extracted in zip(prepared.partition.tasks, prepared.partition.extracted):
        call = find_peer(extracted.dispatched[0], device) if task.key in peer_keys else None
        if call is not None:
            names[task.key] = f"{library.describe_for(call).get('library', 'library')} {call.kind}"
    return names


def publish_zero_trial(
    prepared: PreparedModel,
    out_dir: Path,
    *,
    job_id: int | None = None,
    force: bool = False,
    not_run_because: str | None = None,
) -> dict[str, Any]:
    """The zero-trial library of ``prepared``: every task with a library peer on it, the others
    on TVM's default schedules (:func:`compiler.build.builder.build_zero_trial`), no records;
    verified, timed and written to ``out_dir`` like every artifact (:func:`publish_artifact`:
    nothing is written when the verification fails, :class:`compiler.errors.VerificationError`). The
    manifest says ``zero_trial``, the peers used (``peers``) or why none (``peers_skipped``)
    and, for a job's preview, its ``job_id``. Returns the manifest. ``not_run_because``: built,
    not verified or timed (as :func:`publish_tuned`)."""
    executable, peers = build_zero_trial_of(prepared)
    extra: dict[str, Any] = {
        "tuned": False,
        "zero_trial": True,
        **peers_extra(peers, prepared.target),
    }
    if job_id is not None:
        extra["job_id"] = job_id
    return _publish(prepared, executable, out_dir, extra, peers, force, not_run_because)[0]


def tvm_module(mod_json: str) -> tvm.IRModule:
    """The TIR module of a workload from its stored JSON (``tvm.ir.save_json``)."""
    return tvm.ir.load_json(mod_json)


def finalize_outcomes(
    prepared: PreparedModel, tasks: Sequence[Any], best: Mapping[str, Sequence[Sequence[Any]]]
) -> list[TaskOutcome]:
    """The schedule table of a finalize lease: each of the model's tasks with the job's task
    row (``tasks``: :class:`tuner.jobs.protocol.JobTaskInfo`, by workload key) and its best record
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
