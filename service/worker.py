"""A tuning worker: lease work from the coordinator, tune or finalize, upload, heartbeat.

``tunehub worker --server URL --token T`` talks to a TuneHub server over HTTP
(:class:`service.worker_client.HttpClient`); ``tunehub worker [--db URL]`` (and the embedded
workers of ``tunehub serve``) reach the database directly (:class:`DirectClient`). The loop is the
same (the coordinator's rules are in :mod:`tuner.jobs.coordinator`):

1. Register the worker's name, hardware fingerprint and target (an earlier process of the same
   name is gone: what it held goes back to the queue).
2. Ask for a lease. A **tune** lease is trial batches of one or several tasks of a job: the
   worker fetches each task's context (the server's best records for the task, the schedules it
   already holds, the task's faster siblings' schedules), runs the one search over them
   (:func:`tuner.engine.task_tuning.tune_workloads`, the same :func:`tuner.engine.search.run_search`
   as ``tunehub tune``, whose gradient task scheduler spreads the trials over the tasks; measured
   locally or through an RPC tracker) and uploads every measured batch; ending the lease, it
   reports what the search's features did. A **finalize** lease: fetch the model, compile it
   with the best records, verify it against the reference framework and upload the artifact
   (:func:`tuner.final_build.finalize.publish_tuned`). A **preview** lease: the same with no records
   (library peers and TVM's default schedules,
   :func:`tuner.final_build.finalize.publish_zero_trial`), uploaded as the job's preview while it
   tunes.
3. A heartbeat thread stamps the worker every ``heartbeat_secs``, which keeps its lease alive;
   when the coordinator no longer lists the lease (expired, the job cancelled), or an upload
   answers that it should stop, tuning stops at the next batch.
4. No work: wait ``worker_poll_secs`` and ask again; with ``once`` (CI), exit when no job of this
   target is queued or running any more.

Shutdown: SIGTERM/SIGINT while idle ends the loop; while busy, the worker returns its lease at
once (the batches already uploaded stay counted; the next lease resumes from their records),
marks itself offline and exits. A server that cannot be reached is retried with backoff.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.errors import ModelError, VerificationError
from service.files import FileStore
from service.settings import Settings
from service.worker_client import (
    DirectClient,
    HttpClient,
    ServerUnavailable,
    WorkClient,
    WorkerApiError,
)
from tuner.engine.cost_models import transfer_choice
from tuner.jobs.protocol import LeasedTask, TargetInfo, WorkOffer

logger = logging.getLogger("tunehub.worker")

#: Records a tune lease starts from: the evolutionary search seeds its population with the best
#: (``init_measured_ratio`` x population) and the cost model learns from all of them.
SEED_RECORDS = 256


def default_worker_name(index: int = 0) -> str:
    return f"{socket.gethostname()}-{index}"


def search_config(settings: Settings):
    from tuner.engine.search import SearchConfig  # noqa: PLC0415 - TVM only where a search runs

    return SearchConfig.of_population(settings.search_population)


@dataclass
class _Current:
    offer: WorkOffer
    lost: bool = False


class Worker:
    """The worker loop over a :class:`WorkClient` (see the module docstring)."""

    #: Tasks whose transferred cost model (and guard state) a worker keeps between leases.
    TASK_MODELS = 16

    def __init__(
        self,
        settings: Settings,
        client: WorkClient,
        *,
        name: str,
        target,
        rpc=None,
        once: bool = False,
        max_leases: int | None = None,
    ) -> None:
        self.settings = settings
        self.client = client
        self.name = name
        self.target = target
        self.rpc = rpc
        self.once = once
        self.max_leases = max_leases
        self.stop = threading.Event()
        self.current: _Current | None = None
        # Heartbeats go one at a time, and none after "offline": the heartbeat thread's "idle"
        # in flight must not reach the server after the exit's "offline" and undo it.
        self._beat_lock = threading.Lock()
        self._gone_offline = False
        self.leases_done = 0
        self._cost_model: tuple[int, object] | None = None  # (stored id, TrainedModel)
        self._task_models: dict[tuple[int, int | None], object] = {}  # (job, task) -> model
        # The last model prepared (_prepared), its key and the folder its file was fetched into.
        self._last_prepared: tuple[tuple, object, tempfile.TemporaryDirectory] | None = None
        self._next_retrain = time.monotonic() + settings.cost_model_retrain_secs

    @property
    def target_info(self) -> TargetInfo:
        return TargetInfo.of(self.target)

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> int:
        """Lease and run work until stopped (or, with ``once``, until no job of this target is
        open); return the number of leases worked on."""
        self.client.register(self.name, self.target_info, self.target.fingerprint_json)
        via_rpc = f", measuring through RPC key {self.rpc.key}" if self.rpc else ""
        logger.info(
            "worker %s registered for %s (target %s)%s",
            self.name,
            self.target.describe(),
            self.target.key,
            via_rpc,
        )
        beat = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        beat.start()
        try:
            while not self.stop.is_set():
                try:
                    offer, pending = self.client.lease(self.name)
                except ServerUnavailable as err:
                    if self.once:
                        raise
                    logger.warning("no answer from the coordinator: %s", err)
                    self.stop.wait(self.settings.worker_poll_secs * 5)
                    continue
                if offer is None:
                    if self.once and pending == 0:
                        logger.info("no open job for target %s: done", self.target.key)
                        break
                    self._retrain_when_idle()
                    self.stop.wait(self.settings.worker_poll_secs)
                    continue
                self.work(offer)
                self.leases_done += 1
                if self.max_leases is not None and self.leases_done >= self.max_leases:
                    break
        finally:
            self.stop.set()
            self._forget_prepared()
            with contextlib.suppress(Exception):
                self._beat("offline")
        return self.leases_done

    def _beat(self, status: str) -> set[int]:
        """Send one heartbeat (serialized with every other); the ids of the worker's active
        leases. After ``offline`` has been sent, nothing more is sent and the set is empty."""
        with self._beat_lock:
            if self._gone_offline:
                return set()
            active = self.client.heartbeat(self.name, status)
            self._gone_offline = status == "offline"
            return active

    def _heartbeat_loop(self) -> None:
        while not self.stop.wait(self.settings.heartbeat_secs):
            current = self.current
            try:
                active = self._beat("busy" if current else "idle")
            except (ServerUnavailable, WorkerApiError) as err:
                logger.warning("heartbeat failed: %s", err)
                if isinstance(err, WorkerApiError) and err.status in (403, 409):
                    # Another process registered this name since: it holds the name now.
                    logger.error("worker %s stops: %s", self.name, err.detail)
                    self.stop.set()
                    if current is not None:
                        current.lost = True
                    return
                continue
            lease_gone = current is not None and current.offer.lease_id not in active
            if lease_gone and current is self.current:
                if not current.lost:
                    logger.warning(
                        "lease %s is no longer ours (expired or its job ended)",
                        current.offer.lease_id,
                    )
                current.lost = True

    # -- one lease -----------------------------------------------------------------------------
    def work(self, offer: WorkOffer) -> str:
        """Run one lease to its end; return how it ended (``done``, ``failed``, ``cancelled``,
        ``returned`` or ``lost``)."""
        self.current = current = _Current(offer)
        names = ", ".join(t.workload_name for t in leased_tasks(offer))
        what = f" task(s) {names} ({offer.trials} trials)" if offer.kind == "tune" else ""
        logger.info("lease %s: %s job %s%s", offer.lease_id, offer.kind, offer.job_id, what)
        try:
            if offer.kind == "tune":
                return self._tune(current)
            if offer.kind == "preview":
                return self._preview(current)
            return self._finalize(current)
        except WorkerApiError as err:
            # A refusal (a 4xx: a refused upload or artifact) ends the lease failed, so that it
            # is not offered to this worker again (a worker's lease is offered again while it
            # is active); a lease already gone answers 409 and stays lost.
            logger.warning("lease %s refused by the coordinator: %s", offer.lease_id, err.detail)
            with contextlib.suppress(Exception):
                return self._end(offer, "failed", f"refused by the server: {err.detail}")
            return "lost"
        except ServerUnavailable as err:
            logger.warning(
                "lease %s abandoned, the coordinator is unreachable: %s", offer.lease_id, err
            )
            return "lost"
        except Exception as err:  # noqa: BLE001 - a bug or a broken lease must not stop the worker
            logger.exception("lease %s failed", offer.lease_id)
            with contextlib.suppress(Exception):
                return self._end(offer, "failed", f"{type(err).__name__}: {err}")
            return "lost"
        finally:
            self.current = None

    def _end(self, offer: WorkOffer, outcome: str, error: str | None = None, search=None) -> str:
        try:
            end = self.client.finish(offer.lease_id, outcome, error, search)
        except WorkerApiError as err:  # expired meanwhile: its work is already requeued
            logger.warning(
                "lease %s could not be ended %s: %s", offer.lease_id, outcome, err.detail
            )
            return "lost"
        if end.job_status == "cancelled":
            logger.info("job %s cancelled", offer.job_id)
            return "cancelled"
        return outcome

    def _tune(self, current: _Current) -> str:
        from tuner.engine.task_tuning import LeasedWorkload, tune_workloads  # noqa: PLC0415 - TVM
        from tuner.final_build.finalize import tvm_module  # noqa: PLC0415 - TVM only where a lease is worked

        offer = current.offer
        tasks = leased_tasks(offer)
        contexts = [
            self.client.context(offer.lease_id, SEED_RECORDS, task_id=task.task_id or None)
            for task in tasks
        ]
        workloads = [
            LeasedWorkload(tvm_module(task.mod_json), task.workload_name, context)
            for task, context in zip(tasks, contexts, strict=True)
        ]
        cost_model = self._transferred_cost_model(offer)
        batch_no = 0
        verdict: dict[str, str | None] = {"reason": None}

        def on_batch(batch) -> bool:
            nonlocal batch_no
            task_id = tasks[batch.task_index].task_id or None
            try:
                ack = self.client.upload(
                    offer.lease_id, batch_no, list(batch.records), task_id=task_id
                )
            except (ServerUnavailable, WorkerApiError) as err:
                logger.warning(
                    "lease %s: upload of batch %d failed: %s", offer.lease_id, batch_no, err
                )
                verdict["reason"] = "lost"
                if isinstance(err, WorkerApiError):  # refused: end the lease, see work()
                    verdict["refused"] = f"batch {batch_no} refused by the server: {err.detail}"
                return False
            batch_no += 1
            logger.info(
                "lease %s: batch %d uploaded (%s, %d trials, best %s)",
                offer.lease_id,
                batch_no,
                tasks[batch.task_index].workload_name,
                len(batch.records),
                "-" if batch.best_secs is None else f"{batch.best_secs * 1e3:.4f} ms",
            )
            if ack.job_status == "cancelled":
                verdict["reason"] = "cancelled"
            elif not ack.keep_going or current.lost:
                verdict["reason"] = "lost"
            elif self.stop.is_set():
                verdict["reason"] = "returned"
            return verdict["reason"] is None

        try:
            tuned = tune_workloads(
                workloads,
                self.job_target(offer),
                trials=offer.trials,
                batch_size=offer.batch_size,
                on_batch=on_batch,
                search=search_config(self.settings),
                rpc=self.rpc,
                seed=self.settings.search_seed,
                cost_model=cost_model,
            )
        except Exception as err:  # noqa: BLE001 - the lease fails with the reason; the loop goes on
            logger.exception("lease %s failed", offer.lease_id)
            return self._end(offer, "failed", f"{type(err).__name__}: {err}")
        reason = verdict["reason"]
        if verdict.get("refused"):
            return self._end(offer, "failed", verdict["refused"], search=tuned.report)
        if reason == "cancelled":
            return self._end(offer, "cancelled", search=tuned.report)
        if reason == "lost":
            return "lost"
        if reason == "returned":
            return self._end(offer, "returned", search=tuned.report)
        logger.info(
            "lease %s: %d of %d trials measured%s",
            offer.lease_id,
            tuned.trials,
            offer.trials,
            "" if tuned.trials >= offer.trials else " (the search ran out of candidates)",
        )
        return self._end(offer, "done", search=tuned.report)

    def _retrain_when_idle(self) -> None:
        """At most every ``cost_model_retrain_secs``: retrain the target's transferred cost
        model when enough new records arrived (:func:`cost_model.store.maybe_retrain`)."""
        now = time.monotonic()
        if now < self._next_retrain:
            return
        self._next_retrain = now + self.settings.cost_model_retrain_secs
        try:
            if self.client.retrain_cost_model(self.target):
                logger.info("cost model of %s retrained", self.target.key)
        except Exception:  # noqa: BLE001 - retraining is an optimization; the worker goes on
            logger.exception("cost model retraining failed")

    def _transferred_cost_model(self, offer: WorkOffer):
        """The transferred cost model for a tune lease (the target's newest stored model,
        downloaded once per model id), or ``None`` for MetaSchedule's cold XGBModel.

        The model object, with its negative-transfer guard state, is kept for the task across
        the leases of it that this worker gets (:attr:`TASK_MODELS` tasks at most), so a task
        whose family the guard moved to the cold model stays there."""
        import tvm  # noqa: PLC0415 - TVM only where a lease is worked

        from cost_model.store import TrainedModel  # noqa: PLC0415 - TVM and xgboost

        try:
            found = self.client.cost_model(offer.target.key, tvm.__version__)
        except (ServerUnavailable, WorkerApiError) as err:
            logger.warning("no transferred cost model (using MetaSchedule's cold one): %s", err)
            return None
        if found is None:
            return None
        if self._cost_model is None or self._cost_model[0] != found[0]:
            self._cost_model = (found[0], TrainedModel.from_bytes(found[1], model_id=found[0]))
            self._task_models.clear()
            logger.info(
                "transferred cost model %d (%d records)", found[0], self._cost_model[1].n_samples
            )
        key = (offer.job_id, offer.task_id)
        model = self._task_models.pop(key, None) or transfer_choice(self._cost_model[1]).model
        self._task_models[key] = model  # most recently used last
        while len(self._task_models) > self.TASK_MODELS:
            self._task_models.pop(next(iter(self._task_models)))
        return model

    def job_target(self, offer: WorkOffer) -> Any:
        """The target of ``offer``'s job as this worker measures it: its own, or its own with
        the job's weight format (:func:`tuner.jobs.coordinator.served_targets` offers those too)."""
        if offer.target.key == self.target.key:
            return self.target
        variant = self.target.with_weights(offer.target.spec().compile_options.weights)
        if variant.key != offer.target.key:
            raise ValueError(f"lease {offer.lease_id} is for target {offer.target.key}, not ours")
        return variant

    def _prepared(self, offer: WorkOffer) -> Any:
        """The job's model, downloaded and prepared for this worker's target as its upload was
        (format, buckets); a ``str`` (why not) when it cannot be.

        The worker keeps the last model it prepared, with its downloaded file, until it prepares
        another: a job's preview and finalize leases on one worker (the embedded worker's case)
        download and prepare it once. A prepared model is the same for the same file, target and
        buckets (``offer``'s model hash, target key, format and buckets are the key)."""
        from compiler.prepare import prepare_model  # noqa: PLC0415 - TVM only where a lease is worked
        from compiler.shapes.buckets import bucket_values  # noqa: PLC0415 - with the compiler

        key = (offer.model_sha256, offer.target.key, offer.model_format, offer.model_buckets)
        if self._last_prepared is not None and offer.model_sha256 and self._last_prepared[0] == key:
            logger.info("lease %s: the model prepared for the last lease", offer.lease_id)
            return self._last_prepared[1]
        self._forget_prepared()
        folder = tempfile.TemporaryDirectory(prefix="tunehub-model-")
        try:
            path = self.client.model_file(offer, Path(folder.name))
            prepared = prepare_model(
                path,
                self.job_target(offer),
                limits=self.settings.model_limits(),
                expected_format=offer.model_format,  # type: ignore[arg-type]
                buckets=bucket_values(offer.model_buckets),
            )
        except WorkerApiError as err:
            folder.cleanup()
            return err.detail
        except ModelError as err:
            folder.cleanup()
            return f"model refused: {err}"
        except BaseException:
            folder.cleanup()
            raise
        self._last_prepared = (key, prepared, folder)
        return prepared

    def _forget_prepared(self) -> None:
        """Drop the kept prepared model and delete its downloaded file."""
        if self._last_prepared is not None:
            self._last_prepared[2].cleanup()
            self._last_prepared = None

    def _build_and_publish(self, current: _Current, build: Callable[[Path], Any]) -> str:
        """Run ``build(out_dir)`` (it writes a verified artifact) in a staging folder and upload
        what it wrote for ``current``'s lease; end the lease ``failed`` with the error when the
        build raises."""
        offer = current.offer
        staged = self.client.staging_dir()
        out_dir = staged / "artifact"
        try:
            build(out_dir)
        except VerificationError as err:
            _rmtree(staged)
            return self._end(offer, "failed", str(err))
        except Exception as err:  # noqa: BLE001
            logger.exception("%s of job %s failed", offer.kind, offer.job_id)
            _rmtree(staged)
            return self._end(offer, "failed", f"{type(err).__name__}: {err}")
        if current.lost or self.stop.is_set():
            _rmtree(staged)
            return "lost" if current.lost else self._end(offer, "returned")
        try:
            end = self.client.publish(offer.lease_id, out_dir)
        finally:
            _rmtree(staged)
        logger.info("job %s %s: %s artifact published", offer.job_id, end.job_status, offer.kind)
        return "done"

    def _finalize(self, current: _Current) -> str:
        from tuner.final_build.finalize import (  # noqa: PLC0415 - TVM
            choose_winners,
            finalize_outcomes,
            publish_tuned,
        )
        from tuner.final_build.remeasure import RemeasureConfig  # noqa: PLC0415 - TVM

        offer = current.offer
        prepared = self._prepared(offer)
        if isinstance(prepared, str):
            return self._end(offer, "failed", prepared)
        try:
            remeasure = RemeasureConfig.from_env()
        except ValueError as err:  # a bad TUNEHUB_REMEASURE_* setting: say so, keep serving
            return self._end(offer, "failed", str(err))
        best = {
            task.key: self.client.records(task.key, offer.target.key, max(1, remeasure.top))
            for task in prepared.partition.tasks
        }

        def build(out_dir: Path) -> None:
            # The top records re-measured side by side; the build uses each task's winner, and
            # the manifest carries the re-measurements for the server to store.
            winners = choose_winners(prepared, best, remeasure, rpc=self.rpc)
            outcomes = winners.outcomes(finalize_outcomes(prepared, offer.tasks, best))
            publish_tuned(
                prepared,
                winners.database,
                out_dir,
                job_id=offer.job_id,
                trials_measured=offer.job_trials_done,
                outcomes=outcomes,
                remeasured=winners.to_json(),
                peers=winners.peers,
            )

        return self._build_and_publish(current, build)

    def _preview(self, current: _Current) -> str:
        """The job's zero-trial library (:func:`tuner.final_build.finalize.publish_zero_trial`),
        verified and uploaded as its preview while other leases tune it."""
        from tuner.final_build.finalize import publish_zero_trial  # noqa: PLC0415 - TVM

        offer = current.offer
        prepared = self._prepared(offer)
        if isinstance(prepared, str):
            return self._end(offer, "failed", prepared)
        return self._build_and_publish(
            current, lambda out_dir: publish_zero_trial(prepared, out_dir, job_id=offer.job_id)
        )

    # -- shutdown ------------------------------------------------------------------------------
    def shutdown(self, signum: int) -> None:
        """On SIGTERM/SIGINT: stop; give the current lease back (its uploaded batches stay
        counted) and go offline. Called from the main thread while the loop runs in another."""
        self.stop.set()
        current = self.current
        if current is None:
            return
        with contextlib.suppress(Exception):
            self.client.finish(
                current.offer.lease_id, "returned", f"worker stopped by signal {signum}"
            )
            logger.warning("signal %s: lease %s returned", signum, current.offer.lease_id)
        with contextlib.suppress(Exception):
            self._beat("offline")
        _kill_children()
        os._exit(128 + signum)


def leased_tasks(offer: WorkOffer) -> tuple[LeasedTask, ...]:
    """The tasks of tune lease ``offer``: its ``leased_tasks``, or the one task an older server
    describes in the offer's own fields."""
    if offer.leased_tasks or offer.kind != "tune":
        return offer.leased_tasks
    return (
        LeasedTask(
            task_id=offer.task_id or 0,
            workload_id=offer.workload_id or 0,
            workload_key=offer.workload_key or "",
            workload_name=offer.workload_name or "task",
            mod_json=offer.mod_json or "",
        ),
    )


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _kill_children() -> None:
    """MetaSchedule's builder/runner pools are child processes: do not leave them behind."""
    try:
        import psutil  # noqa: PLC0415 - without psutil the cleanup is skipped, not the exit
    except ImportError:  # pragma: no cover - psutil is a dependency
        return
    with contextlib.suppress(Exception):
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(Exception):
                child.kill()


def run_in_thread(worker: Worker) -> int:
    """Run ``worker.run`` in a thread and keep the main thread free for signals: SIGTERM is
    handled at once even while MetaSchedule runs C++ code for seconds."""
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["done"] = worker.run()
        except BaseException as err:  # noqa: BLE001 - re-raised in the main thread
            outcome["error"] = err

    def handle(signum, _frame) -> None:
        worker.shutdown(signum)

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    thread = threading.Thread(target=target, name="worker-loop")
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.5)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return int(outcome.get("done", 0))  # type: ignore[arg-type]


def watch_parent(interval: float = 1.0) -> threading.Thread | None:
    """When ``TUNEHUB_PARENT_PID`` is set (an embedded worker of ``tunehub serve``): a daemon
    thread that sends this process SIGTERM as soon as its parent is gone (it was re-parented),
    so a killed server never leaves its workers running. Also sets ``PR_SET_PDEATHSIG``."""
    parent = os.environ.get("TUNEHUB_PARENT_PID")
    if not parent or not parent.isdigit():
        return None
    from service.serve import die_with_parent  # noqa: PLC0415

    die_with_parent()
    parent_pid = int(parent)

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                logger.warning("the server (pid %s) is gone: this worker stops", parent_pid)
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
                os._exit(1)  # the loop did not stop in time
            time.sleep(interval)

    thread = threading.Thread(target=watch, name="parent-watchdog", daemon=True)
    thread.start()
    return thread


def run_worker(
    settings: Settings,
    *,
    name: str | None = None,
    server: str | None = None,
    token: str | None = None,
    target_name: str = "cpu",
    rpc=None,
    once: bool = False,
    max_leases: int | None = None,
) -> int:
    """Build the client (HTTP with ``server``, else the database of ``settings``), check the
    target, and run the loop; return the number of leases worked on."""
    watch_parent()
    target = resolve_worker_target(target_name, rpc)
    name = name or default_worker_name()
    if server is not None:
        client: WorkClient = HttpClient(server, token or "", retry_secs=settings.worker_retry_secs)
        storage = None
    else:
        from service.app import open_service_storage  # noqa: PLC0415 - only --db needs the server's stack

        storage = open_service_storage(settings)
        files = FileStore(settings.resolved_storage_dir()).ensure()
        client = DirectClient(storage, settings, files, retry_secs=settings.worker_retry_secs)
    try:
        worker = Worker(
            settings, client, name=name, target=target, rpc=rpc, once=once, max_leases=max_leases
        )
        return run_in_thread(worker)
    finally:
        client.close()
        if storage is not None:
            storage.close()


def resolve_worker_target(name: str, rpc=None):
    """The worker's :class:`compiler.target.TargetSpec`: ``cpu`` is this machine's CPU (or, with
    an RPC tracker, the devices behind it, assumed identical to this machine: the tracker does
    not describe them), ``cuda`` its GPU; a 16-hex key must be one of those targets. Raises
    ``ValueError`` otherwise."""
    from compiler.target import resolve_target  # noqa: PLC0415 - TVM only where a worker starts

    if len(name) == 16 and all(c in "0123456789abcdef" for c in name):
        local = []
        for kind in ("cpu", "cuda"):
            try:
                spec = resolve_target(kind)
            except Exception:  # noqa: BLE001 - no GPU here: only the CPU can match
                continue
            if spec.key == name:
                return spec
            local.append(f"{spec.key} ({spec.describe()})")
        raise ValueError(
            f"--target {name} is not a target of this machine ({', '.join(local)}): "
            "a worker measures only on the hardware it runs on"
        )
    try:
        return resolve_target(name)
    except Exception as err:  # noqa: BLE001 - ModelError for an unknown name, TVM's for a broken device
        raise ValueError(str(err)) from None
