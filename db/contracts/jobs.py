"""The contract of jobs, their tasks, the leases that hand the tasks to workers, and artifacts.

Ownership of running work
    A job or job task in ``running`` belongs to whoever moved it there (the scheduler for jobs, a
    worker holding the lease for tasks). Only the owner moves it on, except that anyone may move
    stale work (expired lease, dead worker) back to ``queued``. Every status change is a
    compare-and-set on the current status, so two processes racing to claim or reap the same row
    cannot both succeed: the loser gets :class:`db.errors.InvalidTransitionError`.

Task leases (distributed workers)
    A queued job is *started* (:meth:`JobStorage.start_job`: ``queued -> running`` and its
    tasks created, one transaction) by whoever plans it. Its queued tasks are then leased one at a
    time (:meth:`claim_task_lease`: a lease of at most ``max_trials`` of the task's remaining
    trials; ``FOR UPDATE SKIP LOCKED`` on PostgreSQL), each measured batch is counted once
    (:meth:`record_lease_batch`, idempotent by batch number), and the worker ends its lease
    (:meth:`finish_lease`). Once no task of a running job is queued or running, one worker takes
    its ``finalize`` lease (:meth:`claim_finalize_lease`) and completes the job
    (:meth:`complete_finalize`). A lease lives while its worker heartbeats
    (:meth:`renew_leases`); any process may expire stale ones (:meth:`reap_expired_leases`,
    compare-and-set): their work goes back to the queue with the trials already counted kept. At
    most one lease per piece of work is active (a partial unique index), so work is never
    assigned twice; and at most one lease per worker (another partial unique index): a claim for
    a worker that already holds an active lease raises :class:`db.errors.LeaseHeldError`
    (a :class:`~db.errors.ConflictError`) and claims nothing, whatever the interleaving. A task
    whose leases expired or failed ``max_attempts`` times fails instead of going back; so does a
    finalize step (failing its job).

Cancellation
    The job's user may cancel it in ``queued`` or ``running`` (``-> cancelled``, final) without
    owning it; the worker running it notices at its next progress write and stops. Its own later
    status changes then fail the compare-and-set, which is how it learns of the cancellation.

Allowed state transitions (jobs and job tasks; see :class:`db.types.JobStatus`)
    ``queued -> running | cancelled``; ``running -> succeeded | failed | cancelled | queued``;
    ``succeeded``, ``failed`` and ``cancelled`` are final.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Sequence

from db.types import (
    Artifact,
    Job,
    JobProgress,
    JobTask,
    LeaseBatchResult,
    NewJobTask,
    TaskLease,
)


class JobStorage(abc.ABC):
    """Jobs, job tasks, task leases and artifacts (see the module docstring for the contract)."""

    # -- jobs and job tasks ------------------------------------------------------------------
    @abc.abstractmethod
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
        """Create a job in ``queued``. ``pinned_to(job id)`` names the only worker that may
        start it and lease its work (``Job.worker``; a ``tunehub tune`` run's own): claims by
        any other worker pass it by. Unpinned jobs (``None``) go to any worker of the target."""

    @abc.abstractmethod
    def get_job(self, job_id: int) -> Job | None:
        """The job, or ``None``."""

    @abc.abstractmethod
    def owned_job_ids(self, owner: str, job_ids: Collection[int]) -> set[int]:
        """Those of ``job_ids`` whose job ``owner`` owns (one query, whatever their number)."""

    @abc.abstractmethod
    def list_jobs(
        self,
        *,
        status: str | None = None,
        limit: int = 100,
        owner: str | None = None,
        offset: int = 0,
    ) -> list[Job]:
        """Jobs, newest first (only ``owner``'s if given)."""

    @abc.abstractmethod
    def job_progress(self, job_id: int) -> JobProgress | None:
        """The job, its tasks, its artifacts, its target's key and its model's task count, read
        in one transaction (the service's status page, polled often); ``None`` if no such job."""

    @abc.abstractmethod
    def count_jobs(self, *, status: str | None = None, owner: str | None = None) -> int:
        """Number of matching jobs."""

    @abc.abstractmethod
    def job_counts(self) -> dict[str, int]:
        """Number of jobs in each status (every status present, zero included)."""

    @abc.abstractmethod
    def transition_job(
        self, job_id: int, new_status: str, *, expected: str | None = None, error: str | None = None
    ) -> Job:
        """Move a job to ``new_status`` with a compare-and-set.

        Sets ``started_at`` on the first move to ``running`` and ``finished_at`` on a final state.

        Args:
            expected: require this current status (e.g. a scheduler claiming ``queued`` work).
            error: stored with the change (for ``failed``).

        Raises:
            NotFoundError: no such job.
            InvalidTransitionError: the move is not allowed from the current status.
        """

    @abc.abstractmethod
    def add_job_trials(self, job_id: int, trials: int) -> Job:
        """Add ``trials`` to ``trials_done`` atomically."""

    @abc.abstractmethod
    def merge_job_search(self, job_id: int, merge: Callable[[str | None], str]) -> Job:
        """Replace the job's ``search_json`` (what its runs' search features did, summed) with
        ``merge(current text or None)``, in one transaction that holds the job's row, so two
        runs reporting at once both count. Raises ``NotFoundError`` for a missing job."""

    @abc.abstractmethod
    def add_job_tasks(self, job_id: int, tasks: Sequence[NewJobTask]) -> list[JobTask]:
        """Create the tasks of a job in ``queued``."""

    @abc.abstractmethod
    def list_job_tasks(self, job_id: int) -> list[JobTask]:
        """The tasks of a job, by id."""

    @abc.abstractmethod
    def transition_job_task(
        self,
        task_id: int,
        new_status: str,
        *,
        expected: str | None = None,
        leased_by: str | None = None,
        lease_seconds: float | None = None,
    ) -> JobTask:
        """Compare-and-set a task's status (same rules as :meth:`transition_job`).

        Moving to ``running`` records ``leased_by`` and a lease expiring ``lease_seconds`` from
        now (database clock); leaving ``running`` clears the lease.
        """

    @abc.abstractmethod
    def update_job_task_progress(
        self, task_id: int, *, trials_done: int | None = None, best_mean_secs: float | None = None
    ) -> JobTask:
        """Record progress; ``best_mean_secs`` only ever decreases."""

    # -- task leases (distributed workers; see the module docstring) --------------------------
    @abc.abstractmethod
    def start_job(self, job_id: int, tasks: Sequence[NewJobTask]) -> Job | None:
        """Move a queued job to ``running`` and create its planned tasks, in one transaction.

        Tasks of an earlier run (same workload) are kept, unfinished ones queued again. Returns
        ``None`` (nothing written) when the job is no longer queued: another process started it.
        """

    @abc.abstractmethod
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
        """Lease the next queued task of a running job for ``target_id`` to ``worker``, with up
        to ``max_tasks - 1`` more queued tasks of the same job (one search spreads the lease's
        trials over them: ``TaskLease.task_ids``, the first one ``task_id``).

        Order: job priority, job age, heaviest task (FLOPs x weight). For each task the lease
        covers ``min(remaining, max_trials)`` trials (``max_trials`` may be a function of the
        task's trial budget), and in all no more than its job has left (``trial_budget -
        trials_done``); a task with nothing left is finished, not leased. The lease expires
        ``lease_secs`` from now unless renewed. ``job_id``: only that job's tasks. Jobs pinned to
        another worker (``Job.worker``) are passed by. ``None`` when no task is waiting. Raises
        :class:`db.errors.LeaseHeldError` (nothing claimed) when ``worker`` already holds an
        active lease of any kind.
        """

    @abc.abstractmethod
    def claim_finalize_lease(
        self, worker: str, *, target_id: int, lease_secs: float, job_id: int | None = None
    ) -> TaskLease | None:
        """Lease the finalize step of a running job whose tasks are all finished (``job_id``:
        that job only; never a job pinned to another worker), or ``None``. Raises
        :class:`db.errors.LeaseHeldError` when ``worker`` already holds an active lease."""

    @abc.abstractmethod
    def claim_preview_lease(
        self, worker: str, *, target_id: int, lease_secs: float, max_attempts: int = 2
    ) -> TaskLease | None:
        """Lease the preview of a running job of ``target_id`` (its zero-trial artifact, built
        while the job tunes) to ``worker``: a job with tasks still queued or running, without a
        preview artifact, and with fewer than ``max_attempts`` preview leases so far, whatever
        became of them (one at a time; a preview is a convenience: a lease that failed, expired
        or was returned is tried again, but never for long). ``None`` when there is no such
        job. Raises :class:`db.errors.LeaseHeldError` when ``worker`` already holds an active
        lease."""

    @abc.abstractmethod
    def get_lease(self, lease_id: int) -> TaskLease | None:
        """The lease, or ``None``."""

    @abc.abstractmethod
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
        """Leases in id order (keyset pages: ``id > after_id``), filtered as given (``owner``:
        only leases of jobs that user owns)."""

    @abc.abstractmethod
    def renew_leases(self, worker: str, *, lease_secs: float) -> list[TaskLease]:
        """Push the expiry of ``worker``'s active leases to ``lease_secs`` from now; return them."""

    @abc.abstractmethod
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
        """Count batch number ``batch`` (0, 1, ...) of a tune lease: ``trials`` on the lease, on
        the task measured (``task_id``, one of the lease's ``task_ids``; default its first) and
        on its job, the task's best latency, and renew the lease. Counted at most once: a
        repeated batch number, a lease no longer active or a job no longer running counts
        nothing (``counted`` false). A lease counts no more trials than it was allotted
        (``TaskLease.trials``): a batch past the allotment counts only what is left of it.
        The records themselves are committed separately (:meth:`commit_records`).

        Raises:
            NotFoundError: no such lease.
            ConflictError: ``batch`` skips ahead of the next expected number, or ``task_id``
                is not a task of the lease.
        """

    @abc.abstractmethod
    def finish_lease(
        self, lease_id: int, outcome: str, *, error: str | None = None, max_attempts: int = 3
    ) -> TaskLease:
        """End an active lease with ``outcome`` (``done``, ``returned``, ``failed``,
        ``cancelled``) and move its work on, each task of a tune lease alike: a task is
        ``succeeded`` once its budget or its job's is counted
        (or a ``done`` lease measured fewer trials than leased: the search ran out of
        candidates), ``failed`` after ``max_attempts`` expired/failed leases, else ``queued``
        again; a failed finalize lease fails its job; a preview lease moves nothing.

        Raises:
            NotFoundError: no such lease.
            InvalidTransitionError: the lease is no longer active (expired, or ended before).
        """

    @abc.abstractmethod
    def reap_expired_leases(self, *, max_attempts: int = 3) -> list[int]:
        """Expire active leases past ``expires_at`` (database clock) and requeue their work (as
        :meth:`finish_lease` does for ``expired``); return their ids. Any process may call it;
        each expiry is a compare-and-set, so concurrent reapers never expire a lease twice."""

    @abc.abstractmethod
    def release_worker_leases(self, worker: str, *, max_attempts: int = 3) -> list[int]:
        """Expire every active lease of ``worker`` now (it restarted or its process exited)."""

    @abc.abstractmethod
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
        """End an active finalize lease ``done``, record the job's artifact and move the job to
        ``succeeded`` (``Job.worker`` becomes the lease's worker), in one transaction.

        Raises:
            NotFoundError: no such lease.
            ConflictError: not a finalize lease.
            InvalidTransitionError: the lease is not active or the job is no longer running.
        """

    @abc.abstractmethod
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
        """End an active preview lease ``done`` and record the job's preview artifact (``kind``
        ``preview``), in one transaction; the job's status is not changed.

        Raises:
            NotFoundError: no such lease.
            ConflictError: not a preview lease.
            InvalidTransitionError: the lease is not active.
        """

    @abc.abstractmethod
    def count_open_jobs(self, *, target_id: int) -> int:
        """Jobs for ``target_id`` still ``queued`` or ``running``."""

    @abc.abstractmethod
    def count_queued_tasks(self, *, target_ids: Sequence[int]) -> int:
        """Tasks waiting for a tune lease: ``queued`` tasks of ``running`` jobs of the targets."""

    # -- artifacts ---------------------------------------------------------------------------
    @abc.abstractmethod
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
        """Record a compiled artifact of a job."""

    @abc.abstractmethod
    def list_artifacts(self, job_id: int) -> list[Artifact]:
        """The artifacts of a job, by id."""
