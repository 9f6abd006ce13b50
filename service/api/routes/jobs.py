"""``/jobs``: create (queued; a worker claims it), list, get with per-task progress, cancel."""

from __future__ import annotations

import time
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Response, status

import db
from compiler.errors import ModelError
from service import intake
from service.api.deps import API_PREFIX, CurrentUser, ServiceState, StateDep, StorageDep
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


def job_detail(storage: db.TuningStorage, job_id: int, user) -> JobDetail:
    """The status page of one of ``user``'s jobs (one database transaction)."""
    progress = storage.job_progress(job_id)
    if progress is None or progress.job.owner != user.name:
        raise not_found("job", job_id)
    job = progress.job
    artifact = latest_artifact(progress.artifacts, "final")
    return JobDetail.build(
        job,
        list(progress.tasks),
        artifact if job.status == db.JobStatus.SUCCEEDED else None,
        target_key=progress.target_key,
        prefix=API_PREFIX,
        model_tasks=progress.model_tasks,
        preview=latest_artifact(progress.artifacts, "preview"),
    )


def latest_artifact(artifacts, kind: str) -> db.Artifact | None:
    """The newest verified artifact of ``kind`` (``final`` or ``preview``) among a job's."""
    return next((a for a in reversed(list(artifacts)) if a.verified and a.kind == kind), None)


def cached_job_detail(state: ServiceState, job_id: int, user) -> JobDetail:
    """:func:`job_detail`, reused for ``job_status_cache_secs``: many clients polling one job
    share one database read (progress changes once per measured batch, seconds apart)."""
    now = time.monotonic()
    hit = state.job_cache.get(job_id)
    if hit is not None and hit[2] > now:
        if hit[1] != user.name:
            raise not_found("job", job_id)
        return hit[0]  # type: ignore[return-value]
    detail = job_detail(state.storage, job_id, user)
    ttl = state.settings.job_status_cache_secs
    if ttl > 0:
        if len(state.job_cache) > 10_000:
            state.job_cache.clear()
        state.job_cache[job_id] = (detail, user.name, now + ttl)
    return detail


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
        target = intake.target_for(storage, body.target, weights=body.weights)
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
    return job_detail(storage, job.id, user)


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
        data=[
            JobPublic.from_job(j, target_key=keys.get(j.target_id), prefix=API_PREFIX) for j in jobs
        ],
        count=storage.count_jobs(status=status_, owner=user.name),
    )


@router.get(
    "/{job_id}",
    response_model=JobDetail,
    responses={404: {"model": ErrorBody}},
    summary="Status, per-task progress, best and estimated latency, artifact links",
)
def get_job(job_id: JobId, state: StateDep, user: CurrentUser) -> JobDetail:
    return cached_job_detail(state, job_id, user)


@router.post(
    "/{job_id}/cancel",
    response_model=JobDetail,
    responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}},
    summary="Cancel a queued or running job (its worker stops at the next batch)",
)
def cancel_job(job_id: JobId, state: StateDep, user: CurrentUser) -> JobDetail:
    storage = state.storage
    state.job_cache.pop(job_id, None)
    job = owned_job(storage, user, job_id)
    if job.status in db.JobStatus.TERMINAL:
        raise ApiError(
            409,
            "job_finished",
            f"job {job_id} already {job.status}; only queued or running jobs can be cancelled",
        )
    try:
        job = storage.transition_job(job_id, db.JobStatus.CANCELLED, error="cancelled by the user")
    except db.InvalidTransitionError as err:
        raise ApiError(
            409,
            "job_finished",
            f"job {job_id} is {err.current} now; only queued or running jobs can be cancelled",
        ) from None
    state.job_cache.pop(job_id, None)
    return job_detail(storage, job.id, user)
