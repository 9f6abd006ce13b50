"""``/jobs``: create (queued; a worker claims it), list, get with per-task progress, cancel."""
from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Response, status

import db
from compiler.errors import ModelError
from service import intake
from service.api.deps import API_PREFIX, CurrentUser, StorageDep
from service.api.errors import ApiError, model_error, not_found
from service.api.routes.models import owned_model
from service.api.schemas import MAX_ID, ErrorBody, JobCreate, JobDetail, JobPublic, JobsPublic

router = APIRouter(prefix="/jobs", tags=["jobs"])

JobId = Annotated[int, Path(ge=1, le=MAX_ID)]
StatusFilter = Literal["queued", "running", "succeeded", "failed", "cancelled"]


def owned_job(storage: db.TuningStorage, user, job_id: int) -> db.Job:
    job = storage.get_job(job_id)
    if job is None or job.owner != user.name:
        raise not_found("job", job_id)
    return job


def _target_key(storage: db.TuningStorage, target_id: int) -> str | None:
    row = storage.get_target_by_id(target_id)
    return None if row is None else row.key


def job_detail(storage: db.TuningStorage, job: db.Job) -> JobDetail:
    tasks = storage.list_job_tasks(job.id)
    artifacts = storage.list_artifacts(job.id) if job.status == db.JobStatus.SUCCEEDED else []
    artifact = next((a for a in reversed(artifacts) if a.verified), None)
    model_tasks = len(storage.model_workloads(job.model_id)) if job.model_id is not None else None
    return JobDetail.build(
        job, tasks, artifact, target_key=_target_key(storage, job.target_id), prefix=API_PREFIX,
        model_tasks=model_tasks,
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=JobDetail,
    responses={404: {"model": ErrorBody}, 422: {"model": ErrorBody}},
    summary="Queue a tuning job for one of your models",
)
def create_job(body: JobCreate, response: Response, storage: StorageDep, user: CurrentUser):
    model = owned_model(storage, user, body.model_id)
    try:
        target = intake.target_for(storage, body.target)
    except ModelError as err:
        raise model_error(err) from None
    job = storage.create_job(
        target_id=target.id,
        trial_budget=body.trial_budget,
        model_id=model.id,
        priority=body.priority,
        owner=user.name,
    )
    response.headers["Location"] = f"{API_PREFIX}/jobs/{job.id}"
    return job_detail(storage, job)


@router.get("", response_model=JobsPublic, summary="Your jobs, newest first")
def list_jobs(
    storage: StorageDep,
    user: CurrentUser,
    status_: Annotated[StatusFilter | None, Query(alias="status")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
) -> JobsPublic:
    jobs = storage.list_jobs(status=status_, owner=user.name, limit=limit, offset=offset)
    keys = {t.id: t.key for t in storage.list_targets()}
    return JobsPublic(
        data=[JobPublic.from_job(j, target_key=keys.get(j.target_id), prefix=API_PREFIX) for j in jobs],
        count=storage.count_jobs(status=status_, owner=user.name),
    )


@router.get(
    "/{job_id}",
    response_model=JobDetail,
    responses={404: {"model": ErrorBody}},
    summary="Status, per-task progress, best and estimated latency, artifact links",
)
def get_job(job_id: JobId, storage: StorageDep, user: CurrentUser) -> JobDetail:
    return job_detail(storage, owned_job(storage, user, job_id))


@router.post(
    "/{job_id}/cancel",
    response_model=JobDetail,
    responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}},
    summary="Cancel a queued or running job (its worker stops at the next batch)",
)
def cancel_job(job_id: JobId, storage: StorageDep, user: CurrentUser) -> JobDetail:
    job = owned_job(storage, user, job_id)
    if job.status in db.JobStatus.TERMINAL:
        raise ApiError(
            409, "job_finished",
            f"job {job_id} already {job.status}; only queued or running jobs can be cancelled",
        )
    try:
        job = storage.transition_job(job_id, db.JobStatus.CANCELLED, error="cancelled by the user")
    except db.InvalidTransitionError as err:
        raise ApiError(
            409, "job_finished",
            f"job {job_id} is {err.current} now; only queued or running jobs can be cancelled",
        ) from None
    return job_detail(storage, job)
