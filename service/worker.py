"""A worker: claim a queued job, prepare its model from the file store, run it, heartbeat.

The loop (``tunehub worker``; ``tunehub serve`` starts one as a subprocess on the embedded
default) talks to the database only through the storage contract, so the same steps can later
sit behind HTTP for remote workers:

1. ``register_worker`` (name, hardware fingerprint, target), then ``requeue_jobs(worker=name)``:
   anything this name held before a restart goes back to the queue.
2. Idle: heartbeat, requeue jobs of workers silent for ``stale_after_secs``, claim the next job
   for this worker's target (``claim_next_job``: priority, then age; ``SKIP LOCKED`` on
   PostgreSQL), sleep ``worker_poll_secs`` when there is none.
3. Busy: a heartbeat thread stamps ``busy`` every ``heartbeat_secs`` while
   :func:`tuner.job.run_job` tunes, compiles, verifies and publishes to
   ``<storage>/artifacts/job-<id>``. A job that was claimed before (its worker died) resumes from
   its stored records.

Cancellation: the API moves the job to ``cancelled`` directly. :class:`JobWatcher`, a progress
listener, reads the job after every measured batch and raises :class:`JobCancelled` when the job is
no longer running for this worker. MetaSchedule's FFI turns that into a ``RuntimeError`` that
aborts tuning; ``run_job``'s own attempt to mark the job failed then loses the compare-and-set
(``cancelled`` is final), and the worker removes whatever artifact directory was published.

Shutdown: SIGTERM/SIGINT while idle ends the loop; while busy, the worker requeues its job, marks
itself offline and exits at once (the job resumes on the next claim from its stored records).
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import threading

import db
from db import JobStatus
from service.files import FileStore
from service.settings import Settings

logger = logging.getLogger("tunehub.worker")


class JobCancelled(BaseException):
    """Raised from a progress listener to stop tuning (a BaseException: the tuner's progress
    callback swallows ``Exception`` from listeners)."""


class JobWatcher:
    """Progress listener: stop tuning when the job was cancelled or taken from this worker."""

    def __init__(self, storage: db.TuningStorage, job_id: int, worker: str) -> None:
        self.storage = storage
        self.job_id = job_id
        self.worker = worker

    def on_batch(self, _update) -> None:
        try:
            job = self.storage.get_job(self.job_id)
        except db.StorageError:
            return  # a transient database error must not stop the job
        if job is None or job.status != JobStatus.RUNNING or job.worker != self.worker:
            state = "gone" if job is None else job.status
            raise JobCancelled(f"job {self.job_id} is {state}; tuning stopped")


def default_worker_name(index: int = 0) -> str:
    return f"{socket.gethostname()}-{index}"


def search_config(settings: Settings):
    from tuner.search import SearchConfig

    population = settings.search_population
    return SearchConfig(population_size=population, init_min_unmeasured=min(50, population // 4))


class Worker:
    def __init__(
        self,
        settings: Settings,
        storage: db.TuningStorage,
        *,
        name: str,
        target=None,
    ) -> None:
        from compiler.target import cpu_target

        self.settings = settings
        self.storage = storage
        self.name = name
        self.files = FileStore(settings.resolved_storage_dir()).ensure()
        self.target = target or cpu_target()
        self.target_row = storage.ensure_target(self.target)
        self.stop = threading.Event()
        self.current_job: int | None = None
        self.worker_id: int | None = None

    # -- the loop ------------------------------------------------------------------------------
    def register(self) -> None:
        row = self.storage.register_worker(
            self.name,
            fingerprint_json=self.target.fingerprint_json,
            target_id=self.target_row.id,
        )
        self.worker_id = row.id
        released = self.storage.requeue_jobs(worker=self.name)
        if released:
            logger.info("requeued jobs %s left by an earlier run of %s", released, self.name)

    def run(self, *, max_jobs: int | None = None, exit_when_idle: bool = False) -> int:
        """Claim and run jobs until stopped; return how many jobs were run."""
        self.register()
        done = 0
        while not self.stop.is_set():
            try:
                self.storage.heartbeat(self.worker_id, status="idle")
                reaped = self.storage.requeue_jobs(stale_after_secs=self.settings.stale_after_secs)
                if reaped:
                    logger.warning("requeued jobs %s of workers without heartbeat", reaped)
                job = self.storage.claim_next_job(self.name, target_id=self.target_row.id)
            except db.StorageUnavailableError as err:
                logger.warning("database unavailable, retrying: %s", err)
                self.stop.wait(self.settings.worker_poll_secs * 5)
                continue
            if job is None:
                if exit_when_idle:
                    break
                self.stop.wait(self.settings.worker_poll_secs)
                continue
            self.run_job(job)
            done += 1
            if max_jobs is not None and done >= max_jobs:
                break
        with contextlib.suppress(db.StorageError):
            self.storage.heartbeat(self.worker_id, status="offline")
        return done

    # -- one job -------------------------------------------------------------------------------
    def _fail(self, job: db.Job, message: str) -> None:
        logger.error("job %s failed: %s", job.id, message)
        with contextlib.suppress(db.InvalidTransitionError):
            self.storage.transition_job(
                job.id, JobStatus.FAILED, expected=JobStatus.RUNNING, error=message
            )

    def _heartbeat_loop(self, done: threading.Event) -> None:
        while not done.wait(self.settings.heartbeat_secs):
            try:
                self.storage.heartbeat(self.worker_id, status="busy")
            except db.StorageError as err:
                logger.warning("heartbeat failed: %s", err)

    def run_job(self, job: db.Job) -> str:
        """Run one claimed job to its end; return its final status."""
        from compiler.errors import ModelError
        from compiler.prepare import prepare_model
        from tuner.job import run_job

        self.current_job = job.id
        done = threading.Event()
        beat = threading.Thread(target=self._heartbeat_loop, args=(done,), daemon=True)
        beat.start()
        out_dir = self.files.artifact_dir(job.id)
        try:
            self.storage.heartbeat(self.worker_id, status="busy")
            model = self.storage.get_model(job.model_id) if job.model_id is not None else None
            if model is None:
                self._fail(job, "the job's model was deleted")
                return JobStatus.FAILED
            path = self.files.model_path(model.content_hash)
            if not path.is_file():
                self._fail(job, f"the model file of model {model.id} is missing from the store")
                return JobStatus.FAILED
            try:
                prepared = prepare_model(
                    path, self.target, limits=self.settings.model_limits(),
                    expected_format=model.format,  # type: ignore[arg-type]
                )
            except ModelError as err:
                self._fail(job, f"model refused: {err}")
                return JobStatus.FAILED
            current = self.storage.get_job(job.id)
            if current is None or current.status != JobStatus.RUNNING or current.worker != self.name:
                logger.info("job %s was %s before tuning started", job.id,
                            "deleted" if current is None else current.status)
                return JobStatus.CANCELLED if current is not None else JobStatus.FAILED
            resumed = self.storage.count_records(job_id=job.id) > 0
            logger.info("job %s: %s (%s), %d trials%s", job.id, model.filename,
                        self.target.describe(), job.trial_budget, ", resumed" if resumed else "")
            try:
                run_job(
                    self.storage, prepared, job, resumed=resumed, output_dir=out_dir,
                    search=search_config(self.settings),
                    listeners=[JobWatcher(self.storage, job.id, self.name)],
                    force=True, seed=self.settings.search_seed,
                )
            except BaseException as err:  # noqa: BLE001 - the job's state says what happened
                current = self.storage.get_job(job.id)
                if current is not None and current.status == JobStatus.CANCELLED:
                    logger.info("job %s cancelled", job.id)
                    shutil.rmtree(out_dir, ignore_errors=True)
                    return JobStatus.CANCELLED
                if isinstance(err, KeyboardInterrupt):
                    raise
                if current is not None and current.status == JobStatus.RUNNING:
                    self._fail(job, f"{type(err).__name__}: {err}")
                logger.error("job %s failed: %s: %s", job.id, type(err).__name__, err)
                return current.status if current is not None else JobStatus.FAILED
            logger.info("job %s succeeded: %s", job.id, out_dir)
            return JobStatus.SUCCEEDED
        finally:
            done.set()
            beat.join(timeout=5)
            self.current_job = None

    # -- shutdown ------------------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        def handle(signum, _frame) -> None:
            self.stop.set()
            if self.current_job is None:
                return
            # Busy: give the job back and leave now (tuning cannot be interrupted cleanly).
            with contextlib.suppress(Exception):
                self.storage.requeue_jobs(worker=self.name)
                self.storage.heartbeat(self.worker_id, status="offline")
            logger.warning("signal %s: job %s requeued, exiting", signum, self.current_job)
            _kill_children()
            os._exit(128 + signum)

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)


def _kill_children() -> None:
    """MetaSchedule's builder/runner pools are child processes: do not leave them behind."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency
        return
    with contextlib.suppress(Exception):
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(Exception):
                child.kill()


def run_worker(
    settings: Settings,
    *,
    name: str | None = None,
    max_jobs: int | None = None,
    exit_when_idle: bool = False,
    storage: db.TuningStorage | None = None,
    target=None,
) -> int:
    """Open the storage (the embedded default is created on first use) and run the loop.

    ``target`` (a :class:`compiler.target.TargetSpec`, default this machine's CPU) is the target
    whose jobs this worker claims."""
    from service.app import open_service_storage

    own = storage is None
    storage = storage or open_service_storage(settings)
    try:
        worker = Worker(settings, storage, name=name or default_worker_name(), target=target)
        worker.install_signal_handlers()
        return worker.run(max_jobs=max_jobs, exit_when_idle=exit_when_idle)
    finally:
        if own:
            storage.close()
