"""The tuning database: every measurement, from every worker and every model, lands here.

This is the only package that imports SQLAlchemy. Callers get frozen dataclasses
(:mod:`db.types`), never ORM rows, and only :mod:`db.errors` exceptions.

- :func:`open_storage` opens a database by URL and checks its schema (:class:`TuningStorage`
  documents the contract: thread safety, duplicates, ownership, state transitions).
- :class:`MetaScheduleDatabase` is a MetaSchedule ``Database`` scoped to one target.
- :func:`import_json_database` / :func:`export_json_database` exchange records with MetaSchedule
  JSON databases.

``import db`` stays light (no TVM): the MetaSchedule parts load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from db import schema
from db.base import TuningStorage
from db.config import DATABASE_URL_ENV, default_database_url, resolve_database_url, tunehub_home
from db.errors import (
    ConflictError,
    InvalidTransitionError,
    LeaseHeldError,
    NotFoundError,
    SchemaOutdatedError,
    StorageError,
    StorageUnavailableError,
)
from db.schema import check_schema, current_revision, head_revision, upgrade
from db.storage import SQLStorage, open_storage
from db.types import (
    FAILED_RUN_SECS,
    ApiToken,
    Artifact,
    CostModelBlob,
    DatabaseStats,
    HistoryPoint,
    Job,
    JobHistoryPage,
    JobProgress,
    JobStatus,
    JobTask,
    LeaseBatchResult,
    LeaseStatus,
    LibraryRecord,
    ModelRecord,
    ModelWorkload,
    NewJobTask,
    NewLibraryRecord,
    NewRemeasurement,
    NewTuningRecord,
    Remeasurement,
    TargetRecord,
    TargetStats,
    TaskLease,
    TuningRecordRow,
    Worker,
    WorkloadRecord,
    WorkloadSummary,
    canonical_trace_json,
    trace_hash,
)

if TYPE_CHECKING:  # pragma: no cover
    from db.metaschedule_database import MetaScheduleDatabase, RecordErrorsCallback
    from db.msjson import ExportReport, ImportReport, export_json_database, import_json_database

_LAZY = {
    "MetaScheduleDatabase": "db.metaschedule_database",
    "RecordErrorsCallback": "db.metaschedule_database",
    "ImportReport": "db.msjson",
    "ExportReport": "db.msjson",
    "import_json_database": "db.msjson",
    "export_json_database": "db.msjson",
}

__all__ = [
    "DATABASE_URL_ENV",
    "FAILED_RUN_SECS",
    "ApiToken",
    "Artifact",
    "ConflictError",
    "CostModelBlob",
    "DatabaseStats",
    "ExportReport",
    "HistoryPoint",
    "ImportReport",
    "InvalidTransitionError",
    "Job",
    "JobHistoryPage",
    "JobProgress",
    "JobStatus",
    "JobTask",
    "LeaseBatchResult",
    "LeaseHeldError",
    "LeaseStatus",
    "LibraryRecord",
    "MetaScheduleDatabase",
    "ModelRecord",
    "ModelWorkload",
    "NewJobTask",
    "NewLibraryRecord",
    "NewRemeasurement",
    "NewTuningRecord",
    "Remeasurement",
    "NotFoundError",
    "RecordErrorsCallback",
    "SQLStorage",
    "SchemaOutdatedError",
    "StorageError",
    "StorageUnavailableError",
    "TargetRecord",
    "TargetStats",
    "TaskLease",
    "TuningRecordRow",
    "TuningStorage",
    "Worker",
    "WorkloadRecord",
    "WorkloadSummary",
    "canonical_trace_json",
    "check_schema",
    "current_revision",
    "default_database_url",
    "export_json_database",
    "head_revision",
    "import_json_database",
    "open_storage",
    "resolve_database_url",
    "trace_hash",
    "tunehub_home",
    "schema",
    "upgrade",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'db' has no attribute {name!r}")
    import importlib  # noqa: PLC0415

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
