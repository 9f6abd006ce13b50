"""What a user token sees of other users' work in the shared lists (issue 31).

A user owns the jobs its token's name created (:mod:`service.auth`). Workers and tuning records
are shared: a worker tunes everyone's jobs, and a task's records are evidence for every model
that has the task. So the lists stay whole, but what ties an entry to a job the caller does not
own is blanked: the job id, the task id and the error of a lease; the job id and the worker of
a record (tuning or library) and of a record's re-measurements. Entries of no job (a
``tunehub tune`` run, an import) are left as they are.
"""

from __future__ import annotations

from collections.abc import Iterable

import db
from service.api.schemas import LeasePublic, RecordsPublic


def owned(storage: db.TuningStorage, owner: str, job_ids: Iterable[int | None]) -> set[int]:
    """Those of ``job_ids`` (``None`` skipped) whose job ``owner`` owns: one query."""
    return storage.owned_job_ids(owner, {i for i in job_ids if i is not None})


def lease_seen_by(lease: LeasePublic, owned_jobs: set[int]) -> LeasePublic:
    """``lease`` as a user owning ``owned_jobs`` sees it: whole for one of its jobs, else with
    its job id, task id and error blanked."""
    if lease.job_id is None or lease.job_id in owned_jobs:
        return lease
    return lease.model_copy(update={"job_id": None, "task_id": None, "error": None})


def records_seen_by(storage: db.TuningStorage, owner: str, page: RecordsPublic) -> RecordsPublic:
    """A page of ``GET /records`` as ``owner`` sees it: every record, re-measurement and
    library record of a job it does not own with its job id and worker blanked (the measurement
    itself stays)."""
    again = [m for record in page.data for m in record.remeasurements]
    entries = [*page.data, *page.library_records, *again]
    mine = owned(storage, owner, (entry.job_id for entry in entries))

    def seen(entry):
        if entry.job_id is None or entry.job_id in mine:
            return entry
        return entry.model_copy(update={"job_id": None, "worker": None})

    def record_seen(record):
        measured = [seen(m) for m in record.remeasurements]
        return seen(record).model_copy(update={"remeasurements": measured})

    return page.model_copy(
        update={
            "data": [record_seen(r) for r in page.data],
            "library_records": [seen(r) for r in page.library_records],
        }
    )
