"""``tunehub serve``: the API (uvicorn) plus embedded worker processes, on one machine.

On the embedded default (SQLite in ``$TUNEHUB_HOME``) a fresh machine needs nothing else: the
database is created, a local user token is made (:func:`service.auth.ensure_local_token`), and
``workers`` worker subprocesses (``tunehub worker``, one by default) claim jobs through the same
storage calls remote workers use. Workers run in their own process groups with their logs in
``$TUNEHUB_HOME/logs/worker-N.log``, at a lower CPU priority (``worker_nice``, so requests are
served first while they tune); one that dies is restarted and its job requeued; on
shutdown each gets SIGTERM (it requeues a running job itself), then SIGKILL after a grace period,
and whatever it still held is requeued.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import db
from service.auth import ensure_local_token
from service.settings import Settings

logger = logging.getLogger("tunehub.serve")
STOP_GRACE_SECS = 15.0
RESTART_DELAY_SECS = 5.0


@dataclass
class _Proc:
    name: str
    log: Path
    popen: subprocess.Popen | None = None
    restarts: int = 0


@dataclass
class EmbeddedWorkers:
    """Worker subprocesses supervised by the serving process."""

    settings: Settings
    count: int
    database_url: str
    procs: list[_Proc] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stopping = threading.Event()
        self._monitor: threading.Thread | None = None
        logs = self.settings.home_dir() / "logs"
        host = socket.gethostname()
        self.procs = [
            _Proc(name=f"{host}-embedded-{i}", log=logs / f"worker-{i}.log")
            for i in range(self.count)
        ]

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["TUNEHUB_HOME"] = str(self.settings.home_dir())
        env["TUNEHUB_STORAGE_DIR"] = str(self.settings.resolved_storage_dir())
        env["TUNEHUB_DATABASE_URL"] = self.database_url
        env["TUNEHUB_SEARCH_POPULATION"] = str(self.settings.search_population)
        if self.settings.search_seed is not None:
            env["TUNEHUB_SEARCH_SEED"] = str(self.settings.search_seed)
        env["TUNEHUB_STALE_AFTER_SECS"] = str(self.settings.stale_after_secs)
        env["TUNEHUB_HEARTBEAT_SECS"] = str(self.settings.heartbeat_secs)
        env["TUNEHUB_WORKER_POLL_SECS"] = str(self.settings.worker_poll_secs)
        env["TUNEHUB_LEASE_SECS"] = str(self.settings.lease_secs)
        env["TUNEHUB_LEASE_BATCHES"] = str(self.settings.lease_batches)
        env["TUNEHUB_LEASE_TASKS"] = str(self.settings.lease_tasks)
        # The worker watches this process and stops when it is gone (service.worker).
        env["TUNEHUB_PARENT_PID"] = str(os.getpid())
        return env

    def _spawn(self, proc: _Proc) -> None:
        proc.log.parent.mkdir(parents=True, exist_ok=True)
        with open(proc.log, "ab") as log:
            proc.popen = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "service.cli",
                    "worker",
                    "--name",
                    proc.name,
                    "--nice",
                    str(self.settings.worker_nice),
                ],
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    def start(self) -> None:
        for proc in self.procs:
            self._spawn(proc)
        self._monitor = threading.Thread(target=self._watch, name="worker-monitor", daemon=True)
        self._monitor.start()

    def _requeue(self, name: str) -> None:
        """The worker process ``name`` is gone: release its leases so other workers take the
        work over at once."""
        try:
            with db.open_storage(self.database_url) as storage:
                leases = storage.release_worker_leases(
                    name, max_attempts=self.settings.lease_max_attempts
                )
        except db.StorageError as err:
            logger.warning("could not release the work of %s: %s", name, err)
            return
        if leases:
            logger.warning("released leases %s of worker %s", leases, name)

    def _watch(self) -> None:
        while not self._stopping.wait(1.0):
            for proc in self.procs:
                if proc.popen is None or proc.popen.poll() is None:
                    continue
                code = proc.popen.returncode
                logger.warning(
                    "worker %s exited with %s; restarting (log: %s)", proc.name, code, proc.log
                )
                self._requeue(proc.name)
                if self._stopping.wait(RESTART_DELAY_SECS):
                    return
                proc.restarts += 1
                self._spawn(proc)

    def alive(self) -> int:
        return sum(1 for p in self.procs if p.popen is not None and p.popen.poll() is None)

    def stop(self) -> None:
        self._stopping.set()
        if self._monitor is not None:
            self._monitor.join(timeout=5)
        running = [p for p in self.procs if p.popen is not None and p.popen.poll() is None]
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECS
        for proc in running:
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning(
                    "worker %s did not stop in %.0f s: killing it", proc.name, STOP_GRACE_SECS
                )
        for proc in self.procs:
            if proc.popen is None:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.popen.pid, signal.SIGKILL)  # its builder/runner children too
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=5)
            self._requeue(proc.name)


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


class Service:
    """The app, its uvicorn server and the embedded workers, started and stopped together."""

    def __init__(self, settings: Settings, *, workers: int = 1, log_level: str = "info") -> None:
        import uvicorn  # noqa: PLC0415 - worker processes import this module without the server

        from service.app import create_app, open_service_storage  # noqa: PLC0415 - (FastAPI) same

        self.settings = settings
        self.database_url, self.embedded = settings.resolved_database_url()
        self.storage = open_service_storage(settings)
        self.token: str | None = None
        self.token_created = False
        if self.embedded:
            self.token, self.token_created = ensure_local_token(
                self.storage, settings.resolved_token_file()
            )
        self.app = create_app(settings, storage=self.storage)
        config = uvicorn.Config(
            self.app,
            host=settings.host,
            port=settings.port,
            log_level=log_level,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=5,
        )
        self.server = uvicorn.Server(config)
        self.workers = EmbeddedWorkers(settings, workers, self.database_url)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return self.settings.base_url()

    def start_workers(self) -> None:
        if self.workers.count:
            self.workers.start()

    def serve_forever(self) -> None:
        """Serve until SIGINT/SIGTERM, then stop the API and the workers.

        uvicorn runs in a thread: in the main thread it would re-raise the signal after its own
        shutdown, killing this process before the workers are stopped.
        """
        stop = threading.Event()
        previous = {
            sig: signal.signal(sig, lambda *_: stop.set())
            for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            self.start_in_thread()
            while not stop.wait(0.5):
                if self._thread is not None and not self._thread.is_alive():
                    break
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.shutdown()

    def start_in_thread(self, timeout: float = 30.0) -> None:
        """Run uvicorn in a background thread (the demo); returns once it accepts requests."""
        self.start_workers()
        self._thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.shutdown()
                raise RuntimeError(f"the API server did not start on {self.url}")
            time.sleep(0.05)

    def shutdown(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=15)
        self.workers.stop()
        self.storage.close()


def die_with_parent() -> None:
    """In a child before ``exec`` (Linux): SIGTERM when the parent dies, even by ``kill -9``
    (``prctl(PR_SET_PDEATHSIG)``, kept across ``exec``). Elsewhere it does nothing; the worker's
    parent-pid watchdog (:func:`service.worker.watch_parent`) covers both."""
    import ctypes  # noqa: PLC0415
    import signal  # noqa: PLC0415

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass
