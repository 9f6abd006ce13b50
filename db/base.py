"""The storage contract: what every tuning-database backend promises its callers.

Thread safety
    A storage object is shared by all threads of a process (the API's request threads, the
    MetaSchedule tuning thread through :class:`db.MetaScheduleDatabase`). Each method runs in its
    own short transaction on its own pooled connection; no method keeps state between calls except
    immutable caches (target and workload ids, which never change once assigned). Several
    processes may use one database at once: PostgreSQL for any number of machines, SQLite for the
    processes of one machine (writers queue on the 30 s busy timeout).

Records are append-mostly
    A tuning record is identified by ``(workload, target, sha256(trace JSON))``. Committing a
    record that is already stored never adds a row; the stored measurement is replaced only by a
    *better* one: a valid measurement replaces a failed one, a lower mean replaces a higher one,
    and an error text is added to a failure that had none. So imports, retried uploads and
    several workers measuring the same candidate converge on one row holding the best
    measurement, and committing the same batch twice changes nothing.

Failed candidates
    Stored with ``is_valid = False`` and ``mean_secs = NULL`` (MetaSchedule marks them with
    ``run_secs = [1e10]``), with the builder's or runner's error text when the caller has it.
    They are never returned by :meth:`TuningStorage.top_k`, and they keep the search from
    measuring the same broken candidate again.

Ownership of running work
    A job or job task in ``running`` belongs to whoever moved it there (the scheduler for jobs, a
    worker holding the lease for tasks). Only the owner moves it on, except that anyone may move
    stale work (expired lease, dead worker) back to ``queued``. Every status change is a
    compare-and-set on the current status, so two processes racing to claim or reap the same row
    cannot both succeed: the loser gets :class:`db.errors.InvalidTransitionError`.

Workers and job leases
    A worker claims the next queued job with :meth:`TuningStorage.claim_next_job` (one statement;
    ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, the write lock on SQLite), which records its name
    in ``Job.worker``. The worker holds the job while it heartbeats (:meth:`heartbeat`, database
    clock). A job is stale when its worker stopped heartbeating for longer than a timeout, not
    merely when it is old; :meth:`requeue_jobs` moves such jobs back to ``queued`` (any process
    may call it; each move is a compare-and-set) and the next claim resumes them from their
    stored records. Jobs run by the CLI have no worker and are never reaped.

Task leases (distributed workers)
    A queued job is *started* (:meth:`TuningStorage.start_job`: ``queued -> running`` and its
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
    assigned twice. A task whose leases expired or failed ``max_attempts`` times fails instead of
    going back; so does a finalize step (failing its job).

Cancellation
    The job's user may cancel it in ``queued`` or ``running`` (``-> cancelled``, final) without
    owning it; the worker running it notices at its next progress write and stops. Its own later
    status changes then fail the compare-and-set, which is how it learns of the cancellation.

Allowed state transitions (jobs and job tasks; see :class:`db.types.JobStatus`)
    ``queued -> running | cancelled``; ``running -> succeeded | failed | cancelled | queued``;
    ``succeeded``, ``failed`` and ``cancelled`` are final.

Errors
    Methods raise only :mod:`db.errors` exceptions: ``NotFoundError`` for a missing id,
    ``ConflictError`` for a constraint violation (e.g. an unknown workload id in a record),
    ``StorageUnavailableError`` when the database cannot be reached or stays locked.
"""
from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from db.types import (
    ApiToken,
    Artifact,
    CostModelBlob,
    DatabaseStats,
    Job,
    JobHistoryPage,
    JobProgress,
    JobTask,
    LeaseBatchResult,
    ModelRecord,
    ModelWorkload,
    NewJobTask,
    NewTuningRecord,
    TargetRecord,
    TaskLease,
    TuningRecordRow,
    Worker,
    WorkloadRecord,
    WorkloadSummary,
)

if TYPE_CHECKING:  # pragma: no cover
    from compiler.target import TargetSpec


class TuningStorage(abc.ABC):
    """The tuning database (see the module docstring for the contract)."""

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def url(self) -> str:
        """The database URL, password masked."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release pooled connections. The object must not be used afterwards."""

    def __enter__(self) -> TuningStorage:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- targets and workloads ---------------------------------------------------------------
    @abc.abstractmethod
    def ensure_target(self, spec: TargetSpec) -> TargetRecord:
        """Return the row for ``spec`` (matched on ``spec.key``), inserting it if missing."""

    @abc.abstractmethod
    def get_target(self, key: str) -> TargetRecord | None:
        """The target with this 16-hex key, or ``None``."""

    @abc.abstractmethod
    def get_target_by_id(self, target_id: int) -> TargetRecord | None:
        """The target with this id, or ``None``."""

    @abc.abstractmethod
    def list_targets(self) -> list[TargetRecord]:
        """All targets, oldest first."""

    @abc.abstractmethod
    def ensure_workload(
        self, key: str, mod_json: str, *, flops: float | None = None, summary: str = ""
    ) -> WorkloadRecord:
        """Return the workload with ``key``, inserting it if missing.

        Args:
            key: :func:`compiler.keys.workload_key` of the module (the caller computes it).
            mod_json: ``tvm.ir.save_json(mod)``.
            flops: estimated floating-point operations, if known.
            summary: a one-line readable description.

        Returns:
            The stored row; an existing row is returned unchanged (first writer wins).
        """

    @abc.abstractmethod
    def get_workload(self, key: str) -> WorkloadRecord | None:
        """The workload with this key, or ``None``."""

    @abc.abstractmethod
    def get_workload_by_id(self, workload_id: int) -> WorkloadRecord | None:
        """The workload with this id, or ``None``."""

    @abc.abstractmethod
    def workload_ids(self, keys: Sequence[str]) -> dict[str, int]:
        """Map the given keys to workload ids; unknown keys are left out."""

    @abc.abstractmethod
    def list_workloads(self, *, target_id: int | None = None) -> list[WorkloadRecord]:
        """All workloads (those with records for ``target_id`` if given), by id."""

    # -- tuning records ----------------------------------------------------------------------
    @abc.abstractmethod
    def commit_records(self, records: Sequence[NewTuningRecord]) -> None:
        """Store measurements in one transaction (the bulk path: workers, imports, the API).

        Duplicates, within the batch or against stored rows, follow the keep-the-better rule of
        the module docstring.

        Raises:
            ConflictError: a record names a workload, target or job that does not exist.
        """

    def commit_record(self, record: NewTuningRecord) -> None:
        """Store one measurement (see :meth:`commit_records`)."""
        self.commit_records([record])

    @abc.abstractmethod
    def top_k(self, workload_id: int, target_id: int, k: int) -> list[TuningRecordRow]:
        """The ``k`` best valid records of a workload on a target, lowest mean first
        (ties: oldest first)."""

    @abc.abstractmethod
    def top_k_ids(self, workload_id: int, target_id: int, k: int) -> list[tuple[int, float]]:
        """``(id, mean_secs)`` of :meth:`top_k`'s records, same order, read from the index only.

        For callers that cache parsed records by ``(id, mean_secs)`` (a record improved in place
        keeps its id but changes its mean) and fetch the rest with :meth:`get_records`.
        """

    @abc.abstractmethod
    def get_records(self, ids: Sequence[int]) -> list[TuningRecordRow]:
        """The records with these ids (unknown ids are left out), in no particular order."""

    def best_record(self, workload_id: int, target_id: int) -> TuningRecordRow | None:
        """The best valid record of a workload on a target, or ``None``."""
        rows = self.top_k(workload_id, target_id, 1)
        return rows[0] if rows else None

    @abc.abstractmethod
    def get_record(
        self, workload_id: int, target_id: int, trace_hash: str
    ) -> TuningRecordRow | None:
        """The record with this identity, valid or not, or ``None``."""

    @abc.abstractmethod
    def iter_records(
        self,
        *,
        target_id: int | None = None,
        workload_id: int | None = None,
        valid_only: bool = False,
        batch_size: int = 1000,
    ) -> Iterator[TuningRecordRow]:
        """All matching records in id order, fetched in batches (safe on large tables)."""

    @abc.abstractmethod
    def count_records(
        self,
        *,
        target_id: int | None = None,
        workload_id: int | None = None,
        valid: bool | None = None,
        job_id: int | None = None,
        measured_within_secs: float | None = None,
    ) -> int:
        """Number of matching records (``valid=None``: valid and failed; ``job_id``: measured
        for that job; ``measured_within_secs``: stored in the last that many seconds, database
        clock)."""

    @abc.abstractmethod
    def list_records(
        self,
        *,
        target_id: int | None = None,
        workload_id: int | None = None,
        job_id: int | None = None,
        valid: bool | None = None,
        after_id: int = 0,
        limit: int = 100,
    ) -> list[TuningRecordRow]:
        """One page of matching records in id order: those with ``id > after_id``, at most
        ``limit`` (keyset pagination: pass the last id of a page to get the next)."""

    @abc.abstractmethod
    def job_history(self, job_id: int, *, after_id: int = 0, limit: int = 100_000) -> JobHistoryPage:
        """One page of a job's tuning history (see :class:`db.types.JobHistoryPage`): the job's
        records with ``id > after_id`` in id order, at most ``limit``, reduced to their counts and
        the records that improved their workload's best within the page.

        Read in one transaction from an index of the job's records, so polling it with the last
        page's ``last_id`` costs only the new records. A record improved in place later (the same
        schedule measured faster again) keeps its id: a reader that has passed it does not see
        the new time. An unknown job has an empty history.
        """

    @abc.abstractmethod
    def browse_workloads(
        self,
        *,
        target_id: int | None = None,
        model_id: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> tuple[list[WorkloadSummary], int]:
        """A page of workloads by id, without their module text, and the total count.

        ``target_id`` keeps workloads with records on that target (and counts only those
        records); ``model_id`` keeps the tasks of that model.
        """

    @abc.abstractmethod
    def tuned_workload_keys(
        self, target_id: int, keys: Sequence[str], *, exclude_job_id: int | None = None
    ) -> set[str]:
        """The workload keys among ``keys`` that a finished job task tuned for this target.

        A workload counts as tuned when a job task for it succeeded in a job of ``target_id``
        (``exclude_job_id`` leaves one job out, e.g. the job asking). Records alone do not make a
        workload tuned: a killed run leaves records but no finished task.
        """

    @abc.abstractmethod
    def stats(self) -> DatabaseStats:
        """Counts for ``tunehub db stats``."""

    # -- models ------------------------------------------------------------------------------
    @abc.abstractmethod
    def add_model(
        self, *, content_hash: str, format: str, filename: str, size: int, owner: str
    ) -> ModelRecord:
        """Record an uploaded model; uploading the same content twice returns the first row."""

    @abc.abstractmethod
    def get_model(self, model_id: int) -> ModelRecord | None:
        """The model with this id, or ``None``."""

    @abc.abstractmethod
    def list_models(self, *, owner: str | None = None) -> list[ModelRecord]:
        """Models, newest first."""

    @abc.abstractmethod
    def find_model(self, *, owner: str, content_hash: str) -> ModelRecord | None:
        """The model ``owner`` uploaded with this content, or ``None``."""

    @abc.abstractmethod
    def delete_model(self, model_id: int) -> ModelRecord:
        """Delete a model and its task list; its finished jobs keep their rows (``model_id``
        becomes ``None``).

        Raises:
            NotFoundError: no such model.
            ConflictError: a ``queued`` or ``running`` job still uses the model.
        """

    @abc.abstractmethod
    def model_content_in_use(self, content_hash: str) -> bool:
        """Whether any model row (of any owner) has this content (the file is still needed)."""

    @abc.abstractmethod
    def set_model_workloads(self, model_id: int, tasks: Sequence[ModelWorkload]) -> None:
        """Replace the list of tuning tasks of a model."""

    @abc.abstractmethod
    def model_workloads(self, model_id: int) -> list[ModelWorkload]:
        """The tuning tasks of a model."""

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
    ) -> Job:
        """Create a job in ``queued``."""

    @abc.abstractmethod
    def get_job(self, job_id: int) -> Job | None:
        """The job, or ``None``."""

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
    def claim_next_job(self, worker: str, *, target_id: int | None = None) -> Job | None:
        """Move the next queued job to ``running`` for ``worker``, or return ``None``.

        The next job is the highest ``priority``, then the oldest; ``target_id`` restricts the
        claim to jobs for that target (a worker claims only what it can measure). One atomic
        statement: concurrent claimers never get the same job, and on PostgreSQL they skip rows
        another claimer has locked instead of waiting for it.
        """

    @abc.abstractmethod
    def requeue_jobs(
        self, *, worker: str | None = None, stale_after_secs: float | None = None
    ) -> list[int]:
        """Move running jobs of dead workers back to ``queued``; return their ids.

        ``worker``: the jobs this worker holds (it is known to be gone, e.g. it just restarted
        or its process exited). ``stale_after_secs``: jobs whose worker has not heartbeated for
        that long (database clock) or is not registered. At least one must be given; both
        narrow the selection. Jobs without a worker (CLI runs) are never touched.
        """

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
    ) -> TaskLease | None:
        """Lease the next queued task of a running job for ``target_id`` to ``worker``.

        Order: job priority, job age, heaviest task (FLOPs x weight). The lease covers
        ``min(remaining, max_trials)`` trials (``max_trials`` may be a function of the task's
        trial budget) and expires ``lease_secs`` from now unless renewed. ``None`` when no task
        is waiting.
        """

    @abc.abstractmethod
    def claim_finalize_lease(
        self, worker: str, *, target_id: int, lease_secs: float
    ) -> TaskLease | None:
        """Lease the finalize step of a running job whose tasks are all finished, or ``None``."""

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
        after_id: int = 0,
        limit: int = 100,
    ) -> list[TaskLease]:
        """Leases in id order (keyset pages: ``id > after_id``), filtered as given."""

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
    ) -> LeaseBatchResult:
        """Count batch number ``batch`` (0, 1, ...) of a tune lease: ``trials`` on the lease, its
        task and its job, the task's best latency, and renew the lease. Counted at most once: a
        repeated batch number, or a lease no longer active, counts nothing (``counted`` false).
        The records themselves are committed separately (:meth:`commit_records`).

        Raises:
            NotFoundError: no such lease.
            ConflictError: ``batch`` skips ahead of the next expected number.
        """

    @abc.abstractmethod
    def finish_lease(
        self, lease_id: int, outcome: str, *, error: str | None = None, max_attempts: int = 3
    ) -> TaskLease:
        """End an active lease with ``outcome`` (``done``, ``returned``, ``failed``,
        ``cancelled``) and move its work on: a task is ``succeeded`` once its budget is counted
        (or a ``done`` lease measured fewer trials than leased: the search ran out of
        candidates), ``failed`` after ``max_attempts`` expired/failed leases, else ``queued``
        again; a failed finalize lease fails its job.

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
    def count_open_jobs(self, *, target_id: int) -> int:
        """Jobs for ``target_id`` still ``queued`` or ``running``."""

    # -- workers, artifacts, cost models, tokens --------------------------------------------
    @abc.abstractmethod
    def register_worker(
        self, name: str, *, fingerprint_json: str = "{}", target_id: int | None = None
    ) -> Worker:
        """Insert or update the worker called ``name`` and stamp a heartbeat."""

    @abc.abstractmethod
    def heartbeat(self, worker_id: int, *, status: str | None = None) -> Worker:
        """Stamp ``last_heartbeat`` with the database clock (and set ``status`` if given)."""

    @abc.abstractmethod
    def list_workers(self) -> list[Worker]:
        """All workers, by id."""

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

    @abc.abstractmethod
    def save_cost_model(
        self, *, target_id: int, blob: bytes, feature_version: str, tvm_version: str, n_samples: int
    ) -> CostModelBlob:
        """Store a trained cost model (a new row each time)."""

    @abc.abstractmethod
    def latest_cost_model(
        self, target_id: int, *, feature_version: str | None = None
    ) -> CostModelBlob | None:
        """The newest cost model for a target (and feature version), or ``None``."""

    @abc.abstractmethod
    def add_api_token(self, *, name: str, token_hash: str, kind: str) -> ApiToken:
        """Store a token's hash (never the token)."""

    @abc.abstractmethod
    def find_api_token(self, token_hash: str) -> ApiToken | None:
        """The non-revoked token with this hash, or ``None``."""

    @abc.abstractmethod
    def revoke_api_token(self, token_id: int) -> None:
        """Revoke a token."""

    @abc.abstractmethod
    def list_api_tokens(self) -> list[ApiToken]:
        """All tokens, revoked ones too, by id."""
