"""The database a lease worker's search runs on: the server's view of a lease's tasks, in memory.

A worker does not hold the tuning database. :class:`LeaseDatabase` is what MetaSchedule reads
and writes during one tune lease instead of the SQL adapter: it starts with each leased
workload's best records on the server (:attr:`tuner.jobs.protocol.LeaseContext.seeds`: the search's
initial population and the cost model's warm start), knows which schedules the server holds
(:attr:`~tuner.jobs.protocol.LeaseContext.stored_keys`), and keeps what the lease measures. Its
:meth:`holds` is the SQL adapter's (:meth:`db.metaschedule_database.MetaScheduleDatabase.holds`):
so :class:`tuner.search_strategy.skip_stored.SkipStoredSchedules` and
:class:`tuner.task_scheduler.sibling_seeds.SiblingSeeds` treat both alike. The measurements
reach the server through the lease's measure callback
(:class:`tuner.measure_callback.upload_batches.UploadBatches`), not through this database.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from compiler.target import TargetSpec
from db.metaschedule_database import schedule_key
from tuner.jobs.protocol import LeaseContext

logger = logging.getLogger(__name__)


@derived_object
class LeaseDatabase(ms.database.PyDatabase):
    """MetaSchedule database of one lease (see the module docstring).

    ``leased`` pairs each leased workload's TIR module with the server's context for it. Seeds
    that do not replay on their module are skipped with a warning (:attr:`bad_seeds` counts
    them).
    """

    def __init__(
        self, target: TargetSpec, leased: Sequence[tuple[tvm.IRModule, LeaseContext]]
    ) -> None:
        super().__init__()
        self.target_spec = target
        self._memory = ms.database.MemoryDatabase()
        self._stored: set[str] = set()
        self._workloads: list[tuple[Any, int]] = []  # (MetaSchedule workload, server id)
        self.bad_seeds = 0
        for mod, context in leased:
            workload = self._memory.commit_workload(mod)
            self._workloads.append((workload, context.workload_id))
            self._stored.update(context.stored_keys)
            for entry in context.seeds:
                try:
                    record = ms.database.TuningRecord.from_json(list(entry), workload)
                except Exception as err:  # noqa: BLE001 - a bad seed must not stop tuning
                    self.bad_seeds += 1
                    logger.warning("skipped a seed record that does not replay: %s", err)
                    continue
                self._memory.commit_tuning_record(record)

    def has_workload(self, mod: tvm.IRModule) -> bool:
        return self._memory.has_workload(mod)

    def commit_workload(self, mod: tvm.IRModule) -> Any:
        return self._memory.commit_workload(mod)

    def commit_tuning_record(self, record: Any) -> None:
        self._memory.commit_tuning_record(record)
        self._stored.add(schedule_key(record.trace, record.workload))

    def get_top_k(self, workload: Any, top_k: int) -> list[Any]:
        return list(self._memory.get_top_k(workload, top_k))

    def get_all_tuning_records(self) -> list[Any]:
        return list(self._memory.get_all_tuning_records())

    def __len__(self) -> int:
        return len(self._memory)

    def workload_id_of(self, workload: Any) -> int | None:
        """The server's id of a leased workload (``None`` for any other module)."""
        for leased, workload_id in self._workloads:
            if tvm.ir.structural_equal(workload.mod, leased.mod):
                return workload_id
        return None

    def best_record(self, workload_id: int) -> Any | None:
        """The best valid record this database holds of leased workload ``workload_id`` (a seed
        or a measurement of this lease), or ``None``."""
        for workload, leased_id in self._workloads:
            if leased_id == workload_id:
                best = self._memory.get_top_k(workload, 1)
                return best[0] if best else None
        return None

    def holds(self, mod: tvm.IRModule, candidates: Sequence[Any]) -> list[bool]:
        """For each ``MeasureCandidate`` of ``mod``: whether the server held a record of that
        very schedule when the lease began, or this lease measured it since."""
        workload = ms.database.Workload(mod)
        return [schedule_key(c.sch.trace, workload) in self._stored for c in candidates]
