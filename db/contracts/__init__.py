"""The storage contract, one abstract class per resource (:class:`db.base.TuningStorage`).

Each module's docstring states the rules of its resource (records: keep-the-better duplicates and
failed candidates; jobs: ownership, task leases, cancellation, state transitions); each abstract
method documents its arguments, results and errors.
"""

from __future__ import annotations

from db.contracts.cost_models import CostModelStorage
from db.contracts.jobs import JobStorage
from db.contracts.library_records import LibraryRecordStorage
from db.contracts.models import ModelStorage
from db.contracts.records import RecordStorage
from db.contracts.remeasurements import RemeasurementStorage
from db.contracts.tokens import TokenStorage
from db.contracts.workers import WorkerStorage

__all__ = [
    "CostModelStorage",
    "JobStorage",
    "LibraryRecordStorage",
    "ModelStorage",
    "RecordStorage",
    "RemeasurementStorage",
    "TokenStorage",
    "WorkerStorage",
]
