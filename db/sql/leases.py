"""Task leases on SQL, granting side: job starts, tune and finalize leases, renewals, batches.

Claims are compare-and-sets (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, the write lock on SQLite);
a partial unique index keeps one active lease per piece of work, and another one active lease
per worker: a claim for a worker that holds one raises :class:`db.errors.LeaseHeldError`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import case, exc, func, not_, or_, select, update

from db.contracts.jobs import JobStorage
from db.errors import ConflictError, LeaseHeldError, NotFoundError
from db.models import ArtifactRow, JobRow, JobTaskRow, LeaseTaskRow, TaskLeaseRow
from db.sql.base import SQLBase, frozen
from db.sql.jobs import job_task_row
from db.types import Job, JobStatus, LeaseBatchResult, LeaseStatus, NewJobTask, TaskLease


def _unfinished_tasks() -> Any:
    """``EXISTS``: the job (``JobRow`` of the enclosing query) has a task queued or running."""
    return (
        select(JobTaskRow.id)
        .where(
            JobTaskRow.job_id == JobRow.id,
            JobTaskRow.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)),
        )
        .exists()
    )


def _open_to(worker: str) -> Any:
    """The job (``JobRow`` of the enclosing query) is unpinned or pinned to ``worker``."""
    return or_(JobRow.worker.is_(None), JobRow.worker == worker)


def _held_lease(session, worker: str) -> int | None:
    """The id of ``worker``'s active lease, or ``None`` (what this transaction sees)."""
    return session.scalar(
        select(TaskLeaseRow.id)
        .where(TaskLeaseRow.worker == worker, TaskLeaseRow.status == LeaseStatus.ACTIVE)
        .limit(1)
    )


def _refuse_if_held(session, worker: str) -> None:
    """Raise :class:`LeaseHeldError` when ``worker`` already holds an active lease."""
    held = _held_lease(session, worker)
    if held is not None:
        raise LeaseHeldError(worker, held)


class LeaseSQL(SQLBase, JobStorage):
    """The lease-granting part of :class:`JobStorage`."""

    def start_job(self, job_id: int, tasks: Sequence[NewJobTask]) -> Job | None:
        with self._session(write=True) as session:
            result = session.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.status == JobStatus.QUEUED)
                .values(
                    status=JobStatus.RUNNING,
                    started_at=func.coalesce(JobRow.started_at, func.now()),
                    updated_at=func.now(),
                )
                .execution_options(synchronize_session=False)
            )
            if result.rowcount != 1:
                return None
            existing = {
                t.workload_id: t
                for t in session.scalars(select(JobTaskRow).where(JobTaskRow.job_id == job_id))
            }
            # Tasks left by an earlier run of this job: unfinished ones are lease-able again.
            session.execute(
                update(JobTaskRow)
                .where(
                    JobTaskRow.job_id == job_id,
                    JobTaskRow.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)),
                )
                .values(
                    status=JobStatus.QUEUED,
                    leased_by=None,
                    lease_expires_at=None,
                    updated_at=func.now(),
                )
                .execution_options(synchronize_session=False)
            )
            session.add_all(job_task_row(job_id, t) for t in tasks if t.workload_id not in existing)
            session.flush()
            return frozen(Job, session.get(JobRow, job_id, populate_existing=True))

    def claim_task_lease(
        self,
        worker: str,
        *,
        target_id: int,
        lease_secs: float,
        max_trials: int | Callable[[int], int],
        max_tasks: int = 1,
        job_id: int | None = None,
    ) -> TaskLease | None:
        cap = max_trials if callable(max_trials) else (lambda _budget: max_trials)
        with self._session(write=True) as session:
            _refuse_if_held(session, worker)
            first = self._claim_queued_task(
                session, worker, lease_secs, target_id=target_id, job_id=job_id
            )
            if first is None:
                return None
            claimed = [first]
            while len(claimed) < max_tasks:
                more = self._claim_queued_task(
                    session, worker, lease_secs, target_id=None, job_id=first[3]
                )
                if more is None:
                    break
                claimed.append(more)
            job_left = first[4]  # what the job had left when its first task was claimed
            trials = sum(
                max(1, min(budget - done, int(cap(budget)))) for _, budget, done, _, _ in claimed
            )
            lease = TaskLeaseRow(
                job_id=first[3],
                task_id=first[0],
                kind="tune",
                work_key=f"task:{first[0]}",
                worker=worker,
                status=LeaseStatus.ACTIVE,
                trials=max(1, min(trials, job_left)),
                expires_at=self._db_now_plus(lease_secs),
                task_links=[
                    LeaseTaskRow(task_id=task_id, position=i)
                    for i, (task_id, *_rest) in enumerate(claimed)
                ],
            )
            try:
                # The tasks' compare-and-sets rule out another lease of them: a conflict here
                # is the worker's own lease, claimed meanwhile (PostgreSQL: this insert waited
                # for that claim to commit). Raising undoes the claims.
                with session.begin_nested():
                    session.add(lease)
                    session.flush()
            except exc.IntegrityError:
                raise LeaseHeldError(worker, _held_lease(session, worker)) from None
            session.refresh(lease)
            return frozen(TaskLease, lease)

    def _claim_queued_task(
        self,
        session,
        worker: str,
        lease_secs: float,
        *,
        target_id: int | None = None,
        job_id: int | None = None,
    ) -> tuple[int, int, int, int, int] | None:
        """Move the next queued task (of a running job of ``target_id`` not pinned to another
        worker, and of job ``job_id`` when given) with trials left to ``running``, leased by
        ``worker``: ``(task id, trial budget, trials done, job id, the job's trials left)``, or
        ``None``. Tasks found
        with nothing left, of their own or of their job's budget, are finished on the way
        (``succeeded``)."""
        scope = [_open_to(worker)]
        if target_id is not None:
            scope.append(JobRow.target_id == target_id)
        if job_id is not None:
            scope.append(JobRow.id == job_id)
        candidate = (
            select(
                JobTaskRow.id,
                JobTaskRow.trial_budget,
                JobTaskRow.trials_done,
                JobTaskRow.job_id,
                JobRow.trial_budget - JobRow.trials_done,
            )
            .join(JobRow, JobRow.id == JobTaskRow.job_id)
            .where(
                JobTaskRow.status == JobStatus.QUEUED, JobRow.status == JobStatus.RUNNING, *scope
            )
            .order_by(
                JobRow.priority.desc(),
                JobRow.id,
                (func.coalesce(JobTaskRow.flops, 0.0) * JobTaskRow.weight).desc(),
                JobTaskRow.id,
            )
            .limit(1)
            .with_for_update(skip_locked=True, of=JobTaskRow)  # PostgreSQL; SQLite: write lock
        )
        while True:
            row = session.execute(candidate).one_or_none()
            if row is None:
                return None
            task_id, budget, done, found_job, job_left = row
            spent = budget - done <= 0 or job_left <= 0  # nothing left to measure: finished
            values: dict[str, Any] = {"updated_at": func.now()}
            if spent:
                values["status"] = JobStatus.SUCCEEDED
            else:
                values.update(
                    status=JobStatus.RUNNING,
                    leased_by=worker,
                    lease_expires_at=self._db_now_plus(lease_secs),
                )
            claimed = session.execute(
                update(JobTaskRow)
                .where(JobTaskRow.id == task_id, JobTaskRow.status == JobStatus.QUEUED)
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            if claimed.rowcount == 1 and not spent:
                return task_id, budget, done, found_job, job_left

    def claim_finalize_lease(
        self, worker: str, *, target_id: int, lease_secs: float, job_id: int | None = None
    ) -> TaskLease | None:
        finalizing = (
            select(TaskLeaseRow.id)
            .where(
                TaskLeaseRow.job_id == JobRow.id,
                TaskLeaseRow.kind == "finalize",
                TaskLeaseRow.status == LeaseStatus.ACTIVE,
            )
            .exists()
        )
        only = () if job_id is None else (JobRow.id == job_id,)
        return self._claim_job_lease(
            "finalize",
            worker,
            target_id,
            lease_secs,
            not_(_unfinished_tasks()),
            not_(finalizing),
            *only,
        )

    def claim_preview_lease(
        self, worker: str, *, target_id: int, lease_secs: float, max_attempts: int = 2
    ) -> TaskLease | None:
        previewed = (
            select(ArtifactRow.id)
            .where(ArtifactRow.job_id == JobRow.id, ArtifactRow.kind == "preview")
            .exists()
        )
        previews = (
            select(func.count())
            .select_from(TaskLeaseRow)
            .where(TaskLeaseRow.job_id == JobRow.id, TaskLeaseRow.kind == "preview")
            .scalar_subquery()
        )
        return self._claim_job_lease(
            "preview",
            worker,
            target_id,
            lease_secs,
            _unfinished_tasks(),
            not_(previewed),
            previews < max_attempts,
        )

    def _claim_job_lease(
        self, kind: str, worker: str, target_id: int, lease_secs: float, *conditions: Any
    ) -> TaskLease | None:
        """A ``kind`` lease (``finalize``/``preview``: one per job, work key ``kind:<job id>``)
        of the first running job of ``target_id`` (priority, then age) that meets
        ``conditions``, for ``worker``; ``None`` when no job does. Raises
        :class:`LeaseHeldError` when ``worker`` holds an active lease."""
        candidates = (
            select(JobRow.id)
            .where(
                JobRow.status == JobStatus.RUNNING,
                JobRow.target_id == target_id,
                _open_to(worker),
                *conditions,
            )
            .order_by(JobRow.priority.desc(), JobRow.id)
            .limit(5)
        )
        with self._session(write=True) as session:
            _refuse_if_held(session, worker)
            for job_id in list(session.scalars(candidates)):
                lease = TaskLeaseRow(
                    job_id=job_id,
                    task_id=None,
                    kind=kind,
                    work_key=f"{kind}:{job_id}",
                    worker=worker,
                    status=LeaseStatus.ACTIVE,
                    trials=0,
                    expires_at=self._db_now_plus(lease_secs),
                )
                try:
                    # The partial unique index on the active work key settles a race between
                    # two claimers (PostgreSQL: the second waits for the first, then fails).
                    with session.begin_nested():
                        session.add(lease)
                        session.flush()
                except exc.IntegrityError:
                    _refuse_if_held(session, worker)  # the worker's own lease, claimed meanwhile
                    continue
                session.refresh(lease)
                return frozen(TaskLease, lease)
        return None

    def get_lease(self, lease_id: int) -> TaskLease | None:
        with self._session() as session:
            row = session.get(TaskLeaseRow, lease_id)
            return None if row is None else frozen(TaskLease, row)

    def list_leases(
        self,
        *,
        job_id: int | None = None,
        worker: str | None = None,
        status: str | None = None,
        owner: str | None = None,
        after_id: int = 0,
        limit: int = 100,
    ) -> list[TaskLease]:
        stmt = select(TaskLeaseRow).where(TaskLeaseRow.id > after_id)
        if owner is not None:
            stmt = stmt.join(JobRow, JobRow.id == TaskLeaseRow.job_id).where(JobRow.owner == owner)
        if job_id is not None:
            stmt = stmt.where(TaskLeaseRow.job_id == job_id)
        if worker is not None:
            stmt = stmt.where(TaskLeaseRow.worker == worker)
        if status is not None:
            stmt = stmt.where(TaskLeaseRow.status == status)
        stmt = stmt.order_by(TaskLeaseRow.id).limit(max(0, int(limit)))
        with self._session() as session:
            return [frozen(TaskLease, r) for r in session.scalars(stmt)]

    def renew_leases(self, worker: str, *, lease_secs: float) -> list[TaskLease]:
        active = (TaskLeaseRow.worker == worker, TaskLeaseRow.status == LeaseStatus.ACTIVE)
        with self._session(write=True) as session:
            session.execute(
                update(TaskLeaseRow)
                .where(*active)
                .values(expires_at=self._db_now_plus(lease_secs), updated_at=func.now())
                .execution_options(synchronize_session=False)
            )
            rows = session.scalars(select(TaskLeaseRow).where(*active).order_by(TaskLeaseRow.id))
            return [frozen(TaskLease, r) for r in rows]

    def record_lease_batch(
        self,
        lease_id: int,
        *,
        batch: int,
        trials: int,
        best_mean_secs: float | None,
        lease_secs: float,
        task_id: int | None = None,
    ) -> LeaseBatchResult:
        with self._session(write=True) as session:
            lease = session.get(TaskLeaseRow, lease_id)
            if lease is None:
                raise NotFoundError(f"task lease {lease_id} does not exist")
            measured = lease.task_id if task_id is None else task_id
            if lease.kind == "tune" and measured not in lease.task_ids:
                raise ConflictError(f"task {task_id} is not a task of lease {lease_id}")
            counted = False
            job_status = session.execute(
                select(JobRow.status).where(JobRow.id == lease.job_id)
            ).scalar_one()
            # A batch counts only while its lease is active and its job running (not after a
            # cancellation that has not reached the lease yet).
            if (
                lease.status == LeaseStatus.ACTIVE
                and lease.kind == "tune"
                and job_status == JobStatus.RUNNING
            ):
                if batch > lease.batches_done:
                    raise ConflictError(
                        f"batch {batch} of lease {lease_id} arrived before batch "
                        f"{lease.batches_done}: upload batches in order"
                    )
                if batch == lease.batches_done:
                    counted = self._count_batch(
                        session, lease, measured, trials, best_mean_secs, lease_secs
                    )
            job_status = session.execute(
                select(JobRow.status).where(JobRow.id == lease.job_id)
            ).scalar_one()
            lease = session.get(TaskLeaseRow, lease_id, populate_existing=True)
            return LeaseBatchResult(frozen(TaskLease, lease), counted, job_status)

    def _count_batch(
        self, session, lease, task_id: int, trials: int, best: float | None, lease_secs: float
    ) -> bool:
        """Count one batch of ``lease``'s task ``task_id`` (a compare-and-set on the lease's
        batch number): at most the trials left of the lease's allotment (``lease.trials``),
        never more; ``False`` when another upload of the same batch counted first."""
        # trials_done moves only with batches_done, so the compare-and-set on batches_done
        # below also guarantees the trials_done read with it.
        trials = max(0, min(int(trials), lease.trials - lease.trials_done))
        moved = session.execute(
            update(TaskLeaseRow)
            .where(
                TaskLeaseRow.id == lease.id,
                TaskLeaseRow.status == LeaseStatus.ACTIVE,
                TaskLeaseRow.batches_done == lease.batches_done,
            )
            .values(
                trials_done=TaskLeaseRow.trials_done + trials,
                batches_done=TaskLeaseRow.batches_done + 1,
                expires_at=self._db_now_plus(lease_secs),
                updated_at=func.now(),
            )
            .execution_options(synchronize_session=False)
        )
        if moved.rowcount != 1:
            return False
        task_values: dict[str, Any] = {
            "trials_done": JobTaskRow.trials_done + trials,
            "updated_at": func.now(),
        }
        if best is not None:
            task_values["best_mean_secs"] = case(
                (
                    or_(JobTaskRow.best_mean_secs.is_(None), JobTaskRow.best_mean_secs > best),
                    best,
                ),
                else_=JobTaskRow.best_mean_secs,
            )
        session.execute(
            update(JobTaskRow)
            .where(JobTaskRow.id == task_id)
            .values(**task_values)
            .execution_options(synchronize_session=False)
        )
        session.execute(
            update(JobRow)
            .where(JobRow.id == lease.job_id)
            .values(trials_done=JobRow.trials_done + trials, updated_at=func.now())
            .execution_options(synchronize_session=False)
        )
        return True
