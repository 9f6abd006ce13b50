"""The storage contract: what every tuning-database backend promises its callers.

:class:`TuningStorage` is the sum of one contract per resource (:mod:`db.contracts`); the rules
that concern one resource are stated in its module:

- :mod:`db.contracts.records`: targets, workloads and tuning records ("Records are
  append-mostly", "Failed candidates"), their history, browsing and counts;
- :mod:`db.contracts.remeasurements`: re-measurements of top records ("Re-measurements are
  additive");
- :mod:`db.contracts.library_records`: library calls measured as candidates of a task ("Kernels
  as peers", "Library records are additive");
- :mod:`db.contracts.models`: uploaded models and their tuning tasks;
- :mod:`db.contracts.jobs`: jobs, job tasks, task leases and artifacts ("Ownership of running
  work", "Task leases", "Cancellation", "Allowed state transitions");
- :mod:`db.contracts.workers`, :mod:`db.contracts.tokens`, :mod:`db.contracts.cost_models`.

The rules below hold for every method.

Thread safety
    A storage object is shared by all threads of a process (the API's request threads, the
    MetaSchedule tuning thread through :class:`db.MetaScheduleDatabase`). Each method runs in its
    own short transaction on its own pooled connection; no method keeps state between calls except
    immutable caches (target and workload ids, which never change once assigned). Several
    processes may use one database at once: PostgreSQL for any number of machines, SQLite for the
    processes of one machine (writers queue on the 30 s busy timeout).

Errors
    Methods raise only :mod:`db.errors` exceptions: ``NotFoundError`` for a missing id,
    ``ConflictError`` for a constraint violation (e.g. an unknown workload id in a record),
    ``StorageUnavailableError`` when the database cannot be reached or stays locked.
"""

from __future__ import annotations

import abc

from db.contracts import (
    CostModelStorage,
    JobStorage,
    LibraryRecordStorage,
    ModelStorage,
    RecordStorage,
    RemeasurementStorage,
    TokenStorage,
    WorkerStorage,
)


class TuningStorage(
    RecordStorage,
    RemeasurementStorage,
    LibraryRecordStorage,
    ModelStorage,
    JobStorage,
    WorkerStorage,
    TokenStorage,
    CostModelStorage,
):
    """The tuning database (see the module docstring for the contract)."""

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """The database URL, password masked."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release pooled connections. The object must not be used afterwards."""

    def __enter__(self) -> TuningStorage:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
