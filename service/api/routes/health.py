"""Liveness (``/health``: the process answers) and readiness (``/ready``: the database is
reachable at the expected schema and the storage directory is writable)."""

from __future__ import annotations

import os

from fastapi import APIRouter
from fastapi.responses import JSONResponse

import db
from service.api.deps import StateDep
from service.api.schemas import Health, Readiness

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health, summary="Liveness")
async def health() -> Health:
    return Health(status="ok")


@router.get(
    "/ready",
    response_model=Readiness,
    responses={503: {"model": Readiness}},
    summary="Readiness: database and storage usable",
)
def ready(state: StateDep):
    storage = state.storage
    writable = os.access(state.files.root, os.W_OK) and os.access(state.files.tmp, os.W_OK)
    try:
        revision = db.current_revision(storage.engine)  # type: ignore[attr-defined]
        ok = revision == db.head_revision() and writable
        detail = (
            None
            if ok
            else (
                "storage directory not writable"
                if not writable
                else f"schema {revision}, expected {db.head_revision()}"
            )
        )
    except db.StorageError as err:
        revision, ok, detail = None, False, f"database unreachable: {err}"
    body = Readiness(
        status="ready" if ok else "unavailable",
        database=storage.url.split(":", 1)[0],
        schema_revision=revision,
        storage_dir_writable=writable,
        detail=detail,
    )
    if ok:
        return body
    return JSONResponse(body.model_dump(), status_code=503)
