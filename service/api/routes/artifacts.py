"""``/jobs/{id}/artifacts``: the verified ``model.so`` and ``manifest.json`` of a finished job
(and ``params.bin``, the weights of a model too large to link them into its library), and under
``/preview`` those of its zero-trial build, published while the job tunes."""

from __future__ import annotations

from pathlib import Path as FsPath
from typing import Annotated, Literal

from fastapi import APIRouter, Path
from fastapi.responses import FileResponse

import db
from service.api.deps import CurrentUser, StorageDep
from service.api.errors import ApiError
from service.api.routes.jobs import JobId, latest_artifact, owned_job
from service.api.schemas import ErrorBody

router = APIRouter(prefix="/jobs/{job_id}/artifacts", tags=["artifacts"])

_MEDIA = {
    "model.so": "application/octet-stream",
    "manifest.json": "application/json",
    # a large model's weights, beside its library (compiler.weights.external): present only for
    # those
    "params.bin": "application/octet-stream",
}


@router.get(
    "/{name}",
    response_class=FileResponse,
    responses={
        200: {"content": {"application/octet-stream": {}, "application/json": {}}},
        404: {"model": ErrorBody},
        409: {"model": ErrorBody},
    },
    summary="Download model.so or manifest.json once the job succeeded and verified them",
)
def download_artifact(
    job_id: JobId,
    name: Annotated[Literal["model.so", "manifest.json", "params.bin"], Path()],
    storage: StorageDep,
    user: CurrentUser,
) -> FileResponse:
    job = owned_job(storage, user, job_id)
    artifact = latest_artifact(storage.list_artifacts(job_id), "final")
    if job.status != db.JobStatus.SUCCEEDED or artifact is None:
        raise ApiError(
            409, "no_artifact", f"job {job_id} has no verified artifact (status: {job.status})"
        )
    return _file_response(job_id, artifact, name)


@router.get(
    "/preview/{name}",
    response_class=FileResponse,
    responses={
        200: {"content": {"application/octet-stream": {}, "application/json": {}}},
        404: {"model": ErrorBody},
        409: {"model": ErrorBody},
    },
    summary="Download the zero-trial model.so or manifest.json a worker published while the job "
    "tunes (library peers and TVM's default schedules, verified)",
)
def download_preview(
    job_id: JobId,
    name: Annotated[Literal["model.so", "manifest.json", "params.bin"], Path()],
    storage: StorageDep,
    user: CurrentUser,
) -> FileResponse:
    owned_job(storage, user, job_id)
    artifact = latest_artifact(storage.list_artifacts(job_id), "preview")
    if artifact is None:
        raise ApiError(409, "no_preview", f"job {job_id} has no verified preview artifact (yet)")
    return _file_response(job_id, artifact, name, prefix="preview-")


def _file_response(job_id: int, artifact: db.Artifact, name: str, prefix: str = "") -> FileResponse:
    path = FsPath(artifact.path) / name
    if not path.is_file():
        raise ApiError(404, "artifact_missing", f"the artifact file {name} of job {job_id} is gone")
    headers = (
        {"ETag": f'"{artifact.sha256}"', "X-Checksum-Sha256": artifact.sha256}
        if (name == "model.so")
        else None
    )
    return FileResponse(
        path, media_type=_MEDIA[name], filename=f"job-{job_id}-{prefix}{name}", headers=headers
    )
