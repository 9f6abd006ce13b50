"""Task leases on SQL, ending side: finish, expire, release, and move the leased work on."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy import true as true_

from db.contracts.jobs import JobStorage
from db.errors import ConflictError, InvalidTransitionError, NotFoundError, StorageError
from db.models import ArtifactRow, JobRow, JobTaskRow, TaskLeaseRow
from db.sql.base import SQLBase, frozen
from db.sql.jobs import compare_and_set
from db.types import Artifact, JobStatus, LeaseStatus, TaskLease


class LeaseEndSQL(SQLBase, JobStorage):
    """The lease-ending part of :class:`JobStorage`."""

    def finish_lease(
        self, lease_id: int, outcome: str, *, error: str | None = None, max_attempts: int = 3
    ) -> TaskLease:
        if outcome not in LeaseStatus.OUTCOMES:
            raise StorageError(f"unknown lease outcome {outcome!r}")
        with self._session(write=True) as session:
            self._end_lease(session, lease_id, outcome, error=error)
            lease = session.get(TaskLeaseRow, lease_id, populate_existing=True)
            self._release_work(session, lease, max_attempts=max_attempts)
            return frozen(TaskLease, lease)

    def _end_lease(self, session, lease_id: int, outcome: str, *, error=None, where=()) -> bool:
        values: dict[str, Any] = {
            "status": outcome,
            "finished_at": func.now(),
            "updated_at": func.now(),
        }
        if error is not None:
            values["error"] = error
        result = session.execute(
            update(TaskLeaseRow)
            .where(TaskLeaseRow.id == lease_id, TaskLeaseRow.status == LeaseStatus.ACTIVE, *where)
            .values(**values)
            .execution_options(synchronize_session=False)
        )
        if result.rowcount == 1:
            return True
        if where:
            return False
        current = session.execute(
            select(TaskLeaseRow.status).where(TaskLeaseRow.id == lease_id)
        ).scalar_one_or_none()
        if current is None:
            raise NotFoundError(f"task lease {lease_id} does not exist")
        raise InvalidTransitionError("task lease", lease_id, current, outcome)

    def _attempts(self, session, work_key: str) -> int:
        return int(
            session.execute(
                select(func.count())
                .select_from(TaskLeaseRow)
                .where(
                    TaskLeaseRow.work_key == work_key,
                    TaskLeaseRow.status.in_((LeaseStatus.EXPIRED, LeaseStatus.FAILED)),
                )
            ).scalar_one()
        )

    def _release_work(self, session, lease: TaskLeaseRow, *, max_attempts: int) -> None:
        """After ``lease`` ended: move its task (or its job, for a finalize lease) on."""
        if lease.kind == "preview":  # a convenience: its end moves neither task nor job
            return
        job = session.get(JobRow, lease.job_id, populate_existing=True)
        outcome = lease.status
        if lease.kind == "finalize":
            failed = outcome == LeaseStatus.FAILED or (
                outcome == LeaseStatus.EXPIRED
                and self._attempts(session, lease.work_key) >= max_attempts
            )
            if failed and job.status == JobStatus.RUNNING:
                reason = lease.error or f"the finalize step was lost {max_attempts} times"
                compare_and_set(
                    session,
                    JobRow,
                    "job",
                    job.id,
                    JobStatus.FAILED,
                    [JobStatus.RUNNING],
                    {"finished_at": func.now(), "error": f"finalize failed: {reason}"},
                )
            return
        for task_id in lease.task_ids:
            task = session.get(JobTaskRow, task_id, populate_existing=True)
            if task is None or task.status != JobStatus.RUNNING:
                continue
            if job.status != JobStatus.RUNNING or outcome == LeaseStatus.CANCELLED:
                new = JobStatus.CANCELLED
            elif task.trials_done >= task.trial_budget or job.trials_done >= job.trial_budget:
                new = JobStatus.SUCCEEDED  # its budget, or its job's, is counted
            elif outcome == LeaseStatus.DONE and lease.trials_done < lease.trials:
                new = JobStatus.SUCCEEDED  # the search ran out of new candidates
            elif outcome in (LeaseStatus.EXPIRED, LeaseStatus.FAILED) and (
                self._attempts(session, lease.work_key) >= max_attempts
            ):
                new = JobStatus.FAILED
            else:
                new = JobStatus.QUEUED
            session.execute(
                update(JobTaskRow)
                .where(JobTaskRow.id == task.id, JobTaskRow.status == JobStatus.RUNNING)
                .values(status=new, leased_by=None, lease_expires_at=None, updated_at=func.now())
                .execution_options(synchronize_session=False)
            )

    def reap_expired_leases(self, *, max_attempts: int = 3) -> list[int]:
        expired = (TaskLeaseRow.status == LeaseStatus.ACTIVE, TaskLeaseRow.expires_at < func.now())
        reaped: list[int] = []
        with self._session(write=True) as session:
            ids = list(session.scalars(select(TaskLeaseRow.id).where(*expired).limit(100)))
            for lease_id in ids:
                # Compare-and-set on the same conditions: a lease renewed or reaped by another
                # process meanwhile is left alone (PostgreSQL re-checks after the row lock).
                if not self._end_lease(
                    session,
                    lease_id,
                    LeaseStatus.EXPIRED,
                    error="lease expired (no heartbeat)",
                    where=expired[1:],
                ):
                    continue
                lease = session.get(TaskLeaseRow, lease_id, populate_existing=True)
                self._release_work(session, lease, max_attempts=max_attempts)
                reaped.append(lease_id)
        return reaped

    def release_worker_leases(self, worker: str, *, max_attempts: int = 3) -> list[int]:
        released: list[int] = []
        with self._session(write=True) as session:
            ids = list(
                session.scalars(
                    select(TaskLeaseRow.id).where(
                        TaskLeaseRow.worker == worker, TaskLeaseRow.status == LeaseStatus.ACTIVE
                    )
                )
            )
            for lease_id in ids:
                if not self._end_lease(
                    session,
                    lease_id,
                    LeaseStatus.EXPIRED,
                    error=f"worker {worker} went away",
                    where=(true_(),),
                ):
                    continue
                lease = session.get(TaskLeaseRow, lease_id, populate_existing=True)
                self._release_work(session, lease, max_attempts=max_attempts)
                released.append(lease_id)
        return released

    def complete_preview(
        self,
        lease_id: int,
        *,
        path: str,
        sha256: str,
        size: int,
        manifest_json: str,
        verified: bool,
    ) -> Artifact:
        return self._complete_build(
            "preview",
            lease_id,
            ArtifactRow(
                path=path,
                sha256=sha256,
                size=size,
                manifest_json=manifest_json,
                verified=verified,
                kind="preview",
            ),
        )

    def complete_finalize(
        self,
        lease_id: int,
        *,
        path: str,
        sha256: str,
        size: int,
        manifest_json: str,
        verified: bool,
    ) -> Artifact:
        return self._complete_build(
            "finalize",
            lease_id,
            ArtifactRow(
                path=path, sha256=sha256, size=size, manifest_json=manifest_json, verified=verified
            ),
        )

    def _complete_build(self, kind: str, lease_id: int, artifact: ArtifactRow) -> Artifact:
        """End the active ``kind`` lease ``lease_id`` done and add ``artifact`` to its job; a
        finalize lease also moves the job to ``succeeded``. One transaction."""
        with self._session(write=True) as session:
            lease = session.get(TaskLeaseRow, lease_id)
            if lease is None:
                raise NotFoundError(f"task lease {lease_id} does not exist")
            if lease.kind != kind:
                raise ConflictError(f"lease {lease_id} is a {lease.kind} lease, not a {kind} lease")
            self._end_lease(session, lease_id, LeaseStatus.DONE)
            artifact.job_id = lease.job_id
            session.add(artifact)
            if kind == "finalize":
                compare_and_set(
                    session,
                    JobRow,
                    "job",
                    lease.job_id,
                    JobStatus.SUCCEEDED,
                    [JobStatus.RUNNING],
                    {"finished_at": func.now(), "worker": lease.worker},
                )
            session.flush()
            session.refresh(artifact)
            return frozen(Artifact, artifact)
