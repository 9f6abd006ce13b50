"""``/workers``: the distributed-worker protocol (worker tokens) and the worker/lease lists (user
tokens).

A worker registers, asks for a lease, fetches the records it starts from, uploads measured
batches, heartbeats, ends its lease, and for a finalize lease downloads the model and uploads the
verified artifact. The routes only translate HTTP; the rules live in :mod:`tuner.jobs.coordinator`
(and the storage it calls), which workers on the database call the same way.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path as FsPath
from typing import Annotated

from fastapi import APIRouter, File, Path, Query, UploadFile
from fastapi.responses import FileResponse, Response

import db
from compiler.build.artifact_layout import LIBRARY_NAME, MANIFEST_NAME
from cost_model.version import latest_model_blob
from service import json_limits
from service.api import visibility
from service.api.deps import API_PREFIX, CurrentUser, FilesDep, SettingsDep, StorageDep, WorkerAuth
from service.api.errors import ApiError, not_found
from service.api.schemas import (
    KEY_PATTERN,
    MAX_ID,
    NAME_PATTERN,
    ErrorBody,
    LeasePublic,
    LeasesPublic,
    WorkerHeartbeat,
    WorkerHeartbeatReply,
    WorkerPublic,
    WorkerRegister,
    WorkersPublic,
)
from tuner.jobs import coordinator
from tuner.jobs.protocol import (
    BatchAck,
    BatchUpload,
    LeaseContext,
    LeaseEnd,
    LeaseFinish,
    LeaseOffer,
    SeedRecords,
    TargetInfo,
)

router = APIRouter(prefix="/workers", tags=["workers"])

WorkerName = Annotated[str, Path(pattern=NAME_PATTERN)]
LeaseId = Annotated[int, Path(ge=1, le=MAX_ID)]
MANIFEST_LIMIT = 4 * 1024 * 1024
_NOT_FOUND = {404: {"model": ErrorBody}}
_CONFLICT = {404: {"model": ErrorBody}, 409: {"model": ErrorBody}}


def _lease_lost(err: Exception) -> ApiError:
    return ApiError(409, "lease_lost", str(err))


def _forbidden(err: Exception) -> ApiError:
    return ApiError(403, "forbidden", str(err))


_OWNED = {403: {"model": ErrorBody}, 404: {"model": ErrorBody}, 409: {"model": ErrorBody}}


@router.get(
    "",
    response_model=WorkersPublic,
    summary="Workers, their heartbeats and current leases (pages by offset)",
)
def list_workers(
    storage: StorageDep,
    _user: CurrentUser,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
) -> WorkersPublic:
    """A page of the workers by id, ``count`` all of them. A worker's current lease on a job
    the caller does not own shows without its job and task (:mod:`service.api.visibility`)."""
    rows = storage.list_workers(limit=limit, offset=offset)
    keys = {t.id: t.key for t in storage.list_targets()}
    active = {}
    for w in rows:  # one active lease per worker at most
        held = storage.list_leases(worker=w.name, status="active", limit=1)
        if held:
            active[w.name] = held[0]
    mine = visibility.owned(storage, _user.name, (lease.job_id for lease in active.values()))
    data = []
    for w in rows:
        public = WorkerPublic.from_worker(w, target_key=keys.get(w.target_id))
        if w.name in active:
            lease = visibility.lease_seen_by(LeasePublic.from_lease(active[w.name]), mine)
            public = public.model_copy(update={"current_lease": lease})
        data.append(public)
    return WorkersPublic(data=data, count=storage.count_workers())


@router.get("/leases", response_model=LeasesPublic, summary="Lease history (keyset pages by id)")
def list_leases(
    storage: StorageDep,
    _user: CurrentUser,
    job_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    worker: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    status: Annotated[
        str | None, Query(pattern="^(active|done|expired|returned|failed|cancelled)$")
    ] = None,
    after: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> LeasesPublic:
    """Only leases of the caller's own jobs: another user's leases (and job ids) are not its
    business."""
    if job_id is not None:  # another user's job has no leases for this caller
        job = storage.get_job(job_id)
        if job is None or job.owner != _user.name:
            raise not_found("job", job_id)
    rows = storage.list_leases(
        job_id=job_id,
        worker=worker,
        status=status,
        owner=_user.name,
        after_id=after,
        limit=limit,
    )
    return LeasesPublic(
        data=[LeasePublic.from_lease(r) for r in rows],
        next_after=rows[-1].id if len(rows) == limit else None,
    )


@router.post(
    "/register",
    response_model=WorkerPublic,
    responses=_OWNED,
    summary="Register (or re-register) a worker; its earlier leases are released",
)
def register_worker(
    body: WorkerRegister, storage: StorageDep, settings: SettingsDep, _worker: WorkerAuth
) -> WorkerPublic:
    """A name belongs to the worker token that registered it first (403 for another token); a
    token holds at most ``TUNEHUB_MAX_WORKERS_PER_TOKEN`` names (409 ``too_many_workers`` for
    a new one past it); the answer's ``instance`` is this registration: an earlier process of
    the name is out."""
    fingerprint = json.dumps(body.fingerprint, sort_keys=True, separators=(",", ":"))
    target = None
    if body.target is not None:
        for text in (body.target.target_json, body.target.fingerprint_json):
            try:
                if not isinstance(json_limits.loads(text), dict):
                    raise ValueError
            except ValueError:
                raise ApiError(
                    422, "invalid_request", "target_json and fingerprint_json must be JSON objects"
                ) from None
        from compiler.target import TargetSpec  # noqa: PLC0415 - the API process stays free of TVM

        spec = TargetSpec(
            body.target.kind,
            body.target.target_json,
            body.target.fingerprint_json,
            body.target.tvm_version,
        )
        target = TargetInfo.of(spec)
    elif body.target_key is not None:
        row = storage.get_target(body.target_key)
        if row is None:
            raise not_found("target", body.target_key)
        target = coordinator.target_info(row)
    try:
        worker = coordinator.register(
            storage,
            body.name,
            target,
            fingerprint,
            token_id=_worker.token_id,
            max_names=settings.max_workers_per_token,
        )
    except coordinator.Forbidden as err:
        raise _forbidden(err) from None
    except coordinator.TooManyWorkers as err:
        raise ApiError(409, "too_many_workers", str(err)) from None
    key = None if target is None else target.key
    public = WorkerPublic.from_worker(worker, target_key=key)
    return public.model_copy(update={"instance": worker.instance})


@router.post(
    "/{name}/heartbeat",
    response_model=WorkerHeartbeatReply,
    responses=_OWNED,
    summary="Stamp a worker's heartbeat (database clock) and renew its leases",
)
def heartbeat(
    name: WorkerName,
    body: WorkerHeartbeat,
    storage: StorageDep,
    settings: SettingsDep,
    _worker: WorkerAuth,
) -> WorkerHeartbeatReply:
    try:
        coordinator.owned_worker(storage, name, _worker.token_id)
        row, leases = coordinator.heartbeat(
            storage, name, settings.lease_policy(), status=body.status, instance=body.instance
        )
    except db.NotFoundError:
        raise not_found("worker", name) from None
    except coordinator.Forbidden as err:
        raise _forbidden(err) from None
    public = WorkerPublic.from_worker(row, lease=leases[0] if leases else None)
    return WorkerHeartbeatReply(**public.model_dump(), leases=[lease.id for lease in leases])


@router.post(
    "/{name}/lease",
    response_model=LeaseOffer,
    responses=_OWNED,
    summary="Lease the next piece of work for this worker's target (null when there is none)",
)
def lease(
    name: WorkerName,
    storage: StorageDep,
    settings: SettingsDep,
    _worker: WorkerAuth,
    instance: Annotated[str | None, Query(max_length=64)] = None,
) -> LeaseOffer:
    try:
        coordinator.owned_worker(storage, name, _worker.token_id)
        offer, pending = coordinator.lease_work(
            storage, name, settings.lease_policy(), instance=instance
        )
    except db.NotFoundError:
        raise not_found("worker", name) from None
    except coordinator.Forbidden as err:
        raise _forbidden(err) from None
    if offer is not None and offer.kind in coordinator.BUILD_KINDS:
        offer = offer.model_copy(
            update={"model_url": f"{API_PREFIX}/workers/jobs/{offer.job_id}/model"}
        )
    return LeaseOffer(lease=offer, pending_jobs=pending)


@router.get(
    "/records",
    response_model=SeedRecords,
    responses=_NOT_FOUND,
    summary="The best records of a workload on a target (a lease's starting point)",
)
def seed_records(
    storage: StorageDep,
    _worker: WorkerAuth,
    workload: Annotated[str, Query(pattern=KEY_PATTERN)],
    target: Annotated[str, Query(pattern=KEY_PATTERN)],
    k: Annotated[int, Query(ge=1, le=4096)] = 256,
) -> SeedRecords:
    row = storage.get_target(target)
    if row is None:
        raise not_found("target", target)
    data = coordinator.seed_records(storage, workload, row, k)
    return SeedRecords(data=data, count=len(data))


@router.get(
    "/cost-model",
    responses=_NOT_FOUND,
    response_class=Response,
    summary="The target's newest transferred cost model for a TVM version (binary)",
)
def cost_model_blob(
    storage: StorageDep,
    _worker: WorkerAuth,
    target: Annotated[str, Query(pattern=KEY_PATTERN)],
    tvm_version: Annotated[str, Query(min_length=1, max_length=64)],
) -> Response:
    """The blob :mod:`cost_model.store` wrote (booster and training set), with its id in
    ``X-Cost-Model-Id``; 404 when the target has none for this feature layout and TVM version."""
    found = latest_model_blob(storage, target, tvm_version)
    if found is None:
        raise not_found("cost model for target", target)
    model_id, blob = found
    return Response(
        blob, media_type="application/octet-stream", headers={"X-Cost-Model-Id": str(model_id)}
    )


@router.get(
    "/leases/{lease_id}/context",
    response_model=LeaseContext,
    responses=_OWNED,
    summary="What a tune lease's search starts from: best records, stored schedules, siblings",
)
def lease_context(
    lease_id: LeaseId,
    storage: StorageDep,
    _worker: WorkerAuth,
    k: Annotated[int, Query(ge=1, le=4096)] = 256,
    task_id: Annotated[
        int | None, Query(ge=1, description="a task of the lease (default: its first)")
    ] = None,
) -> LeaseContext:
    try:
        return coordinator.lease_context(
            storage, lease_id, k, task_id=task_id, token_id=_worker.token_id
        )
    except coordinator.Forbidden as err:
        raise _forbidden(err) from None


@router.post(
    "/leases/{lease_id}/records",
    response_model=BatchAck,
    responses={**_OWNED, 422: {"model": ErrorBody}},
    summary="Upload one measured batch of a tune lease (idempotent by batch number)",
)
def upload_batch(
    lease_id: LeaseId,
    body: BatchUpload,
    storage: StorageDep,
    settings: SettingsDep,
    _worker: WorkerAuth,
) -> BatchAck:
    try:
        return coordinator.accept_batch(
            storage,
            lease_id,
            body.batch,
            list(body.records),
            settings.lease_policy(),
            task_id=body.task_id,
            token_id=_worker.token_id,
        )
    except coordinator.Forbidden as err:
        raise _forbidden(err) from None
    except (TypeError, ValueError) as err:
        raise ApiError(422, "invalid_request", f"invalid record: {err}") from None


@router.post(
    "/leases/{lease_id}/finish",
    response_model=LeaseEnd,
    responses=_OWNED,
    summary="End a lease: done, returned (given back), failed (with the error) or cancelled",
)
def finish_lease(
    lease_id: LeaseId,
    body: LeaseFinish,
    storage: StorageDep,
    settings: SettingsDep,
    _worker: WorkerAuth,
) -> LeaseEnd:
    try:
        return coordinator.end_lease(
            storage,
            lease_id,
            body.outcome,
            settings.lease_policy(),
            error=body.error,
            search=body.search,
            token_id=_worker.token_id,
        )
    except coordinator.Forbidden as err:
        raise _forbidden(err) from None
    except db.InvalidTransitionError as err:
        raise _lease_lost(err) from None


@router.get(
    "/jobs/{job_id}/model",
    responses=_OWNED,
    response_class=FileResponse,
    summary="The model file of a job (for its finalize or preview lease)",
)
def job_model(
    job_id: Annotated[int, Path(ge=1, le=MAX_ID)],
    storage: StorageDep,
    files: FilesDep,
    _worker: WorkerAuth,
) -> FileResponse:
    job = storage.get_job(job_id)
    if job is not None:
        try:  # only for the worker holding the job's finalize or preview lease
            coordinator.finalizing_job(storage, job_id, _worker.token_id)
        except coordinator.Forbidden as err:
            raise _forbidden(err) from None
    model = None if job is None or job.model_id is None else storage.get_model(job.model_id)
    if model is None:
        raise not_found("model of job", job_id)
    path = files.model_path(model.content_hash)
    if not path.is_file():
        raise not_found("model file of job", job_id)
    return FileResponse(path, media_type="application/octet-stream", filename=model.filename)


@router.post(
    "/leases/{lease_id}/artifact",
    response_model=LeaseEnd,
    responses={**_CONFLICT, 413: {"model": ErrorBody}, 422: {"model": ErrorBody}},
    summary="Upload the verified artifact of a finalize lease (completes the job) or of a "
    "preview lease (the job's zero-trial preview; the job goes on)",
)
def upload_artifact(
    lease_id: LeaseId,
    storage: StorageDep,
    files: FilesDep,
    settings: SettingsDep,
    _worker: WorkerAuth,
    library: Annotated[UploadFile, File(description="model.so")],
    manifest: Annotated[UploadFile, File(description="manifest.json (verification passed)")],
) -> LeaseEnd:
    try:
        lease_row = coordinator.owned_lease(storage, lease_id, _worker.token_id)
    except db.NotFoundError:
        raise not_found("task lease", lease_id) from None
    except coordinator.Forbidden as err:
        raise _forbidden(err) from None
    staged = files.new_temp_dir("artifact-")
    try:
        _save(library, staged / LIBRARY_NAME, settings.upload_limit)
        _save(manifest, staged / MANIFEST_NAME, MANIFEST_LIMIT)
        try:  # before anything parses it: json.loads recurses once per bracket
            json_limits.check_file(staged / MANIFEST_NAME, what="manifest.json")
        except json_limits.JsonTooDeep as err:
            raise ApiError(422, "invalid_artifact", str(err)) from None
        try:
            coordinator.accept_artifact(
                storage,
                lease_id,
                staged,
                files.artifact_dir(lease_row.job_id),
                token_id=_worker.token_id,
                review=_server_review(storage, files, settings),
            )
        except db.InvalidTransitionError as err:
            raise _lease_lost(err) from None
        except db.ConflictError as err:
            raise ApiError(422, "invalid_artifact", str(err)) from None
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    job = storage.get_job(lease_row.job_id)
    return LeaseEnd(lease_status="done", job_status=job.status if job else "failed")


def _server_review(storage, files, settings):
    """The server's review of a remote worker's artifact
    (:func:`tuner.final_build.artifact_review.reviewer`): it builds the library itself where it can,
    or checks the worker's in a sandbox."""
    from tuner.final_build.artifact_review import reviewer  # noqa: PLC0415 - TVM where an artifact arrives

    return reviewer(
        storage,
        model_path=files.model_path,
        hide=[settings.home_dir(), files.root],
        model_limits=settings.model_limits(),
        server_build=settings.server_build,
        timeout_secs=settings.artifact_review_secs,
        memory_bytes=settings.artifact_review_memory_bytes,
    )


def _save(upload: UploadFile, path: FsPath, limit: int) -> None:
    size = 0
    with open(path, "wb") as out:
        while chunk := upload.file.read(1 << 20):
            size += len(chunk)
            if size > limit:
                raise ApiError(
                    413, "too_large", f"{upload.filename or path.name} exceeds {limit} bytes"
                )
            out.write(chunk)
