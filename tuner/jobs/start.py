"""Starting jobs and keeping what their runs did: the part of the coordinator every job needs.

Every job starts through :func:`plan_job`, whichever way it runs: a lease worker's request for
work (:func:`tuner.jobs.coordinator.lease_work`) and ``tunehub tune``
(:func:`tuner.jobs.job.tune_model`) plan alike, so their job rows are the same; each run of a job
adds its
:class:`tuner.engine.reports.SearchReport` to the job's (:func:`record_search`). Nothing here needs
the web stack (the GPU machine runs ``tunehub tune`` without it).
"""

from __future__ import annotations

import json
import logging

from db import InvalidTransitionError, Job, JobStatus, NewJobTask, TuningStorage
from tuner.engine.reports import SearchReport

logger = logging.getLogger("tunehub.coordinator")


def plan_job(storage: TuningStorage, job: Job, *, continue_tuning: bool = False) -> Job | None:
    """Plan a queued job from its model's stored task list and start it (``running``, tasks
    created with their trial allotments). ``None`` when another process started it first, or
    when the job cannot run (then it is failed with the reason).

    Every job starts here, whichever way it runs: a lease worker's request for work and
    ``tunehub tune`` (:func:`tuner.jobs.job.tune_model`, which may pass ``continue_tuning``: tune
    tasks other jobs already tuned, too) plan alike, so their job rows are the same."""
    from compiler.partition import TaskInfo  # noqa: PLC0415 - TVM only where planning happens
    from tuner.jobs.plan import allot_trials, plan_tuning  # noqa: PLC0415

    if job.model_id is None:
        _fail_queued(storage, job, "the job's model was deleted")
        return None
    entries = storage.model_workloads(job.model_id)
    if not entries:
        _fail_queued(storage, job, "the job's model has no tuning tasks recorded")
        return None
    tasks: list[TaskInfo] = []
    ids: dict[str, int] = {}
    for entry in entries:
        workload = storage.get_workload_by_id(entry.workload_id)
        if workload is None or workload.key in ids:
            continue
        ids[workload.key] = workload.id
        tasks.append(
            TaskInfo(
                key=workload.key,
                name=entry.task_name,
                flops=float(workload.flops or 0.0),
                weight=entry.weight,
                shapes=(),
                tunable=entry.skip_reason is None,
                skip_reason=entry.skip_reason or "",
            )
        )
    remaining = max(0, job.trial_budget - storage.count_records(job_id=job.id))
    tuned = storage.tuned_workload_keys(job.target_id, list(ids), exclude_job_id=job.id)
    plan = plan_tuning(tasks, remaining, tuned_keys=tuned, continue_tuning=continue_tuning)
    allot = allot_trials(plan)
    new: list[NewJobTask] = []
    for decision in plan.decisions:
        task = decision.task
        if decision.action == "tune":
            new.append(
                NewJobTask(ids[task.key], task.name, task.weight, task.flops, allot[task.key])
            )
        elif decision.action == "reuse":
            best = storage.best_record(ids[task.key], job.target_id)
            new.append(
                NewJobTask(
                    ids[task.key],
                    task.name,
                    task.weight,
                    task.flops,
                    0,
                    status=JobStatus.SUCCEEDED,
                    best_mean_secs=None if best is None else best.mean_secs,
                )
            )
    started = storage.start_job(job.id, new)
    if started is not None:
        logger.info(
            "job %s started: %d tasks to tune (%s trials), %d reused",
            job.id,
            len(plan.to_tune),
            remaining,
            len(plan.by_action("reuse")),
        )
    return started


def _fail_queued(storage: TuningStorage, job: Job, reason: str) -> None:
    try:
        storage.transition_job(job.id, JobStatus.FAILED, expected=JobStatus.QUEUED, error=reason)
    except InvalidTransitionError:
        pass


def record_search(storage: TuningStorage, job_id: int, report: SearchReport) -> SearchReport:
    """Add one run's (a lease's, or a ``tunehub tune`` run's) search report to its job's;
    return the job's sum. A stored report that does not parse is replaced."""
    total: dict[str, SearchReport] = {}

    def merge(current: str | None) -> str:
        total["sum"] = (SearchReport.from_json_text(current) or SearchReport()) + report
        return json.dumps(total["sum"].to_json())

    storage.merge_job_search(job_id, merge)
    return total["sum"]


def job_search(job: Job) -> SearchReport | None:
    """The job's summed search report, or ``None`` before any run reported one."""
    return SearchReport.from_json_text(job.search_json)
