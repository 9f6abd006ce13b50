"""A tuning job end to end: plan, search, compile from the database, verify, publish.

``tune_model`` is the product's core loop for one model and one target. It promises:

- every measured candidate (failures too, with error text) is in the SQL database, tagged with
  the job, before the next batch starts;
- the budget counts this job's stored records, so a run killed at any point (``kill -9``) and
  restarted with the same command resumes the same job with the remaining budget, losing at most
  the batch that was being measured;
- tasks already tuned for this target and hardware (by any job, for any model) are reused without
  measurements unless ``continue_tuning``; a model whose tasks are all known compiles with zero;
- the artifact is built from each task's re-measured winner (its top records measured again side
  by side, :mod:`tuner.final_build.remeasure`; the re-measurements are stored), verified against the
  reference framework from disk, and published only if verification passes (otherwise the job
  fails, nothing is written); its manifest records the library's measured latency and, on CPU
  targets, the reference framework's on the same inputs (``reference``);
- the published library is the faster of the tuned build and the model's zero-trial build,
  timed whole side by side (:mod:`tuner.final_build.final_choice`;
  ``TUNEHUB_FINAL_COMPARE_ROUNDS=0`` turns it off); the manifest's and the summary's
  ``final_choice`` say which and why.

A model with symbolic dimensions is one job over the union of its shape buckets' tasks
(:mod:`compiler.shapes.buckets`: a task several buckets share is one task, its weight the sum),
built into one library with a function per bucket, verified at every bucket; the summary's
``buckets`` says which (and which symbols got the default buckets).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compiler.build.artifact import check_output_dir
from compiler.build.artifact_layout import LIBRARY_NAME, job_artifact_dir
from compiler.build.runner import Timing
from compiler.frontends.model_spec import buckets_json
from compiler.prepare import PreparedModel
from compiler.task_family import workload_family
from db import Job, JobStatus, NewJobTask, TuningStorage
from db.config import default_storage_dir
from db.metaschedule_database import MetaScheduleDatabase, RecordErrorsCallback
from tuner.engine.cost_models import CostModelChoice, resolve_cost_model
from tuner.engine.reports import SearchReport
from tuner.engine.search import SearchConfig, reset_metaschedule_logging, run_search
from tuner.engine.search_time import SearchTime
from tuner.final_build.final_choice import CompareConfig, final_choice_summary
from tuner.final_build.finalize import (
    TaskOutcome,
    choose_winners,
    estimated_secs,
    publish_tuned,
    top_records,
)
from tuner.final_build.remeasure import RemeasureConfig
from tuner.final_build.remeasure_store import store_remeasurements
from tuner.jobs.plan import TuningPlan, plan_tuning
from tuner.jobs.start import plan_job, record_search
from tuner.jobs.workloads import register_prepared
from tuner.measure_callback.progress import ProgressCallback, ProgressListener, RunState
from tuner.measuring.builder_runner import MeasureConfig
from tuner.task_scheduler.sibling_seeds import SeedTask, SiblingSeeds

RESUMABLE = (JobStatus.RUNNING, JobStatus.QUEUED)


@dataclass(frozen=True)
class TuneSummary:
    """What a job run reports (``tunehub tune --json`` prints :meth:`to_json`). ``tasks``: the
    job's schedule table (what it did with each task, the tuned build's implementation);
    ``measured``: the published library's timing; ``extra["final_choice"]``: whether that
    library is the tuned or the zero-trial build
    (:meth:`tuner.final_build.final_choice.FinalChoice.to_json`, without the unpublished build's
    table); ``extra["search_time"]``: where this run's search spent its time
    (:meth:`tuner.engine.search_time.SearchTime.to_json`; ``None``: nothing searched)."""

    job_id: int
    resumed: bool
    trial_budget: int
    trials_measured: int
    trials_this_run: int
    tasks: tuple[TaskOutcome, ...]
    estimated_secs: float | None
    measured: Timing | None
    verification: dict[str, Any]
    artifact_dir: str | None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tasks_reused(self) -> int:
        return sum(1 for t in self.tasks if t.action == "reuse")

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "resumed": self.resumed,
            "trial_budget": self.trial_budget,
            "trials_measured": self.trials_measured,
            "trials_this_run": self.trials_this_run,
            "tasks_total": len(self.tasks),
            "tasks_tuned": sum(1 for t in self.tasks if t.action == "tune"),
            "tasks_reused": self.tasks_reused,
            "tasks_skipped": sum(1 for t in self.tasks if t.action in ("skip", "defer")),
            "estimated_ms": None if self.estimated_secs is None else self.estimated_secs * 1e3,
            "measured": None if self.measured is None else self.measured.to_json(),
            "verification": self.verification,
            "artifact_dir": self.artifact_dir,
            "tasks": [t.to_json() for t in self.tasks],
            **self.extra,
        }


class JobRowWriter:
    """Progress listener that writes per-task and per-job progress to the database."""

    def __init__(self, storage: TuningStorage, job_id: int, task_ids: dict[str, int]) -> None:
        self.storage = storage
        self.job_id = job_id
        self.task_ids = task_ids

    def on_batch(self, update) -> None:
        task_id = self.task_ids.get(update.task.key)
        if task_id is not None:
            self.storage.update_job_task_progress(
                task_id, trials_done=update.task_trials, best_mean_secs=update.task_best_secs
            )
        self.storage.add_job_trials(self.job_id, update.batch_trials)


def _sibling_seeds(database, to_tune, workload_ids, search) -> SiblingSeeds | None:
    """The run's :class:`tuner.task_scheduler.sibling_seeds.SiblingSeeds`, unless the search turns
    off both their uses (measured seeds, primed populations)."""
    config = search or SearchConfig()
    if not (config.sibling_seeds or config.sibling_population):
        return None
    return SiblingSeeds(
        database, [SeedTask(workload_ids[t.key], workload_family(t.name), t.flops) for t in to_tune]
    )


def _register_model(storage: TuningStorage, prepared: PreparedModel, filename: str, owner: str):
    return storage.add_model(
        content_hash=prepared.model.sha256,
        format=prepared.model.format,
        filename=filename,
        size=prepared.model.size_bytes,
        owner=owner,
    )


def _find_or_create_job(storage, *, model_id, target_id, trials, owner, continue_tuning):
    """The job this run resumes (same model, target, owner and budget, still open) or a new
    one, pinned to this run (:func:`run_worker_name`) and started through the service's planner
    (:func:`tuner.jobs.start.plan_job`), so its tasks and their allotments are what a REST job of
    the same model gets. An open job of
    another budget is cancelled (superseded). Raises ``RuntimeError`` when a worker on the same
    database started the new job first."""
    for job in storage.list_jobs(limit=1000):
        if (
            job.model_id == model_id
            and job.target_id == target_id
            and job.owner == owner
            and job.status in RESUMABLE
        ):
            if job.trial_budget == trials:
                if job.status == JobStatus.QUEUED:
                    job = _start(storage, job, continue_tuning)
                return job, True
            storage.transition_job(
                job.id, JobStatus.CANCELLED, error=f"superseded by a run with {trials} trials"
            )
    job = storage.create_job(
        target_id=target_id,
        trial_budget=trials,
        model_id=model_id,
        owner=owner,
        pinned_to=run_worker_name,
    )
    return _start(storage, job, continue_tuning), False


def run_worker_name(job_id: int) -> str:
    """The worker a ``tunehub tune`` run's job is pinned to (``Job.worker``): no worker of a
    service sharing the database plans it, leases its tasks or finalizes it meanwhile."""
    return f"tunehub-tune-{job_id}"


def _start(storage: TuningStorage, job: Job, continue_tuning: bool) -> Job:
    started = plan_job(storage, job, continue_tuning=continue_tuning)
    if started is None:
        current = storage.get_job(job.id)
        raise RuntimeError(
            f"job {job.id} could not be started here: it is "
            f"{current.status if current else 'gone'}"
            + (f" ({current.error})" if current and current.error else "")
        )
    return started


def _best_secs(storage: TuningStorage, workload_id: int, target_id: int) -> float | None:
    row = storage.best_record(workload_id, target_id)
    return None if row is None else row.mean_secs


def _ensure_job_tasks(storage, job, plan: TuningPlan, workload_ids, target_id) -> dict[str, int]:
    existing = {t.workload_id: t for t in storage.list_job_tasks(job.id)}
    wanted = [d for d in plan.decisions if d.action in ("tune", "reuse")]
    new = [
        NewJobTask(
            workload_id=workload_ids[d.task.key],
            name=d.task.name,
            weight=d.task.weight,
            flops=d.task.flops,
            trial_budget=0 if d.action == "reuse" else plan.trials,
        )
        for d in wanted
        if workload_ids[d.task.key] not in existing
    ]
    for task in storage.add_job_tasks(job.id, new) if new else []:
        existing[task.workload_id] = task
    ids: dict[str, int] = {}
    for decision in wanted:
        task = existing[workload_ids[decision.task.key]]
        ids[decision.task.key] = task.id
        if task.status == JobStatus.QUEUED:
            task = storage.transition_job_task(
                task.id, JobStatus.RUNNING, expected=JobStatus.QUEUED
            )
        if decision.action == "reuse" and task.status == JobStatus.RUNNING:
            best = _best_secs(storage, workload_ids[decision.task.key], target_id)
            storage.update_job_task_progress(task.id, best_mean_secs=best)
            storage.transition_job_task(task.id, JobStatus.SUCCEEDED, expected=JobStatus.RUNNING)
    return ids


def default_artifact_dir(job_id: int) -> Path:
    """Where a job's artifact goes without ``-o``: the service's folder for it, so ``tunehub
    serve`` on the same home serves it (:func:`compiler.build.artifact_layout.job_artifact_dir`)."""
    return job_artifact_dir(default_storage_dir(), job_id)


def tune_model(
    storage: TuningStorage,
    prepared: PreparedModel,
    *,
    trials: int,
    output_dir: Path | None = None,
    filename: str = "model",
    owner: str = "cli",
    continue_tuning: bool = False,
    measure: MeasureConfig | None = None,
    search: SearchConfig | None = None,
    listeners: Sequence[ProgressListener] = (),
    force: bool = False,
    seed: int | None = None,
    cost_model: str | CostModelChoice = "auto",
) -> TuneSummary:
    """Tune, compile, verify and publish (see the module docstring).

    ``cost_model`` is a mode of :func:`tuner.engine.cost_models.choose_cost_model` or a model
    already chosen with it. It is resolved before any row is written, so
    :class:`tuner.engine.cost_models.CostModelUnavailable` leaves no job behind.

    Raises :class:`compiler.errors.VerificationError` (job failed, nothing published) when the tuned
    library does not match the reference; other exceptions also fail the job. ``KeyboardInterrupt``
    leaves the job resumable.
    """
    if trials < 0:
        raise ValueError(f"--trials must be >= 0, got {trials}")
    if output_dir is not None:
        check_output_dir(output_dir, force=force)
    cost_model = resolve_cost_model(storage, prepared.target, cost_model)
    target_row = storage.ensure_target(prepared.target)
    model_row = _register_model(storage, prepared, filename, owner)
    workload_ids = register_prepared(storage, prepared, model_row.id)  # the planner reads them
    job, resumed = _find_or_create_job(
        storage,
        model_id=model_row.id,
        target_id=target_row.id,
        trials=trials,
        owner=owner,
        continue_tuning=continue_tuning,
    )
    return run_job(
        storage,
        prepared,
        job,
        resumed=resumed,
        output_dir=output_dir,
        continue_tuning=continue_tuning,
        measure=measure,
        search=search,
        listeners=listeners,
        force=force,
        seed=seed,
        cost_model=cost_model,
        workload_ids=workload_ids,
    )


def run_job(
    storage: TuningStorage,
    prepared: PreparedModel,
    job: Job,
    *,
    resumed: bool = False,
    output_dir: Path | None = None,
    continue_tuning: bool = False,
    measure: MeasureConfig | None = None,
    search: SearchConfig | None = None,
    listeners: Sequence[ProgressListener] = (),
    force: bool = False,
    seed: int | None = None,
    cost_model: str | CostModelChoice = "auto",
    workload_ids: dict[str, int] | None = None,
) -> TuneSummary:
    """Run a job the caller has moved to ``running`` (a CLI run or a worker's claim).

    ``cost_model``: a mode of :func:`tuner.engine.cost_models.choose_cost_model` or its result.

    ``prepared`` must be the job's model prepared for the job's target. On success the job ends
    ``succeeded`` with a verified artifact; on failure ``failed`` with the error; on
    ``KeyboardInterrupt`` it goes back to ``queued`` so that it can be resumed.
    """
    target_row = storage.get_target_by_id(job.target_id)
    if target_row is None or target_row.key != prepared.target.key:
        raise ValueError(f"job {job.id} is for another target than the prepared model")
    try:
        if workload_ids is None:  # registered by the caller otherwise
            workload_ids = register_prepared(storage, prepared, job.model_id)
        return _run_job(
            storage,
            prepared,
            job,
            resumed,
            target_row,
            workload_ids,
            output_dir=output_dir,
            continue_tuning=continue_tuning,
            measure=measure or MeasureConfig.for_target(prepared.target.kind),
            search=search,
            listeners=listeners,
            force=force,
            seed=seed,
            cost_model=resolve_cost_model(storage, prepared.target, cost_model),
        )
    except KeyboardInterrupt:
        storage.transition_job(job.id, JobStatus.QUEUED, expected=JobStatus.RUNNING)
        raise
    except BaseException as err:
        storage.transition_job(job.id, JobStatus.FAILED, error=f"{type(err).__name__}: {err}")
        raise


def _run_job(
    storage,
    prepared,
    job,
    resumed,
    target_row,
    workload_ids,
    *,
    output_dir,
    continue_tuning,
    measure,
    search,
    listeners,
    force,
    seed,
    cost_model: CostModelChoice,
) -> TuneSummary:
    tasks = prepared.partition.tasks
    remeasure = RemeasureConfig.from_env()  # a bad setting fails now, not after the search
    compare = CompareConfig.from_env()
    measured_before = storage.count_records(job_id=job.id)
    remaining = max(0, job.trial_budget - measured_before)
    tuned_keys = storage.tuned_workload_keys(
        target_row.id, list(workload_ids), exclude_job_id=job.id
    )
    plan = plan_tuning(tasks, remaining, tuned_keys=tuned_keys, continue_tuning=continue_tuning)
    task_ids = _ensure_job_tasks(storage, job, plan, workload_ids, target_row.id)
    known = {
        t.key: best
        for t in tasks
        if (best := _best_secs(storage, workload_ids[t.key], target_row.id)) is not None
    }
    state = RunState(tasks, known)
    database = MetaScheduleDatabase(storage, target_row, job_id=job.id, worker=job.owner)
    to_tune = plan.to_tune
    seeds = None
    report = SearchReport()
    times: list[SearchTime] = []
    if to_tune and remaining > 0:
        index = {t.key: i for i, t in enumerate(tasks)}
        extracted = [prepared.partition.extracted[index[t.key]] for t in to_tune]
        callback = ProgressCallback(
            state, [t.key for t in to_tune], [JobRowWriter(storage, job.id, task_ids), *listeners]
        )
        seeds = _sibling_seeds(database, to_tune, workload_ids, search)
        reset_metaschedule_logging()
        with tempfile.TemporaryDirectory(prefix="tunehub-tune-") as work_dir:
            report = run_search(
                extracted,
                database=database,
                target_kind=prepared.target.kind,
                trials=remaining,
                batch_size=plan.batch_size,
                work_dir=work_dir,
                measure=measure,
                search=search,
                callbacks=[RecordErrorsCallback(database), callback],
                cost_model=cost_model.model,
                seed=seed,
                seeds=seeds,
                on_time=times.append,
            )
    report = report.with_cost_model(cost_model.kind)
    if to_tune and remaining > 0:
        report = record_search(storage, job.id, report)
    statuses = {t.id: t.status for t in storage.list_job_tasks(job.id)}
    for key in (t.key for t in to_tune):
        best = _best_secs(storage, workload_ids[key], target_row.id)
        storage.update_job_task_progress(task_ids[key], best_mean_secs=best)
        if statuses[task_ids[key]] == JobStatus.RUNNING:
            storage.transition_job_task(
                task_ids[key], JobStatus.SUCCEEDED, expected=JobStatus.RUNNING
            )

    outcomes = tuple(
        TaskOutcome(
            key=d.task.key,
            name=d.task.name,
            action=d.action,
            reason=d.reason,
            weight=d.task.weight,
            flops=d.task.flops,
            trials=storage.count_records(job_id=job.id, workload_id=workload_ids[d.task.key]),
            best_secs=_best_secs(storage, workload_ids[d.task.key], target_row.id),
        )
        for d in plan.decisions
    )
    winners = choose_winners(
        prepared, top_records(prepared, database, max(1, remeasure.top)), remeasure, measure
    )
    outcomes = tuple(winners.outcomes(outcomes))
    estimated = estimated_secs(outcomes)
    measured_total = storage.count_records(job_id=job.id)
    out_dir = output_dir or default_artifact_dir(job.id)
    manifest, timing = publish_tuned(
        prepared,
        winners.database,
        out_dir,
        job_id=job.id,
        trials_measured=measured_total,
        outcomes=outcomes,
        force=force,
        remeasured=winners.to_json(),
        peers=winners.peers,
        compare=compare,
    )
    store_remeasurements(
        storage,
        manifest["remeasured"],
        target_id=target_row.id,
        job_id=job.id,
        workload_ids=workload_ids,
        worker=job.owner,
    )
    library = out_dir / LIBRARY_NAME
    storage.add_artifact(
        job_id=job.id,
        path=str(out_dir),
        sha256=hashlib.sha256(library.read_bytes()).hexdigest(),
        size=library.stat().st_size,
        manifest_json=json.dumps(manifest),
        verified=True,
    )
    storage.transition_job(job.id, JobStatus.SUCCEEDED, expected=JobStatus.RUNNING)
    return TuneSummary(
        job_id=job.id,
        resumed=resumed,
        trial_budget=job.trial_budget,
        trials_measured=measured_total,
        trials_this_run=measured_total - measured_before,
        tasks=outcomes,
        estimated_secs=estimated,
        measured=timing,
        verification=manifest["verification"],
        artifact_dir=str(out_dir),
        extra={
            **({"buckets": buckets_json(prepared.model)} if prepared.model.buckets else {}),
            "cost_model": cost_model.summary(),
            "sibling_seeds": seeds.summary() if seeds is not None else None,
            "search": report.to_json(),
            "search_time": (
                dataclasses.replace(times[0], trials=measured_total - measured_before).to_json()
                if times
                else None
            ),
            "final_choice": final_choice_summary(manifest),
        },
    )
