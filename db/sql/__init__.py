"""The SQL implementation (SQLite and PostgreSQL), one mixin per resource on :class:`SQLBase`.

:class:`db.storage.SQLStorage` joins the mixins into one :class:`db.base.TuningStorage`.
"""

from __future__ import annotations

from db.sql.base import SQLBase
from db.sql.cost_models import CostModelSQL
from db.sql.jobs import JobSQL
from db.sql.lease_ends import LeaseEndSQL
from db.sql.leases import LeaseSQL
from db.sql.library_records import LibraryRecordSQL
from db.sql.models import ModelSQL
from db.sql.record_views import RecordViewSQL
from db.sql.records import RecordSQL
from db.sql.remeasurements import RemeasurementSQL
from db.sql.targets import TargetSQL
from db.sql.tokens import TokenSQL
from db.sql.workers import WorkerSQL

__all__ = [
    "CostModelSQL",
    "JobSQL",
    "LeaseEndSQL",
    "LeaseSQL",
    "LibraryRecordSQL",
    "ModelSQL",
    "RecordSQL",
    "RecordViewSQL",
    "RemeasurementSQL",
    "SQLBase",
    "TargetSQL",
    "TokenSQL",
    "WorkerSQL",
]
