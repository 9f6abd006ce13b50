"""``/jobs/{id}/history``: a job's tuning history, incrementally (``?after=<record id>``).

The dashboard's curves (best latency per task and the estimated model latency, against trials
and time) come from here: the first read returns the whole history reduced to the records that
improved a task, each later poll only what was measured since (see :class:`JobHistoryPublic`).
Whole reads of recently read jobs cost only their new records (:mod:`service.history_cache`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from service.api.deps import CurrentUser, StateDep
from service.api.routes.jobs import JobId, owned_job
from service.api.schemas import MAX_ID, ErrorBody, JobHistoryPublic

router = APIRouter(prefix="/jobs", tags=["jobs"])

MAX_PAGE = 200_000


@router.get(
    "/{job_id}/history",
    response_model=JobHistoryPublic,
    responses={404: {"model": ErrorBody}},
    summary="Best latency per task over the job's records (poll with ?after=last_id)",
)
def job_history(
    job_id: JobId,
    state: StateDep,
    user: CurrentUser,
    after: Annotated[int, Query(ge=0, le=MAX_ID, description="a record id: read newer ones")] = 0,
    limit: Annotated[
        int, Query(ge=1, le=MAX_PAGE, description="most records read in this page")
    ] = 100_000,
) -> JobHistoryPublic:
    owned_job(state.storage, user, job_id)
    page = state.history.read(state.storage, job_id, after_id=after, limit=limit)
    return JobHistoryPublic.from_page(page)
