"""The contract of library records: library calls measured as candidates of a tuning task.

Kernels as peers (issue 21)
    A library record is one measurement of a library call (e.g. OpenBLAS ``sgemm`` behind a
    shim) for a task, i.e. a workload on a target: what was called (``library``, ``version``,
    ``call``), the time of each round and their median and spread. It is stored like a schedule,
    by workload and target rather than by model or job, so every model with the task shares it
    and a later build can reuse it without measuring again.

Library records are additive
    Adding one never changes a tuning record or another library record: the best of a task is
    the one with the lowest ``median_secs`` (the latest of equal ones), and callers compare it
    with the task's best schedule themselves. Deleting a workload or a target deletes its
    library records; deleting a job keeps them (job unset).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

from db.types import LibraryRecord, NewLibraryRecord


class LibraryRecordStorage(abc.ABC):
    """Library records of tuning tasks (see the module docstring for the contract)."""

    @abc.abstractmethod
    def add_library_records(self, items: Sequence[NewLibraryRecord]) -> list[LibraryRecord]:
        """Store ``items`` in one transaction (all or none) and return them as stored, in order.

        Raises ``ValueError`` for an item that is not a valid :class:`NewLibraryRecord` (its
        values are checked on construction and again here), before anything is written;
        ``ConflictError`` when a ``workload_key``, ``target_key`` or ``job_id`` does not exist.
        """

    @abc.abstractmethod
    def best_library_records(
        self, target_key: str, workload_keys: Sequence[str]
    ) -> dict[str, LibraryRecord]:
        """For each of ``workload_keys`` that has a library record on ``target_key``, the one
        with the lowest ``median_secs`` (of equal ones the latest stored), by workload key;
        keys without one (or unknown keys, or an unknown target) are absent. One query per
        1000 keys."""

    @abc.abstractmethod
    def list_library_records(
        self,
        *,
        workload_key: str | None = None,
        target_key: str | None = None,
        job_id: int | None = None,
    ) -> list[LibraryRecord]:
        """Library records of ``workload_key`` on ``target_key`` from ``job_id`` (any filter
        or none; an unknown key matches nothing), oldest first."""
