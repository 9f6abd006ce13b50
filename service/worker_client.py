"""How a worker reaches the coordinator: over HTTP (:class:`HttpClient`) or in process on the
database (:class:`DirectClient`, the embedded worker of ``tunehub serve``).

Both implement :class:`WorkClient`, so the worker loop (:mod:`service.worker`) is the same code in
both modes; :class:`DirectClient` calls the functions the REST routes call
(:mod:`tuner.jobs.coordinator`). Errors: :class:`ServerUnavailable` after retrying for
``retry_secs`` (connection errors, 502/503/504, a database that cannot be reached), and
:class:`WorkerApiError` for an answer that retrying cannot change (4xx: an unknown or lost lease,
a refused artifact).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

import httpx

import db
from cost_model.version import latest_model_blob
from tuner.jobs import coordinator
from tuner.jobs.protocol import (
    BatchAck,
    BatchUpload,
    LeaseContext,
    LeaseEnd,
    LeaseFinish,
    LeaseOffer,
    RecordUpload,
    SearchReport,
    TargetInfo,
    WorkOffer,
)
from tuner.jobs.record_checks import RecordRefused

logger = logging.getLogger("tunehub.worker")
T = TypeVar("T")
_RETRY_STATUS = (502, 503, 504)


class ServerUnavailable(Exception):
    """The coordinator could not be reached for ``retry_secs``."""


class WorkerApiError(Exception):
    """The coordinator refused a request (``status`` 4xx, with its ``code`` and ``detail``)."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail


class WorkClient(Protocol):
    """The coordinator as seen by a worker (see :mod:`tuner.jobs.coordinator` for the semantics)."""

    def register(self, name: str, target: TargetInfo, fingerprint_json: str) -> None: ...

    def heartbeat(self, name: str, status: str) -> set[int]:
        """Stamp the heartbeat, renew the worker's leases; the ids of its active leases."""

    def lease(self, name: str) -> tuple[WorkOffer | None, int]: ...

    def records(self, workload_key: str, target_key: str, k: int) -> list[list]: ...

    def context(self, lease_id: int, k: int, task_id: int | None = None) -> LeaseContext:
        """What the search of task ``task_id`` (default: the first) of tune lease ``lease_id``
        starts from (:class:`tuner.jobs.protocol.LeaseContext`)."""

    def cost_model(self, target_key: str, tvm_version: str) -> tuple[int, bytes] | None:
        """The target's newest transferred cost model for this TVM version, or ``None``."""

    def retrain_cost_model(self, target) -> bool:
        """Retrain the target's cost model if enough new records arrived (idle time only); true
        when a new model was stored. Remote workers leave this to the server's own workers."""

    def upload(
        self, lease_id: int, batch: int, records: list[RecordUpload], task_id: int | None = None
    ) -> BatchAck:
        """Upload batch ``batch`` of the lease, measured on its task ``task_id`` (default: the
        first)."""

    def finish(
        self,
        lease_id: int,
        outcome: str,
        error: str | None = None,
        search: SearchReport | None = None,
    ) -> LeaseEnd: ...

    def model_file(self, offer: WorkOffer, folder: Path) -> Path:
        """A local path of the finalize (or preview) lease's model file (downloaded into
        ``folder``)."""

    def staging_dir(self) -> Path:
        """A new empty folder to write an artifact into before :meth:`publish`."""

    def publish(self, lease_id: int, staged: Path) -> LeaseEnd:
        """Hand over a verified artifact (``model.so`` + ``manifest.json``); a finalize lease's
        completes the job, a preview lease's becomes the job's preview."""

    def close(self) -> None: ...


# -- HTTP --------------------------------------------------------------------------------------
#: How long a worker waits for the server's answer to an artifact upload (seconds).
ARTIFACT_SECS = 1800.0


class HttpClient:
    """The coordinator behind ``tunehub serve``'s REST API, with a worker token.

    Every call retries with exponential backoff (0.5 s doubling to 30 s) while the server is
    unreachable or answers 502/503/504, for at most ``retry_secs``; uploads are idempotent (batch
    numbers), so a retry after a lost answer counts nothing twice.
    """

    def __init__(
        self, server: str, token: str, *, retry_secs: float = 300.0, timeout: float = 120.0
    ):
        self.server = server.rstrip("/")
        self.retry_secs = retry_secs
        self.http = httpx.Client(
            base_url=f"{self.server}/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
        )
        #: The current registration (from /register): sent with heartbeats and lease requests.
        self.instance: str | None = None

    def close(self) -> None:
        self.http.close()

    def _call(
        self, method: str, path: str, *, retry_secs: float | None = None, **kwargs
    ) -> httpx.Response:
        deadline = time.monotonic() + (self.retry_secs if retry_secs is None else retry_secs)
        delay = 0.5
        while True:
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.TransportError as err:
                problem = f"{type(err).__name__}: {err}"
            else:
                if response.status_code in _RETRY_STATUS:
                    problem = f"HTTP {response.status_code}"
                elif response.status_code >= 400:
                    try:
                        body = response.json()
                    except ValueError:
                        body = {}
                    raise WorkerApiError(
                        response.status_code,
                        str(body.get("code", "error")),
                        str(body.get("detail", response.text[:500])),
                    )
                else:
                    return response
            if time.monotonic() + delay > deadline:
                raise ServerUnavailable(f"{method} {path}: {problem}")
            logger.warning(
                "server %s unreachable (%s); retrying in %.1f s", self.server, problem, delay
            )
            time.sleep(delay)
            delay = min(delay * 2, 30.0)

    def register(self, name: str, target: TargetInfo, fingerprint_json: str) -> None:
        reply = self._call(
            "POST",
            "/workers/register",
            json={
                "name": name,
                "fingerprint": json.loads(fingerprint_json),
                "target": {
                    "kind": target.kind,
                    "target_json": target.target_json,
                    "fingerprint_json": target.fingerprint_json,
                    "tvm_version": target.tvm_version,
                },
            },
        )
        self.instance = reply.json().get("instance")

    def heartbeat(self, name: str, status: str) -> set[int]:
        reply = self._call(
            "POST",
            f"/workers/{name}/heartbeat",
            json={"status": status, "instance": self.instance},
            retry_secs=min(self.retry_secs, 10.0),
        ).json()
        return set(reply.get("leases", []))

    def lease(self, name: str) -> tuple[WorkOffer | None, int]:
        params = {} if self.instance is None else {"instance": self.instance}
        reply = LeaseOffer.model_validate(
            self._call("POST", f"/workers/{name}/lease", params=params).json()
        )
        return reply.lease, reply.pending_jobs

    def records(self, workload_key: str, target_key: str, k: int) -> list[list]:
        reply = self._call(
            "GET",
            "/workers/records",
            params={"workload": workload_key, "target": target_key, "k": k},
        ).json()
        return reply["data"]

    def context(self, lease_id: int, k: int, task_id: int | None = None) -> LeaseContext:
        params = {"k": k} if task_id is None else {"k": k, "task_id": task_id}
        reply = self._call("GET", f"/workers/leases/{lease_id}/context", params=params)
        return LeaseContext.model_validate(reply.json())

    def cost_model(self, target_key: str, tvm_version: str) -> tuple[int, bytes] | None:
        try:
            response = self._call(
                "GET",
                "/workers/cost-model",
                params={"target": target_key, "tvm_version": tvm_version},
            )
        except WorkerApiError as err:
            if err.status == 404:
                return None
            raise
        return int(response.headers["X-Cost-Model-Id"]), response.content

    def retrain_cost_model(self, target) -> bool:
        return False  # the database is the server's: its embedded workers retrain

    def upload(
        self, lease_id: int, batch: int, records: list[RecordUpload], task_id: int | None = None
    ) -> BatchAck:
        body = BatchUpload(batch=batch, task_id=task_id, records=tuple(records))
        reply = self._call(
            "POST", f"/workers/leases/{lease_id}/records", json=body.model_dump(mode="json")
        )
        return BatchAck.model_validate(reply.json())

    def finish(
        self,
        lease_id: int,
        outcome: str,
        error: str | None = None,
        search: SearchReport | None = None,
    ) -> LeaseEnd:
        body = LeaseFinish(outcome=outcome, error=error, search=search)  # type: ignore[arg-type]
        reply = self._call(
            "POST", f"/workers/leases/{lease_id}/finish", json=body.model_dump(mode="json")
        )
        return LeaseEnd.model_validate(reply.json())

    def model_file(self, offer: WorkOffer, folder: Path) -> Path:
        path = folder / f"model.{offer.model_format or 'bin'}"
        response = self._call("GET", f"/workers/jobs/{offer.job_id}/model")
        path.write_bytes(response.content)
        return path

    def staging_dir(self) -> Path:
        return Path(tempfile.mkdtemp(prefix="tunehub-artifact-"))

    def publish(self, lease_id: int, staged: Path) -> LeaseEnd:
        files = {
            "library": ("model.so", (staged / "model.so").read_bytes(), "application/octet-stream"),
            "manifest": (
                "manifest.json",
                (staged / "manifest.json").read_bytes(),
                "application/json",
            ),
        }
        try:
            # The server builds the artifact again (or checks it in a sandbox) before it
            # answers: minutes for a large model (tuner.final_build.artifact_review).
            reply = self._call(
                "POST", f"/workers/leases/{lease_id}/artifact", files=files, timeout=ARTIFACT_SECS
            )
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        return LeaseEnd.model_validate(reply.json())


# -- in process --------------------------------------------------------------------------------
class DirectClient:
    """The coordinator in this process, on a storage the worker opened itself (``--db``)."""

    def __init__(
        self, storage: db.TuningStorage, settings, files, *, retry_secs: float = 300.0
    ) -> None:
        self.storage = storage
        self.policy = settings.lease_policy()
        self.files = files
        self.retry_secs = retry_secs
        self.instance: str | None = None

    def close(self) -> None:
        pass

    def _call(self, fn: Callable[[], T]) -> T:
        deadline = time.monotonic() + self.retry_secs
        delay = 0.5
        while True:
            try:
                return fn()
            except db.NotFoundError as err:
                raise WorkerApiError(404, "not_found", str(err)) from None
            except RecordRefused as err:
                raise WorkerApiError(422, "invalid_request", str(err)) from None
            except (db.ConflictError, db.InvalidTransitionError) as err:
                raise WorkerApiError(409, "conflict", str(err)) from None
            except db.StorageUnavailableError as err:
                if time.monotonic() + delay > deadline:
                    raise ServerUnavailable(str(err)) from None
                logger.warning("database unavailable (%s); retrying in %.1f s", err, delay)
                time.sleep(delay)
                delay = min(delay * 2, 30.0)

    def register(self, name: str, target: TargetInfo, fingerprint_json: str) -> None:
        row = self._call(lambda: coordinator.register(self.storage, name, target, fingerprint_json))
        self.instance = row.instance

    def heartbeat(self, name: str, status: str) -> set[int]:
        _, leases = self._call(
            lambda: coordinator.heartbeat(
                self.storage, name, self.policy, status=status, instance=self.instance
            )
        )
        return {lease.id for lease in leases}

    def lease(self, name: str) -> tuple[WorkOffer | None, int]:
        return self._call(
            lambda: coordinator.lease_work(self.storage, name, self.policy, instance=self.instance)
        )

    def records(self, workload_key: str, target_key: str, k: int) -> list[list]:
        target = self.storage.get_target(target_key)
        if target is None:
            raise WorkerApiError(404, "not_found", f"target {target_key} not found")
        return self._call(lambda: coordinator.seed_records(self.storage, workload_key, target, k))

    def context(self, lease_id: int, k: int, task_id: int | None = None) -> LeaseContext:
        return self._call(
            lambda: coordinator.lease_context(self.storage, lease_id, k, task_id=task_id)
        )

    def cost_model(self, target_key: str, tvm_version: str) -> tuple[int, bytes] | None:
        return self._call(lambda: latest_model_blob(self.storage, target_key, tvm_version))

    def retrain_cost_model(self, target) -> bool:
        from cost_model.store import maybe_retrain  # noqa: PLC0415 - TVM and xgboost

        return self._call(lambda: maybe_retrain(self.storage, target)) is not None

    def upload(
        self, lease_id: int, batch: int, records: list[RecordUpload], task_id: int | None = None
    ) -> BatchAck:
        return self._call(
            lambda: coordinator.accept_batch(
                self.storage, lease_id, batch, records, self.policy, task_id=task_id
            )
        )

    def finish(
        self,
        lease_id: int,
        outcome: str,
        error: str | None = None,
        search: SearchReport | None = None,
    ) -> LeaseEnd:
        return self._call(
            lambda: coordinator.end_lease(
                self.storage, lease_id, outcome, self.policy, error=error, search=search
            )
        )

    def model_file(self, offer: WorkOffer, folder: Path) -> Path:
        if offer.model_sha256 is None:
            raise WorkerApiError(404, "not_found", f"the model of job {offer.job_id} was deleted")
        path = self.files.model_path(offer.model_sha256)
        if not path.is_file():
            raise WorkerApiError(
                404, "not_found", f"the model file of job {offer.job_id} is missing"
            )
        return path

    def staging_dir(self) -> Path:
        return self.files.new_temp_dir("artifact-")

    def publish(self, lease_id: int, staged: Path) -> LeaseEnd:
        lease = self.storage.get_lease(lease_id)
        if lease is None:
            raise WorkerApiError(404, "not_found", f"task lease {lease_id} does not exist")
        try:
            self._call(
                lambda: coordinator.accept_artifact(
                    self.storage, lease_id, staged, self.files.artifact_dir(lease.job_id)
                )
            )
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        job = self.storage.get_job(lease.job_id)
        return LeaseEnd(
            lease_status=db.LeaseStatus.DONE, job_status=job.status if job else db.JobStatus.FAILED
        )
