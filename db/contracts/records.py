"""The contract of targets, workloads and tuning records (their history, browsing and counts).

Records are append-mostly
    A tuning record is identified by ``(workload, target, sha256(trace JSON))``. Committing a
    record that is already stored never adds a row; the stored measurement is replaced only by a
    *better* one: a valid measurement replaces a failed one, a lower mean replaces a higher one,
    and an error text is added to a failure that had none. So imports, retried uploads and
    several workers measuring the same candidate converge on one row holding the best
    measurement, and committing the same batch twice changes nothing.

Failed candidates
    Stored with ``is_valid = False`` and ``mean_secs = NULL`` (MetaSchedule marks them with
    ``run_secs = [1e10]``), with the builder's or runner's error text when the caller has it.
    They are never returned by :meth:`RecordStorage.top_k`, and they keep the search from
    measuring the same broken candidate again.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from db.types import (
    DatabaseStats,
    JobHistoryPage,
    NewTuningRecord,
    TargetRecord,
    TuningRecordRow,
    WorkloadRecord,
    WorkloadSummary,
)

if TYPE_CHECKING:  # pragma: no cover
    from compiler.target import TargetSpec


class RecordStorage(abc.ABC):
    """Targets, workloads and tuning records (see the module docstring for the contract)."""

    # -- targets and workloads ---------------------------------------------------------------
    @abc.abstractmethod
    def ensure_target(self, spec: TargetSpec) -> TargetRecord:
        """Return the row for ``spec`` (matched on ``spec.key``), inserting it if missing."""

    @abc.abstractmethod
    def get_target(self, key: str) -> TargetRecord | None:
        """The target with this 16-hex key, or ``None``."""

    @abc.abstractmethod
    def get_target_by_id(self, target_id: int) -> TargetRecord | None:
        """The target with this id, or ``None``."""

    @abc.abstractmethod
    def list_targets(self) -> list[TargetRecord]:
        """All targets, oldest first."""

    @abc.abstractmethod
    def ensure_workload(
        self, key: str, mod_json: str, *, flops: float | None = None, summary: str = ""
    ) -> WorkloadRecord:
        """Return the workload with ``key``, inserting it if missing.

        Args:
            key: :func:`compiler.keys.workload_key` of the module (the caller computes it).
            mod_json: ``tvm.ir.save_json(mod)``.
            flops: estimated floating-point operations, if known.
            summary: a one-line readable description.

        Returns:
            The stored row; an existing row is returned unchanged (first writer wins).
        """

    @abc.abstractmethod
    def get_workload(self, key: str) -> WorkloadRecord | None:
        """The workload with this key, or ``None``."""

    @abc.abstractmethod
    def get_workload_by_id(self, workload_id: int) -> WorkloadRecord | None:
        """The workload with this id, or ``None``."""

    @abc.abstractmethod
    def workload_ids(self, keys: Sequence[str]) -> dict[str, int]:
        """Map the given keys to workload ids; unknown keys are left out."""

    @abc.abstractmethod
    def list_workloads(self, *, target_id: int | None = None) -> list[WorkloadRecord]:
        """All workloads (those with records for ``target_id`` if given), by id."""

    # -- tuning records ----------------------------------------------------------------------
    @abc.abstractmethod
    def commit_records(self, records: Sequence[NewTuningRecord]) -> None:
        """Store measurements in one transaction (the bulk path: workers, imports, the API).

        Duplicates, within the batch or against stored rows, follow the keep-the-better rule of
        the module docstring.

        Raises:
            ConflictError: a record names a workload, target or job that does not exist.
        """

    def commit_record(self, record: NewTuningRecord) -> None:
        """Store one measurement (see :meth:`commit_records`)."""
        self.commit_records([record])

    @abc.abstractmethod
    def top_k(self, workload_id: int, target_id: int, k: int) -> list[TuningRecordRow]:
        """The ``k`` best valid records of a workload on a target, lowest mean first
        (ties: oldest first)."""

    @abc.abstractmethod
    def top_k_ids(self, workload_id: int, target_id: int, k: int) -> list[tuple[int, float]]:
        """``(id, mean_secs)`` of :meth:`top_k`'s records, same order, read from the index only.

        For callers that cache parsed records by ``(id, mean_secs)`` (a record improved in place
        keeps its id but changes its mean) and fetch the rest with :meth:`get_records`.
        """

    @abc.abstractmethod
    def get_records(self, ids: Sequence[int]) -> list[TuningRecordRow]:
        """The records with these ids (unknown ids are left out), in no particular order."""

    def best_record(self, workload_id: int, target_id: int) -> TuningRecordRow | None:
        """The best valid record of a workload on a target, or ``None``."""
        rows = self.top_k(workload_id, target_id, 1)
        return rows[0] if rows else None

    @abc.abstractmethod
    def get_record(
        self, workload_id: int, target_id: int, trace_hash: str
    ) -> TuningRecordRow | None:
        """The record with this identity, valid or not, or ``None``."""

    @abc.abstractmethod
    def iter_records(
        self,
        *,
        target_id: int | None = None,
        workload_id: int | None = None,
        valid_only: bool = False,
        batch_size: int = 1000,
    ) -> Iterator[TuningRecordRow]:
        """All matching records in id order, fetched in batches (safe on large tables)."""

    @abc.abstractmethod
    def count_records(
        self,
        *,
        target_id: int | None = None,
        workload_id: int | None = None,
        valid: bool | None = None,
        job_id: int | None = None,
        measured_within_secs: float | None = None,
    ) -> int:
        """Number of matching records (``valid=None``: valid and failed; ``job_id``: measured
        for that job; ``measured_within_secs``: stored in the last that many seconds, database
        clock)."""

    @abc.abstractmethod
    def list_records(
        self,
        *,
        target_id: int | None = None,
        workload_id: int | None = None,
        job_id: int | None = None,
        valid: bool | None = None,
        after_id: int = 0,
        limit: int = 100,
    ) -> list[TuningRecordRow]:
        """One page of matching records in id order: those with ``id > after_id``, at most
        ``limit`` (keyset pagination: pass the last id of a page to get the next)."""

    @abc.abstractmethod
    def job_history(
        self, job_id: int, *, after_id: int = 0, limit: int = 100_000
    ) -> JobHistoryPage:
        """One page of a job's tuning history (see :class:`db.types.JobHistoryPage`): the job's
        records with ``id > after_id`` in id order, at most ``limit``, reduced to their counts and
        the records that improved their workload's best within the page.

        Read in one transaction from an index of the job's records, so polling it with the last
        page's ``last_id`` costs only the new records. A record improved in place later (the same
        schedule measured faster again) keeps its id: a reader that has passed it does not see
        the new time. An unknown job has an empty history.
        """

    @abc.abstractmethod
    def browse_workloads(
        self,
        *,
        target_id: int | None = None,
        model_id: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> tuple[list[WorkloadSummary], int]:
        """A page of workloads by id, without their module text, and the total count.

        ``target_id`` keeps workloads with records on that target (and counts only those
        records); ``model_id`` keeps the tasks of that model.
        """

    @abc.abstractmethod
    def tuned_workload_keys(
        self, target_id: int, keys: Sequence[str], *, exclude_job_id: int | None = None
    ) -> set[str]:
        """The workload keys among ``keys`` that a finished job task tuned for this target.

        A workload counts as tuned when a job task for it succeeded in a job of ``target_id``
        (``exclude_job_id`` leaves one job out, e.g. the job asking). Records alone do not make a
        workload tuned: a killed run leaves records but no finished task.
        """

    @abc.abstractmethod
    def quarantine_records(
        self,
        *,
        worker: str | None = None,
        job_id: int | None = None,
        record_ids: Sequence[int] | None = None,
        reason: str = "quarantined",
    ) -> int:
        """Hold the records measured by ``worker``, for ``job_id`` or with these ids (the
        criteria given all apply): they stay stored, marked ``quarantined`` with ``is_valid``
        false, so no best-record query (:meth:`top_k`, builds, seeds) uses them and each
        workload's best is the next valid record. Returns how many were newly quarantined.
        A quarantined record is replaced by a later plausible measurement of the same schedule
        (keep-the-better). Raises ``ValueError`` when no criterion is given."""

    @abc.abstractmethod
    def delete_records(
        self,
        *,
        worker: str | None = None,
        job_id: int | None = None,
        record_ids: Sequence[int] | None = None,
    ) -> int:
        """Delete the matching records (criteria as :meth:`quarantine_records`); return the
        count."""

    @abc.abstractmethod
    def stats(self) -> DatabaseStats:
        """Counts for ``tunehub db stats``."""
