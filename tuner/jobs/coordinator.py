"""The coordinator: turns jobs into leases for workers, and takes their results back.

Server-side logic of distributed tuning, shared by the REST routes (``/api/v1/workers/...``) and
by workers that reach the database directly (:class:`service.worker_client.DirectClient`). It
reads and writes only through :class:`db.TuningStorage`; it never runs TVM.

Life of a job (see the lease contract in :mod:`db.base`):

1. **Plan.** A worker asking for work finds a queued job for its target: the job is planned from
   the model's task list stored at upload (:func:`plan_job`: :func:`tuner.jobs.plan.plan_tuning`
   with what this target already has tuned, then :func:`tuner.jobs.plan.allot_trials`) and started,
   tasks and all, in one transaction. Only one planner wins the job.
2. **Tune leases.** A tune lease covers up to ``tasks_per_lease`` queued tasks of one job, each
   task leased to one worker at a time, for at most ``batches_per_lease`` batches of each task's
   remaining trials; one search on the worker spreads the lease's trials over its tasks with
   MetaSchedule's gradient task scheduler, as ``tunehub tune`` does over a whole job. The worker
   seeds each task's search with the records the server has for it (:func:`lease_context`),
   measures, and uploads each task's batches (:func:`accept_batch`): records are stored
   (keep-the-better, so a retried upload changes nothing) and counted once per batch number.
   Ending the lease (:func:`end_lease`) queues what is left of each task, or finishes it.
3. **Finalize.** When no task of a running job is queued or running, one worker of the target
   takes the job's finalize lease: it compiles the model with the best records, verifies it
   against the reference framework and uploads the artifact (:func:`accept_artifact`), which
   completes the job.

**Preview.** While a job still has tasks to tune, one worker takes its preview lease first (one
at a time; one that failed, was lost or returned is tried again, :data:`PREVIEW_ATTEMPTS` leases
in all): it builds the zero-trial library (library peers and TVM's default schedules, no
records), verifies it and uploads it like a finalize artifact; :func:`accept_artifact`
publishes it as the job's ``preview`` and leaves the job running. A user has a verified library
in seconds, the tuned one when the job ends.

Leases live while their worker heartbeats (:func:`heartbeat`); every request for work first
expires silent workers' leases (:meth:`db.TuningStorage.reap_expired_leases`), so their work goes
back to the queue with the batches already uploaded kept.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from compiler.build.artifact_layout import LIBRARY_NAME, MANIFEST_NAME
from db import (
    ConflictError,
    InvalidTransitionError,
    Job,
    JobStatus,
    LeaseHeldError,
    LeaseStatus,
    NotFoundError,
    TargetRecord,
    TaskLease,
    TuningStorage,
    Worker,
)
from tuner.final_build.remeasure_store import store_remeasurements
from tuner.jobs.protocol import (
    BatchAck,
    JobTaskInfo,
    LeaseContext,
    LeasedTask,
    LeaseEnd,
    RecordUpload,
    SearchReport,
    TargetInfo,
    WorkOffer,
)
from tuner.jobs.record_checks import check_records
from tuner.jobs.start import plan_job, record_search

logger = logging.getLogger("tunehub.coordinator")


#: Preview leases a job gets at most, whatever became of them (failed, expired, returned).
PREVIEW_ATTEMPTS = 2


@dataclass(frozen=True)
class LeasePolicy:
    """How long leases live and how much work one lease covers (from the service settings)."""

    lease_secs: float = 60.0
    batches_per_lease: int = 4
    max_attempts: int = 3
    #: Tasks of one job a tune lease covers at most (its search spreads the trials over them).
    tasks_per_lease: int = 1
    #: Whether this worker builds jobs' previews (zero-trial artifacts while they tune).
    previews: bool = True


def target_info(row: TargetRecord) -> TargetInfo:
    return TargetInfo.of(row)


def find_worker(storage: TuningStorage, name: str) -> Worker:
    """The registered worker ``name``. Raises :class:`db.NotFoundError` when it is unknown."""
    row = next((w for w in storage.list_workers() if w.name == name), None)
    if row is None:
        raise NotFoundError(f"worker {name} is not registered (register it first)")
    return row


class Forbidden(Exception):
    """A worker token reached for a worker name or a lease that is not its own (HTTP 403)."""


class TooManyWorkers(Exception):
    """A worker token registering a new name already holds as many as it may (HTTP 409)."""


def register(
    storage: TuningStorage,
    name: str,
    target: TargetInfo | None,
    fingerprint_json: str,
    *,
    token_id: int | None = None,
    max_names: int | None = None,
) -> Worker:
    """Register ``name`` for ``target`` (created if new) and expire what an earlier process of the
    same name still held: it is gone, and its work goes back to the queue.

    Each registration gets a new ``instance``: the process that registered last holds the name,
    and an earlier one's heartbeats and lease requests are refused (:func:`check_instance`), so
    two processes never share a name. ``token_id``: the worker token registering over HTTP. A
    name belongs to the token that registered it first: another token (while that one is not
    revoked) or a name of an in-process worker is :class:`Forbidden`. ``max_names``: how many
    names one token may hold; a new name past it is :class:`TooManyWorkers` (nothing stored;
    requests racing each other may pass it by at most their number less one)."""
    if token_id is not None:
        current = next((w for w in storage.list_workers() if w.name == name), None)
        if current is not None and current.token_id != token_id:
            live = {t.id for t in storage.list_api_tokens() if not t.revoked}
            if current.token_id is None or current.token_id in live:
                raise Forbidden(f"worker name {name} belongs to another worker token")
        new_name = current is None or current.token_id != token_id
        if (
            new_name
            and max_names is not None
            and storage.count_workers(token_id=token_id) >= max_names
        ):
            raise TooManyWorkers(
                f"this worker token already registered {max_names} worker names, the limit "
                "(TUNEHUB_MAX_WORKERS_PER_TOKEN): register again under one of them"
            )
    target_id = None
    if target is not None:
        target_id = storage.ensure_target(target.spec()).id
    row = storage.register_worker(
        name, fingerprint_json=fingerprint_json, target_id=target_id, token_id=token_id
    )
    released = storage.release_worker_leases(name)
    if released:
        logger.info("leases %s of an earlier run of worker %s were released", released, name)
    return row


def check_instance(worker: Worker, instance: str | None) -> None:
    """Refuse (:class:`db.ConflictError`) a call of a process whose registration was replaced:
    another process registered the same name since. ``None``: the caller does not say."""
    if instance is not None and worker.instance != instance:
        raise ConflictError(
            f"worker {worker.name} was registered again by another process: "
            "this one no longer holds the name"
        )


def owned_worker(storage: TuningStorage, name: str, token_id: int | None) -> Worker:
    """The registered worker ``name``, if the worker token ``token_id`` registered it (``None``:
    an in-process caller, which may act for any worker). Raises :class:`db.NotFoundError` or
    :class:`Forbidden`."""
    row = find_worker(storage, name)
    if token_id is not None and row.token_id != token_id:
        raise Forbidden(f"worker {name} is not registered with this token")
    return row


def owned_lease(storage: TuningStorage, lease_id: int, token_id: int | None) -> TaskLease:
    """Lease ``lease_id``, if its worker belongs to the worker token ``token_id`` (``None``: an
    in-process caller). Raises :class:`db.NotFoundError` or :class:`Forbidden`."""
    lease = storage.get_lease(lease_id)
    if lease is None:
        raise NotFoundError(f"task lease {lease_id} does not exist")
    if token_id is not None:
        worker = next((w for w in storage.list_workers() if w.name == lease.worker), None)
        if worker is None or worker.token_id != token_id:
            raise Forbidden(f"task lease {lease_id} is held by another worker")
    return lease


#: Lease kinds whose worker builds the whole model (and downloads it for that).
BUILD_KINDS = ("finalize", "preview")


def finalizing_job(storage: TuningStorage, job_id: int, token_id: int | None) -> TaskLease:
    """An active finalize or preview lease of ``job_id`` held by a worker of ``token_id`` (what
    a model download needs). Raises :class:`Forbidden` when there is none."""
    for lease in storage.list_leases(job_id=job_id, status=LeaseStatus.ACTIVE, limit=1000):
        if lease.kind in BUILD_KINDS:
            try:
                return owned_lease(storage, lease.id, token_id)
            except Forbidden:
                continue
    raise Forbidden(f"no active finalize or preview lease of job {job_id} is held by this worker")


def heartbeat(
    storage: TuningStorage,
    name: str,
    policy: LeasePolicy,
    *,
    status: str | None = None,
    instance: str | None = None,
) -> tuple[Worker, list[TaskLease]]:
    """Stamp the worker's heartbeat and renew its active leases; return them (a lease missing
    from the list was lost: expired, or ended by someone else). A heartbeat of a replaced
    registration (``instance``) is refused and renews nothing: a lease lives only while the
    process holding it heartbeats, whatever other processes of that name do."""
    row = find_worker(storage, name)
    check_instance(row, instance)
    row = storage.heartbeat(row.id, status=status)
    return row, storage.renew_leases(name, lease_secs=policy.lease_secs)


# -- leasing -----------------------------------------------------------------------------------
def lease_work(
    storage: TuningStorage,
    name: str,
    policy: LeasePolicy,
    *,
    instance: str | None = None,
    job_id: int | None = None,
) -> tuple[WorkOffer | None, int]:
    """The next piece of work for worker ``name`` (on its registered target), and how many jobs
    of that target are still open (queued or running; 0 means a ``--once`` worker may stop).

    Order: expire silent workers' leases; finalize a job whose tasks are all done; build the
    preview of a running job that has none; lease a queued task of a running job (priority,
    age, heaviest task); else start the next queued job and lease its preview or first task.

    ``job_id``: work of that running job only (a ``tunehub tune`` run's worker); a job pinned
    to a worker (``Job.worker``) is never offered to another.

    A worker holds one lease at a time: while it holds an active one, that lease is offered
    again (idempotent, so a worker whose answer was lost goes on with its lease rather than
    leaking it), also to requests racing each other (the storage's unique index settles who
    claims; the others get the winner's lease).
    """
    worker = find_worker(storage, name)
    check_instance(worker, instance)
    if worker.target_id is None:
        raise ConflictError(f"worker {name} registered without a target: it cannot take work")
    target = storage.get_target_by_id(worker.target_id)
    assert target is not None  # foreign key
    served = served_targets(storage, target)
    reaped = storage.reap_expired_leases(max_attempts=policy.max_attempts)
    if reaped:
        logger.warning("expired leases %s (their workers stopped heartbeating)", reaped)
    storage.heartbeat(worker.id)
    lease = _held_lease(storage, name)
    try:
        tasks = tasks_for(storage, served, policy) if lease is None else 1
        for target_id in served if lease is None else ():
            lease = _claim(storage, name, target_id, policy, tasks, job_id=job_id)
            if lease is not None:
                break
        queued = _queued_jobs(storage, served, name) if lease is None and job_id is None else []
        for job in queued:
            if plan_job(storage, job) is not None:
                tasks = tasks_for(storage, served, policy)
                lease = _claim(storage, name, job.target_id, policy, tasks)
                if lease is not None:
                    break
    except LeaseHeldError:  # a concurrent request of this worker claimed first
        lease = _held_lease(storage, name)
    pending = sum(storage.count_open_jobs(target_id=t) for t in served)
    if lease is None:
        return None, pending
    job = storage.get_job(lease.job_id)
    job_target = target if job is None else storage.get_target_by_id(job.target_id)
    return offer_for(storage, lease, job_target or target, policy), pending


def served_targets(storage: TuningStorage, target: TargetRecord) -> list[int]:
    """The ids of the targets a worker registered on ``target`` works for: its own first, then
    the stored targets that differ from it only by their weight format
    (:meth:`compiler.target.TargetSpec.with_weights`: the same machine, so the same worker
    measures and builds them; the offer names the job's target, which the worker prepares the
    model for)."""
    spec = target.spec()
    weights = spec.compile_options.weights
    variants = [
        row.id
        for row in storage.list_targets()
        if row.id != target.id
        and row.kind == spec.kind
        and row.spec().with_weights(weights).key == target.key
    ]
    return [target.id, *variants]


def _held_lease(storage: TuningStorage, name: str) -> TaskLease | None:
    """Worker ``name``'s active lease (it holds at most one), or ``None``."""
    held = storage.list_leases(worker=name, status=LeaseStatus.ACTIVE, limit=1)
    return held[0] if held else None


def tasks_for(storage: TuningStorage, served: list[int], policy: LeasePolicy) -> int:
    """How many tasks the next tune lease for a worker serving ``served`` covers: at most
    ``policy.tasks_per_lease``, and no more than an even share of the queued tasks among the
    idle live workers of those targets (registered, not offline, heard from within two lease
    lifetimes, holding no lease; the asking worker is one of them), so that a lease spreads its
    trials over several tasks without leaving the other workers idle."""
    if policy.tasks_per_lease <= 1:
        return 1
    recent = datetime.now(UTC) - timedelta(seconds=2 * policy.lease_secs)
    busy = {lease.worker for lease in storage.list_leases(status=LeaseStatus.ACTIVE, limit=10_000)}
    idle = sum(
        1
        for w in storage.list_workers()
        if w.target_id in served
        and w.status != "offline"
        and w.name not in busy
        and w.last_heartbeat is not None
        and w.last_heartbeat >= recent
    )
    queued = storage.count_queued_tasks(target_ids=served)
    return max(1, min(policy.tasks_per_lease, math.ceil(queued / max(1, idle))))


def _claim(
    storage: TuningStorage,
    name: str,
    target_id: int,
    policy: LeasePolicy,
    max_tasks: int = 1,
    *,
    job_id: int | None = None,
):
    lease = storage.claim_finalize_lease(
        name, target_id=target_id, lease_secs=policy.lease_secs, job_id=job_id
    )
    if lease is None and policy.previews and job_id is None:
        lease = storage.claim_preview_lease(
            name, target_id=target_id, lease_secs=policy.lease_secs, max_attempts=PREVIEW_ATTEMPTS
        )
    if lease is None:
        lease = storage.claim_task_lease(
            name,
            target_id=target_id,
            lease_secs=policy.lease_secs,
            max_trials=lambda budget: lease_trials(budget, policy)[1],
            max_tasks=max_tasks,
            job_id=job_id,
        )
    return lease


def _queued_jobs(storage: TuningStorage, target_ids: list[int], worker: str) -> list[Job]:
    """Queued jobs of ``target_ids`` that ``worker`` may start (unpinned, or pinned to it)."""
    queued = [
        j
        for j in storage.list_jobs(status=JobStatus.QUEUED, limit=50)
        if j.target_id in target_ids and j.worker in (None, worker)
    ]
    return sorted(queued, key=lambda j: (-j.priority, j.id))


def lease_trials(task_budget: int, policy: LeasePolicy) -> tuple[int, int]:
    """``(batch_size, max trials of one lease)`` for a task with ``task_budget`` trials."""
    from tuner.jobs.plan import task_batch_size  # noqa: PLC0415

    batch = task_batch_size(task_budget)
    return batch, batch * policy.batches_per_lease


def offer_for(
    storage: TuningStorage, lease: TaskLease, target: TargetRecord, policy: LeasePolicy
) -> WorkOffer:
    """The :class:`WorkOffer` describing ``lease`` to its worker."""
    job = storage.get_job(lease.job_id)
    assert job is not None  # foreign key
    common = dict(
        lease_id=lease.id,
        kind=lease.kind,
        job_id=job.id,
        target=target_info(target),
        expires_at=None if lease.expires_at is None else lease.expires_at.isoformat(),
        job_trial_budget=job.trial_budget,
        job_trials_done=job.trials_done,
    )
    if lease.kind == "tune":
        rows = {t.id: t for t in storage.list_job_tasks(job.id)}
        leased = []
        for task_id in lease.task_ids:
            workload = storage.get_workload_by_id(rows[task_id].workload_id)
            assert workload is not None  # foreign key
            leased.append(
                LeasedTask(
                    task_id=task_id,
                    workload_id=workload.id,
                    workload_key=workload.key,
                    workload_name=rows[task_id].name,
                    mod_json=workload.mod_json,
                )
            )
        first = leased[0]
        if len(leased) == 1:
            batch, _ = lease_trials(rows[first.task_id].trial_budget, policy)
        else:  # the gradient scheduler's first round: a batch of each task, half the trials
            from tuner.jobs.plan import choose_batch_size  # noqa: PLC0415

            batch = choose_batch_size(len(leased), lease.trials)
        return WorkOffer(
            **common,
            trials=lease.trials,
            batch_size=min(batch, lease.trials),
            task_id=first.task_id,
            workload_id=first.workload_id,
            workload_key=first.workload_key,
            workload_name=first.workload_name,
            mod_json=first.mod_json,
            leased_tasks=tuple(leased),
        )
    model = storage.get_model(job.model_id) if job.model_id is not None else None
    return WorkOffer(
        **common,
        model_id=None if model is None else model.id,
        model_sha256=None if model is None else model.content_hash,
        model_format=None if model is None else model.format,
        model_filename=None if model is None else model.filename,
        model_buckets=None if model is None else model.buckets_json,
        tasks=job_task_infos(storage, job.id),
    )


def job_task_infos(storage: TuningStorage, job_id: int) -> tuple[JobTaskInfo, ...]:
    """The tasks of job ``job_id`` as a finalize step reports them (its artifact's manifest)."""
    rows = storage.list_job_tasks(job_id)
    keys = {w.id: w.key for w in _workloads(storage, [t.workload_id for t in rows])}
    return tuple(
        JobTaskInfo(
            workload_key=keys.get(t.workload_id, ""),
            name=t.name,
            weight=t.weight,
            flops=t.flops,
            status=t.status,
            trials_done=t.trials_done,
            best_mean_secs=t.best_mean_secs,
        )
        for t in rows
    )


def _workloads(storage: TuningStorage, ids: list[int]):
    return [w for w in (storage.get_workload_by_id(i) for i in ids) if w is not None]


# -- results -----------------------------------------------------------------------------------
def seed_records(
    storage: TuningStorage, workload_key: str, target: TargetRecord, k: int
) -> list[list]:
    """The ``k`` best valid records of a workload on a target, as ``TuningRecord.as_json()``
    lists (``[trace, run_secs, target, args_info]``), best first: what a worker's local search
    starts from. Unknown workloads have none."""
    ids = storage.workload_ids([workload_key])
    if workload_key not in ids:
        return []
    target_obj = json.loads(target.target_json)
    return [
        [json.loads(r.trace_json), list(r.run_secs or ()), target_obj, json.loads(r.args_info_json)]
        for r in storage.top_k(ids[workload_key], target.id, k)
    ]


#: Sibling schedules a lease context carries at most (fastest first).
LEASE_SIBLINGS = 8
#: Schedule keys of a workload a lease context carries at most (the most recent records).
LEASE_STORED_KEYS = 20_000


def lease_context(
    storage: TuningStorage,
    lease_id: int,
    k: int,
    *,
    task_id: int | None = None,
    token_id: int | None = None,
) -> LeaseContext:
    """What the search of task ``task_id`` (default: the first) of tune lease ``lease_id``
    starts from (see :class:`tuner.jobs.protocol.LeaseContext`): the workload's ``k`` best records
    on the lease's target, the keys of the schedules stored for it, and its faster siblings' best
    schedules (:func:`tuner.engine.siblings.faster_siblings`, the query ``tunehub tune`` runs too).
    Raises :class:`db.NotFoundError` (no lease) and :class:`db.ConflictError` (a finalize
    lease, or a task the lease does not cover)."""
    from compiler.task_family import workload_family  # noqa: PLC0415
    from tuner.engine.siblings import family_members, faster_siblings, own_rate  # noqa: PLC0415

    lease = owned_lease(storage, lease_id, token_id)
    if lease.kind != "tune" or lease.task_id is None:
        raise ConflictError(f"lease {lease_id} is a {lease.kind} lease: it has no search context")
    task_id = leased_task(lease, task_id)
    job = storage.get_job(lease.job_id)
    task = next((t for t in storage.list_job_tasks(lease.job_id) if t.id == task_id), None)
    workload = None if task is None else storage.get_workload_by_id(task.workload_id)
    if job is None or task is None or workload is None:  # pragma: no cover - foreign keys
        raise NotFoundError(f"the job of lease {lease_id} is gone")
    target = storage.get_target_by_id(job.target_id)
    assert target is not None  # foreign key
    members = family_members(storage)[workload_family(task.name)]
    siblings = faster_siblings(
        storage,
        target.id,
        workload_id=workload.id,
        members=members,
        above_rate=own_rate(storage, target.id, workload.id, workload.flops),
        limit=LEASE_SIBLINGS,
    )
    return LeaseContext(
        workload_id=workload.id,
        flops=workload.flops,
        seeds=tuple(seed_records(storage, workload.key, target, k)),
        stored_keys=tuple(_schedule_keys(storage, workload.id, target.id)[-LEASE_STORED_KEYS:]),
        siblings=tuple(siblings),
    )


def leased_task(lease: TaskLease, task_id: int | None) -> int:
    """``task_id`` if tune lease ``lease`` covers it, its first task for ``None``. Raises
    :class:`db.ConflictError` for a task the lease does not cover."""
    if task_id is None:
        return lease.task_id
    if task_id not in lease.task_ids:
        raise ConflictError(f"task {task_id} is not a task of lease {lease.id}")
    return task_id


def _schedule_keys(storage: TuningStorage, workload_id: int, target_id: int) -> list[str]:
    """The schedule keys (trace hashes) of every record of a workload on a target, oldest first."""
    return [
        r.trace_hash for r in storage.iter_records(target_id=target_id, workload_id=workload_id)
    ]


def accept_batch(
    storage: TuningStorage,
    lease_id: int,
    batch: int,
    records: list[RecordUpload],
    policy: LeasePolicy,
    *,
    task_id: int | None = None,
    token_id: int | None = None,
) -> BatchAck:
    """Check, store and count one uploaded batch of task ``task_id`` (default: the first) of a
    tune lease (once per batch number).

    The whole batch is checked first (:func:`tuner.jobs.record_checks.check_records`); a refused
    record refuses it all (:class:`tuner.jobs.record_checks.RecordRefused`, nothing stored). The
    records are stored whatever the lease's state (a late upload from an expired lease is still
    evidence; duplicates keep the better measurement), attributed to the lease's worker (the caller:
    ``token_id`` must own it) and job; they count only while the lease is active and its job
    running, and no more trials than the lease was allotted (``lease.trials``; a batch past it
    counts what is left). Raises :class:`db.NotFoundError` (no lease), :class:`Forbidden` (another
    worker's lease), :class:`db.ConflictError` (a finalize lease, a batch number ahead of the next
    expected, a task the lease does not cover, or a new batch of a lease whose allotted trials
    are all counted: checked before anything is stored, so a refused batch stores nothing).
    """
    lease = owned_lease(storage, lease_id, token_id)
    if lease.kind != "tune" or lease.task_id is None:
        raise ConflictError(f"lease {lease_id} is a {lease.kind} lease: it takes no records")
    task_id = leased_task(lease, task_id)
    job = storage.get_job(lease.job_id)
    task = next((t for t in storage.list_job_tasks(lease.job_id) if t.id == task_id), None)
    if job is None or task is None:  # pragma: no cover - foreign keys
        raise NotFoundError(f"the job of lease {lease_id} is gone")
    if (
        lease.status == LeaseStatus.ACTIVE
        and job.status == JobStatus.RUNNING
        and batch > lease.batches_done
    ):  # refused before anything is stored
        raise ConflictError(
            f"batch {batch} of lease {lease_id} arrived before batch "
            f"{lease.batches_done}: upload batches in order"
        )
    if (
        lease.status == LeaseStatus.ACTIVE
        and job.status == JobStatus.RUNNING
        and batch == lease.batches_done
        and lease.trials_done >= lease.trials
    ):  # a search measures at most its lease's trials: more is not this lease's work
        raise ConflictError(
            f"lease {lease_id} has counted all {lease.trials} trials it was allotted: "
            "end it and ask for another lease"
        )
    workload = storage.get_workload_by_id(task.workload_id)
    target = storage.get_target_by_id(job.target_id)
    assert workload is not None and target is not None  # foreign keys
    new = check_records(
        storage, workload, target, records, worker=lease.worker, job_id=lease.job_id
    )
    storage.commit_records(new)
    valid = [r.mean_secs for r in new if r.mean_secs is not None and not r.quarantined]
    result = storage.record_lease_batch(
        lease_id,
        batch=batch,
        trials=len(new),
        best_mean_secs=min(valid) if valid else None,
        lease_secs=policy.lease_secs,
        task_id=task_id,
    )
    keep_going = (
        result.lease.status == LeaseStatus.ACTIVE and result.job_status == JobStatus.RUNNING
    )
    return BatchAck(
        accepted=len(new),
        counted=result.counted,
        keep_going=keep_going,
        lease_status=result.lease.status,
        job_status=result.job_status,
        trials_done=result.lease.trials_done,
    )


def end_lease(
    storage: TuningStorage,
    lease_id: int,
    outcome: str,
    policy: LeasePolicy,
    *,
    error: str | None = None,
    search: SearchReport | None = None,
    token_id: int | None = None,
) -> LeaseEnd:
    """End the worker's lease with ``outcome`` (``done``, ``returned``, ``failed``,
    ``cancelled``; see :meth:`db.TuningStorage.finish_lease`), keeping what its search did
    (``search``). Raises :class:`db.InvalidTransitionError` when the lease is no longer active."""
    owned_lease(storage, lease_id, token_id)
    lease = storage.finish_lease(lease_id, outcome, error=error, max_attempts=policy.max_attempts)
    if search is not None:
        record_search(storage, lease.job_id, search)
    job = storage.get_job(lease.job_id)
    return LeaseEnd(
        lease_status=lease.status, job_status=job.status if job is not None else JobStatus.FAILED
    )


def _store_remeasurements(storage: TuningStorage, lease: TaskLease, entries: Any) -> None:
    """The re-measurements a finalize lease's manifest reports, stored beside their records
    (checked entry by entry: :func:`tuner.final_build.remeasure_store.store_remeasurements`)."""
    if not entries:
        return
    job = storage.get_job(lease.job_id)
    workload_ids = {}
    for task in storage.list_job_tasks(lease.job_id):
        workload = storage.get_workload_by_id(task.workload_id)
        if workload is not None:
            workload_ids[workload.key] = workload.id
    store_remeasurements(
        storage,
        entries,
        target_id=job.target_id,
        job_id=job.id,
        workload_ids=workload_ids,
        worker=lease.worker,
    )


def accept_artifact(
    storage: TuningStorage,
    lease_id: int,
    staged: Path,
    destination: Path,
    *,
    token_id: int | None = None,
    review=None,
) -> Path:
    """Publish a finalize lease's verified artifact and complete its job, or a preview lease's
    as the job's preview (the job goes on).

    ``staged`` holds ``model.so`` and ``manifest.json`` (written by the worker, verified against
    the reference framework); it is moved to ``destination`` (on the same file system; a
    preview to ``destination``'s sibling ``<name>-preview``) and the job becomes ``succeeded``
    (a finalize lease). Refused (:class:`db.ConflictError`, nothing published) when the
    manifest does not say the verification passed, the library is missing or ``review``
    refuses it. ``review(lease, staged, manifest)`` is the server's review of a remote worker's
    artifact (what the REST route passes:
    :func:`tuner.final_build.artifact_review.review_artifact`): it may replace ``staged``'s library
    and manifest with the server's own build, raises ConflictError to refuse, and returns a
    :class:`tuner.final_build.artifact_review.Review`, recorded as the manifest's ``server_review``
    (who built the library, whether the server verified it). Without it (a worker of this
    installation, on the database) the worker's verified artifact is published as it is.
    ``token_id``: the worker token, which must own the lease (:class:`Forbidden`). Raises
    :class:`db.InvalidTransitionError` when the lease or the job is no longer active.
    """
    lease = owned_lease(storage, lease_id, token_id)
    if lease.kind not in BUILD_KINDS or lease.status != LeaseStatus.ACTIVE:
        raise InvalidTransitionError("task lease", lease_id, lease.status, "done")
    preview = lease.kind == "preview"
    if preview:
        destination = destination.with_name(f"{destination.name}-preview")
    library = staged / LIBRARY_NAME
    try:
        manifest = json.loads((staged / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConflictError(f"the artifact's manifest is missing or not JSON: {err}") from None
    if not isinstance(manifest, dict) or not (manifest.get("verification") or {}).get("passed"):
        raise ConflictError("the artifact's manifest does not record a passed verification")
    if not library.is_file():
        raise ConflictError(f"the artifact has no {LIBRARY_NAME}")
    verified = True
    if review is not None:  # the worker's word is not enough: see ``review`` above
        outcome = review(lease, staged, manifest)
        manifest = json.loads((staged / MANIFEST_NAME).read_text(encoding="utf-8"))
        manifest["server_review"] = outcome.to_json()
        verified = outcome.verified
        (staged / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    digest = hashlib.sha256(library.read_bytes()).hexdigest()
    size = library.stat().st_size
    destination = destination.absolute()
    destination.parent.mkdir(parents=True, exist_ok=True)
    if destination.exists():  # left by an earlier attempt that did not complete
        trash = Path(tempfile.mkdtemp(prefix=f".{destination.name}.old-", dir=destination.parent))
        destination.rename(trash / "old")
        shutil.rmtree(trash, ignore_errors=True)
    staged.rename(destination)
    try:
        (storage.complete_preview if preview else storage.complete_finalize)(
            lease_id,
            path=str(destination),
            sha256=digest,
            size=size,
            manifest_json=json.dumps(manifest),
            verified=verified,
        )
    except BaseException:
        shutil.rmtree(destination, ignore_errors=True)
        raise
    if preview:
        logger.info(
            "job %s: preview artifact %s from worker %s", lease.job_id, destination, lease.worker
        )
        return destination
    try:  # the artifact is published: its re-measurements are a record of how, never a gate
        _store_remeasurements(storage, lease, manifest.get("remeasured"))
    except Exception:  # noqa: BLE001
        logger.exception("job %s: the artifact's re-measurements were not stored", lease.job_id)
    logger.info(
        "job %s succeeded: artifact %s from worker %s", lease.job_id, destination, lease.worker
    )
    return destination
