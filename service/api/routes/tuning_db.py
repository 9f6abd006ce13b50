"""The shared tuning database, read-only: targets, workloads, records, statistics.

Workloads and records are shared by every user (that is how one model's tuning helps the next);
filtering by ``model_id`` is limited to your own models.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

import db
from service.api import visibility
from service.api.deps import CurrentUser, StorageDep
from service.api.errors import not_found
from service.api.routes.models import owned_model
from service.api.schemas import (
    KEY_PATTERN,
    MAX_ID,
    ErrorBody,
    LibraryRecordPublic,
    RecordPublic,
    RecordsPublic,
    StatsPublic,
    TargetPublic,
    TargetsPublic,
    WorkloadPublic,
    WorkloadsPublic,
)

router = APIRouter(tags=["tuning database"])

TargetKey = Annotated[str | None, Query(pattern=KEY_PATTERN, description="16-hex target key")]
#: Re-measurements shown per record at most (the newest).
REMEASUREMENTS_SHOWN = 16


def _target_id(storage: db.TuningStorage, key: str | None) -> int | None:
    if key is None:
        return None
    row = storage.get_target(key)
    if row is None:
        raise not_found("target", key)
    return row.id


@router.get("/targets", response_model=TargetsPublic, summary="Targets (hardware) with records")
def list_targets(storage: StorageDep, _user: CurrentUser) -> TargetsPublic:
    rows = storage.list_targets()
    return TargetsPublic(data=[TargetPublic.from_record(r) for r in rows], count=len(rows))


@router.get(
    "/workloads",
    response_model=WorkloadsPublic,
    responses={404: {"model": ErrorBody}},
    summary="Tuning tasks (workloads), by target and/or model, with record counts and best",
)
def list_workloads(
    storage: StorageDep,
    user: CurrentUser,
    target: TargetKey = None,
    model_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
) -> WorkloadsPublic:
    if model_id is not None:
        owned_model(storage, user, model_id)
    rows, total = storage.browse_workloads(
        target_id=_target_id(storage, target), model_id=model_id, limit=limit, offset=offset
    )
    return WorkloadsPublic(data=[WorkloadPublic.from_summary(r) for r in rows], count=total)


@router.get(
    "/workloads/{key}",
    response_model=WorkloadPublic,
    responses={404: {"model": ErrorBody}},
    summary="One workload (records and best on one target if given)",
)
def get_workload(
    key: Annotated[str, Path(pattern=KEY_PATTERN)],
    storage: StorageDep,
    _user: CurrentUser,
    target: TargetKey = None,
) -> WorkloadPublic:
    found = storage.get_workload(key)
    if found is None:
        raise not_found("workload", key)
    rows, _ = storage.browse_workloads(target_id=_target_id(storage, target), limit=100_000)
    summary = next((r for r in rows if r.id == found.id), None)
    if summary is None:  # no records on that target
        summary = db.WorkloadSummary(found.id, found.key, found.summary, found.flops, 0, 0, None)
    return WorkloadPublic.from_summary(summary)


@router.get(
    "/records",
    response_model=RecordsPublic,
    responses={404: {"model": ErrorBody}},
    summary="Tuning records (measurements) by workload, target, job; keyset pages; the task's "
    "library records",
)
def list_records(
    storage: StorageDep,
    _user: CurrentUser,
    workload: Annotated[str | None, Query(pattern=KEY_PATTERN)] = None,
    target: TargetKey = None,
    job_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    valid: bool | None = None,
    after: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    include_trace: bool = False,
    library_after: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
) -> RecordsPublic:
    if job_id is not None:  # another user's job has no records for this caller
        job = storage.get_job(job_id)
        if job is None or job.owner != _user.name:
            raise not_found("job", job_id)
    workload_id = None
    if workload is not None:
        found = storage.get_workload(workload)
        if found is None:
            raise not_found("workload", workload)
        workload_id = found.id
    target_id = _target_id(storage, target)
    rows = storage.list_records(
        target_id=target_id,
        workload_id=workload_id,
        job_id=job_id,
        valid=valid,
        after_id=after,
        limit=limit,
    )
    total = storage.count_records(
        target_id=target_id, workload_id=workload_id, valid=valid, job_id=job_id
    )
    library, library_total = [], 0
    if workload is not None or job_id is not None:  # the task's library calls (issue 21)
        library_filter = dict(
            workload_key=workload,
            target_key=target,
            job_id=job_id,
            quarantined=None if valid is None else not valid,
        )
        library = storage.list_library_records(
            **library_filter, after_id=library_after, limit=limit
        )
        library_total = storage.count_library_records(**library_filter)
    again: dict[int, list[db.Remeasurement]] = {}
    measured_again = (
        storage.list_remeasurements(record_ids=[r.id for r in rows], latest=REMEASUREMENTS_SHOWN)
        if rows
        else ()
    )
    for item in measured_again:
        again.setdefault(item.record_id, []).append(item)
    page = RecordsPublic(
        data=[
            RecordPublic.from_row(
                r, include_trace=include_trace, remeasurements=again.get(r.id, [])
            )
            for r in rows
        ],
        count=total,
        next_after=rows[-1].id if len(rows) == limit else None,
        library_records=[LibraryRecordPublic.from_row(r) for r in library],
        library_count=library_total,
        library_next_after=library[-1].id if len(library) == limit else None,
    )
    return visibility.records_seen_by(storage, _user.name, page)  # others' job ids blanked


@router.get("/stats", response_model=StatsPublic, summary="Database statistics")
def stats(storage: StorageDep, _user: CurrentUser) -> StatsPublic:
    raw = storage.stats().as_dict()
    raw.pop("url", None)  # where the database lives is the operator's business
    return StatsPublic(**raw, jobs_by_status=storage.job_counts())
