"""The contract of library records: library calls measured as candidates of a tuning task.

Kernels as peers (issue 21)
    A library record is one measurement of a library call (e.g. OpenBLAS ``sgemm`` behind a
    shim) for a task, i.e. a workload on a target: what was called (``library``, ``version``,
    ``call``), the time of each round and their median and spread. It is stored like a schedule,
    by workload and target rather than by model or job, so every model with the task shares it
    and a later build can reuse it without measuring again.

Library records are additive
    Adding one never changes a tuning record or another library record: the best of a task is
    the one with the lowest ``median_secs`` (the latest of equal ones) that is not held, and
    callers compare it with the task's best schedule themselves. Deleting a workload or a
    target deletes its library records; deleting a job keeps them (job unset).

Held library records (issue 31)
    A library record measured faster than its task physically allows
    (:mod:`tuner.jobs.plausibility`) is stored *held* (``quarantined``, with a ``held_reason``): it
    is listed and counted like any other, never a best.

Listing is paged
    :meth:`LibraryRecordStorage.list_library_records` returns one page of at most
    :data:`MAX_LIBRARY_PAGE` rows in id order (a ``LIMIT`` in the query), from after a given
    id; :meth:`LibraryRecordStorage.count_library_records` counts all that match.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

from db.types import LibraryRecord, NewLibraryRecord

#: The most library records one listing returns (a larger ``limit`` is lowered to it).
MAX_LIBRARY_PAGE = 1000


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
        """For each of ``workload_keys`` that has a library record on ``target_key`` that is
        not held, the one with the lowest ``median_secs`` (of equal ones the latest stored), by
        workload key; keys without one (or unknown keys, or an unknown target) are absent. One
        query per 1000 keys."""

    @abc.abstractmethod
    def list_library_records(
        self,
        *,
        workload_key: str | None = None,
        target_key: str | None = None,
        job_id: int | None = None,
        quarantined: bool | None = None,
        after_id: int = 0,
        limit: int = MAX_LIBRARY_PAGE,
    ) -> list[LibraryRecord]:
        """One page of the library records of ``workload_key`` on ``target_key`` from
        ``job_id``, held or not (``quarantined``; any filter or none; an unknown key matches
        nothing), oldest first: those with an id above ``after_id``, at most ``limit`` of them
        (lowered to :data:`MAX_LIBRARY_PAGE`; 0 or less: none)."""

    @abc.abstractmethod
    def count_library_records(
        self,
        *,
        workload_key: str | None = None,
        target_key: str | None = None,
        job_id: int | None = None,
        quarantined: bool | None = None,
    ) -> int:
        """How many library records :meth:`list_library_records` pages through for these
        filters (all pages)."""
