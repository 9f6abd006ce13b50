"""Which tasks are siblings, and which of their schedules a task's search may start from.

Siblings are tasks of one *workload family* (:func:`compiler.task_family.workload_family`:
the fused operators without their numbers, e.g. ResNet-18's eight ``conv2d + add + relu`` tasks),
found in every model the database knows and in the run itself. :func:`faster_siblings` is the one
query behind both uses: the in-process search
(:class:`tuner.task_scheduler.sibling_seeds.SiblingSeeds` on the SQL database) and the server's
answer to a tune lease (:func:`tuner.jobs.coordinator.lease_context`), so a task gets the same
sibling schedules whichever way its job runs. Nothing here imports TVM.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING

from compiler.task_family import workload_family
from tuner.engine.reports import SiblingSchedule

if TYPE_CHECKING:  # pragma: no cover
    from db import TuningStorage


def family_members(storage: TuningStorage) -> dict[str, set[int]]:
    """Family name -> the ids of every workload of that family in every registered model."""
    members: dict[str, set[int]] = defaultdict(set)
    for model in storage.list_models():
        for task in storage.model_workloads(model.id):
            members[workload_family(task.task_name)].add(task.workload_id)
    return members


def own_rate(
    storage: TuningStorage, target_id: int, workload_id: int, flops: float | None
) -> float:
    """The FLOP/s of the workload's best valid record on the target (0 without one or FLOPs)."""
    best = storage.best_record(workload_id, target_id)
    return flops / best.mean_secs if flops and best is not None and best.mean_secs else 0.0


def faster_siblings(
    storage: TuningStorage,
    target_id: int,
    *,
    workload_id: int,
    members: Iterable[int],
    above_rate: float,
    exclude_records: Iterable[int] = (),
    limit: int | None = None,
) -> list[SiblingSchedule]:
    """The best record of each of ``members`` (but ``workload_id`` itself) whose FLOP/s on the
    target is above ``above_rate``, fastest first, at most ``limit``. Siblings without FLOPs or
    without a valid record, and records in ``exclude_records``, are left out."""
    excluded = set(exclude_records)
    found: list[SiblingSchedule] = []
    for sibling in set(members) - {workload_id}:
        row = storage.get_workload_by_id(sibling)
        record = storage.best_record(sibling, target_id)
        if row is None or not row.flops or record is None or not record.mean_secs:
            continue
        if record.id in excluded or row.flops / record.mean_secs <= above_rate:
            continue
        found.append(
            SiblingSchedule(
                record_id=record.id,
                workload_id=sibling,
                mod_json=row.mod_json,
                flops=row.flops,
                mean_secs=record.mean_secs,
                trace=json.loads(record.trace_json),
            )
        )
    found.sort(key=lambda s: -s.rate)
    return found if limit is None else found[:limit]
