"""The contract of re-measurements: a task's top records measured again side by side.

Re-measurements are additive
    A re-measurement (:mod:`tuner.final_build.remeasure`) is stored beside the record it measured
    again and never changes the record's own measurement: ``tuning_records`` keeps its
    keep-the-better rule, so no re-measurement (e.g. one a worker uploads) can make another record
    look worse to the search. Deleting a record deletes its re-measurements; deleting a job keeps
    them (job unset).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

from db.types import NewRemeasurement, Remeasurement


class RemeasurementStorage(abc.ABC):
    """Re-measurements of stored records (see the module docstring for the contract)."""

    @abc.abstractmethod
    def add_remeasurements(self, items: Sequence[NewRemeasurement]) -> None:
        """Store ``items`` in one transaction (all or none). Raises ``ConflictError`` when a
        ``record_id`` or ``job_id`` does not exist."""

    @abc.abstractmethod
    def list_remeasurements(
        self,
        *,
        job_id: int | None = None,
        record_ids: Sequence[int] | None = None,
        latest: int | None = None,
    ) -> list[Remeasurement]:
        """Re-measurements of ``job_id``, or of the records ``record_ids`` (either filter or
        both; none: all), oldest first; given ``latest``, at most the ``latest`` newest of each
        record (bounded in the query; 0 or less: none)."""
