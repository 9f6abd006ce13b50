"""Jobs, job tasks and artifacts on SQL, and the compare-and-set of every status change."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from sqlalchemy import case, func, or_, select, update

from db.contracts.jobs import JobStorage
from db.errors import InvalidTransitionError, NotFoundError, StorageError
from db.models import ArtifactRow, JobRow, JobTaskRow, ModelWorkloadRow, TargetRow
from db.sql.base import SQLBase, frozen
from db.types import Artifact, Job, JobProgress, JobStatus, JobTask, NewJobTask


def job_task_row(job_id: int, task: NewJobTask) -> JobTaskRow:
    """The ORM row of a new job task (one place, for ``add_job_tasks`` and job starts)."""
    return JobTaskRow(
        job_id=job_id,
        workload_id=task.workload_id,
        name=task.name,
        weight=task.weight,
        flops=task.flops,
        trial_budget=task.trial_budget,
        status=task.status,
        best_mean_secs=task.best_mean_secs,
    )


def status_sources(new_status: str, expected: str | None) -> list[str]:
    if new_status not in JobStatus.ALL:
        raise StorageError(f"unknown status {new_status!r}")
    sources = [s for s in JobStatus.ALL if JobStatus.allowed(s, new_status)]
    if expected is not None:
        sources = [s for s in sources if s == expected]
    return sources


def compare_and_set(session, model, kind: str, row_id: int, new_status, sources, values):
    result = session.execute(
        update(model)
        .where(model.id == row_id, model.status.in_(sources))
        .values(status=new_status, updated_at=func.now(), **values)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:
        current = session.execute(
            select(model.status).where(model.id == row_id)
        ).scalar_one_or_none()
        if current is None:
            raise NotFoundError(f"{kind} {row_id} does not exist")
        raise InvalidTransitionError(kind, row_id, current, new_status)
    return session.get(model, row_id, populate_existing=True)


class JobSQL(SQLBase, JobStorage):
    """The jobs, job tasks and artifacts part of :class:`JobStorage`."""

    # -- jobs --------------------------------------------------------------------------------
    def create_job(
        self,
        *,
        target_id: int,
        trial_budget: int,
        model_id: int | None = None,
        priority: int = 0,
        owner: str | None = None,
        pinned_to: Callable[[int], str] | None = None,
    ) -> Job:
        if trial_budget < 0:
            raise StorageError(f"trial_budget must be >= 0, got {trial_budget}")
        with self._session(write=True) as session:
            row = JobRow(
                target_id=target_id,
                trial_budget=trial_budget,
                model_id=model_id,
                priority=priority,
                owner=owner,
                status=JobStatus.QUEUED,
            )
            session.add(row)
            session.flush()
            if pinned_to is not None:
                row.worker = pinned_to(row.id)
                session.flush()
            session.refresh(row)
            return frozen(Job, row)

    def get_job(self, job_id: int) -> Job | None:
        with self._session() as session:
            row = session.get(JobRow, job_id)
            return None if row is None else frozen(Job, row)

    def owned_job_ids(self, owner: str, job_ids: Collection[int]) -> set[int]:
        wanted = sorted({int(i) for i in job_ids})
        if not wanted:
            return set()
        with self._session() as session:
            return set(
                session.scalars(
                    select(JobRow.id).where(JobRow.owner == owner, JobRow.id.in_(wanted))
                )
            )

    def list_jobs(
        self,
        *,
        status: str | None = None,
        limit: int = 100,
        owner: str | None = None,
        offset: int = 0,
    ) -> list[Job]:
        stmt = select(JobRow).order_by(JobRow.id.desc()).limit(limit).offset(max(0, offset))
        if status is not None:
            stmt = stmt.where(JobRow.status == status)
        if owner is not None:
            stmt = stmt.where(JobRow.owner == owner)
        with self._session() as session:
            return [frozen(Job, r) for r in session.scalars(stmt)]

    def job_progress(self, job_id: int) -> JobProgress | None:
        jobs, tasks, artifacts = JobRow.__table__, JobTaskRow.__table__, ArtifactRow.__table__
        with self._connection() as conn:
            job = conn.execute(select(jobs).where(jobs.c.id == job_id)).one_or_none()
            if job is None:
                return None
            task_rows = conn.execute(
                select(tasks).where(tasks.c.job_id == job_id).order_by(tasks.c.id)
            ).all()
            artifact_rows = conn.execute(
                select(artifacts).where(artifacts.c.job_id == job_id).order_by(artifacts.c.id)
            ).all()
            target_key = conn.execute(
                select(TargetRow.key).where(TargetRow.id == job.target_id)
            ).scalar_one()
            model_tasks = None
            if job.model_id is not None:
                model_tasks = conn.execute(
                    select(func.count())
                    .select_from(ModelWorkloadRow)
                    .where(ModelWorkloadRow.model_id == job.model_id)
                ).scalar_one()
        return JobProgress(
            job=frozen(Job, job),
            tasks=tuple(frozen(JobTask, r) for r in task_rows),
            artifacts=tuple(frozen(Artifact, r) for r in artifact_rows),
            target_key=target_key,
            model_tasks=None if model_tasks is None else int(model_tasks),
        )

    def count_jobs(self, *, status: str | None = None, owner: str | None = None) -> int:
        stmt = select(func.count()).select_from(JobRow)
        if status is not None:
            stmt = stmt.where(JobRow.status == status)
        if owner is not None:
            stmt = stmt.where(JobRow.owner == owner)
        with self._connection() as conn:
            return int(conn.execute(stmt).scalar_one())

    def job_counts(self) -> dict[str, int]:
        stmt = select(JobRow.status, func.count()).group_by(JobRow.status)
        counts = dict.fromkeys(JobStatus.ALL, 0)
        with self._connection() as conn:
            counts.update({status: int(n) for status, n in conn.execute(stmt)})
        return counts

    def transition_job(
        self, job_id: int, new_status: str, *, expected: str | None = None, error: str | None = None
    ) -> Job:
        sources = status_sources(new_status, expected)
        values: dict[str, Any] = {}
        if new_status == JobStatus.RUNNING:
            values["started_at"] = func.coalesce(JobRow.started_at, func.now())
        if new_status in JobStatus.TERMINAL:
            values["finished_at"] = func.now()
        if error is not None:
            values["error"] = error
        with self._session(write=True) as session:
            row = compare_and_set(session, JobRow, "job", job_id, new_status, sources, values)
            return frozen(Job, row)

    def add_job_trials(self, job_id: int, trials: int) -> Job:
        with self._session(write=True) as session:
            result = session.execute(
                update(JobRow)
                .where(JobRow.id == job_id)
                .values(trials_done=JobRow.trials_done + trials, updated_at=func.now())
                .execution_options(synchronize_session=False)
            )
            if result.rowcount != 1:
                raise NotFoundError(f"job {job_id} does not exist")
            return frozen(Job, session.get(JobRow, job_id, populate_existing=True))

    def merge_job_search(self, job_id: int, merge: Callable[[str | None], str]) -> Job:
        with self._session(write=True) as session:
            row = session.get(JobRow, job_id, with_for_update=True)
            if row is None:
                raise NotFoundError(f"job {job_id} does not exist")
            row.search_json = merge(row.search_json)
            row.updated_at = func.now()
            session.flush()
            return frozen(Job, session.get(JobRow, job_id, populate_existing=True))

    def add_job_tasks(self, job_id: int, tasks: Sequence[NewJobTask]) -> list[JobTask]:
        with self._session(write=True) as session:
            if session.get(JobRow, job_id) is None:
                raise NotFoundError(f"job {job_id} does not exist")
            rows = [job_task_row(job_id, t) for t in tasks]
            session.add_all(rows)
            session.flush()
            for row in rows:
                session.refresh(row)
            return [frozen(JobTask, r) for r in rows]

    def list_job_tasks(self, job_id: int) -> list[JobTask]:
        stmt = select(JobTaskRow).where(JobTaskRow.job_id == job_id).order_by(JobTaskRow.id)
        with self._session() as session:
            return [frozen(JobTask, r) for r in session.scalars(stmt)]

    def transition_job_task(
        self,
        task_id: int,
        new_status: str,
        *,
        expected: str | None = None,
        leased_by: str | None = None,
        lease_seconds: float | None = None,
    ) -> JobTask:
        sources = status_sources(new_status, expected)
        values: dict[str, Any] = {}
        if new_status == JobStatus.RUNNING:
            values["leased_by"] = leased_by
            values["lease_expires_at"] = (
                None if lease_seconds is None else self._db_now_plus(lease_seconds)
            )
        else:
            values["leased_by"] = None
            values["lease_expires_at"] = None
        with self._session(write=True) as session:
            row = compare_and_set(
                session, JobTaskRow, "job task", task_id, new_status, sources, values
            )
            return frozen(JobTask, row)

    def update_job_task_progress(
        self, task_id: int, *, trials_done: int | None = None, best_mean_secs: float | None = None
    ) -> JobTask:
        values: dict[str, Any] = {"updated_at": func.now()}
        if trials_done is not None:
            values["trials_done"] = trials_done
        if best_mean_secs is not None:
            values["best_mean_secs"] = case(
                (
                    or_(
                        JobTaskRow.best_mean_secs.is_(None),
                        JobTaskRow.best_mean_secs > best_mean_secs,
                    ),
                    best_mean_secs,
                ),
                else_=JobTaskRow.best_mean_secs,
            )
        with self._session(write=True) as session:
            result = session.execute(
                update(JobTaskRow)
                .where(JobTaskRow.id == task_id)
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            if result.rowcount != 1:
                raise NotFoundError(f"job task {task_id} does not exist")
            return frozen(JobTask, session.get(JobTaskRow, task_id, populate_existing=True))

    def count_open_jobs(self, *, target_id: int) -> int:
        stmt = (
            select(func.count())
            .select_from(JobRow)
            .where(
                JobRow.target_id == target_id,
                JobRow.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)),
            )
        )
        with self._connection() as conn:
            return int(conn.execute(stmt).scalar_one())

    def count_queued_tasks(self, *, target_ids: Sequence[int]) -> int:
        stmt = (
            select(func.count())
            .select_from(JobTaskRow)
            .join(JobRow, JobRow.id == JobTaskRow.job_id)
            .where(
                JobRow.target_id.in_(list(target_ids)),
                JobRow.status == JobStatus.RUNNING,
                JobTaskRow.status == JobStatus.QUEUED,
            )
        )
        with self._connection() as conn:
            return int(conn.execute(stmt).scalar_one())

    # -- artifacts ---------------------------------------------------------------------------
    def add_artifact(
        self,
        *,
        job_id: int,
        path: str,
        sha256: str,
        size: int,
        manifest_json: str = "{}",
        verified: bool = False,
    ) -> Artifact:
        row = ArtifactRow(
            job_id=job_id,
            path=path,
            sha256=sha256,
            size=size,
            manifest_json=manifest_json,
            verified=verified,
        )
        return self._add(Artifact, row)

    def list_artifacts(self, job_id: int) -> list[Artifact]:
        stmt = select(ArtifactRow).where(ArtifactRow.job_id == job_id).order_by(ArtifactRow.id)
        with self._session() as session:
            return [frozen(Artifact, r) for r in session.scalars(stmt)]
