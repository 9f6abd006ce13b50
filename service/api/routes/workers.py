"""``/workers``: registration and heartbeats (worker tokens), and the list (user tokens).

Workers that reach the database directly (``tunehub worker``, the embedded one) register and
heartbeat through the storage; these endpoints are the same operations over HTTP, for workers
that only reach the service.
"""
from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Path

from service.api.deps import CurrentUser, StorageDep, WorkerAuth
from service.api.errors import not_found
from service.api.schemas import (
    NAME_PATTERN,
    ErrorBody,
    WorkerHeartbeat,
    WorkerPublic,
    WorkerRegister,
    WorkersPublic,
)

router = APIRouter(prefix="/workers", tags=["workers"])


@router.get("", response_model=WorkersPublic, summary="Registered workers and their heartbeats")
def list_workers(storage: StorageDep, _user: CurrentUser) -> WorkersPublic:
    rows = storage.list_workers()
    return WorkersPublic(data=[WorkerPublic.from_worker(w) for w in rows], count=len(rows))


@router.post(
    "/register",
    response_model=WorkerPublic,
    responses={404: {"model": ErrorBody}},
    summary="Register (or re-register) a worker",
)
def register_worker(body: WorkerRegister, storage: StorageDep, _worker: WorkerAuth) -> WorkerPublic:
    target_id = None
    if body.target_key is not None:
        target = storage.get_target(body.target_key)
        if target is None:
            raise not_found("target", body.target_key)
        target_id = target.id
    row = storage.register_worker(
        body.name,
        fingerprint_json=json.dumps(body.fingerprint, sort_keys=True, separators=(",", ":")),
        target_id=target_id,
    )
    return WorkerPublic.from_worker(row)


@router.post(
    "/{name}/heartbeat",
    response_model=WorkerPublic,
    responses={404: {"model": ErrorBody}},
    summary="Stamp a worker's heartbeat (database clock)",
)
def heartbeat(
    name: Annotated[str, Path(pattern=NAME_PATTERN)],
    body: WorkerHeartbeat,
    storage: StorageDep,
    _worker: WorkerAuth,
) -> WorkerPublic:
    row = next((w for w in storage.list_workers() if w.name == name), None)
    if row is None:
        raise not_found("worker", name)
    return WorkerPublic.from_worker(storage.heartbeat(row.id, status=body.status))
