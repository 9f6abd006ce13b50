"""A model's tuning tasks in the database: what an upload registers and every job run refreshes.

Each task's workload (its TIR module, FLOPs and a readable summary) is stored once under its
structural-hash key, shared by every model that has the task; the model's task list (name,
weight, why a task is not tunable) is what the planner (:func:`tuner.jobs.coordinator.plan_job`)
reads to start a job of that model.
"""

from __future__ import annotations

from collections.abc import Sequence

import tvm

from compiler.partition import TaskInfo
from compiler.prepare import PreparedModel
from db import ModelWorkload, TuningStorage


def register_workloads(
    storage: TuningStorage,
    tasks: Sequence[TaskInfo],
    workload_json: Sequence[str],
    model_id: int | None,
) -> dict[str, int]:
    """Store each task's workload (idempotent; ``workload_json[i]`` is ``tvm.ir.save_json`` of
    ``tasks[i]``'s dispatched TIR module) and, with ``model_id``, the model's task list (what the
    planner reads); return key -> workload id. Called at upload (:mod:`service.intake`, from the
    plain data the validation process returns) and by every run of a job
    (:func:`register_prepared`)."""
    workload_ids: dict[str, int] = {}
    for task, mod_json in zip(tasks, workload_json, strict=True):
        shapes = " ".join("x".join(map(str, s)) for _, s, _ in task.shapes)
        row = storage.ensure_workload(
            task.key, mod_json, flops=task.flops, summary=f"{task.name} {shapes}"
        )
        workload_ids[task.key] = row.id
    if model_id is not None:
        storage.set_model_workloads(
            model_id,
            [
                ModelWorkload(
                    model_id,
                    workload_ids[t.key],
                    t.name,
                    t.weight,
                    skip_reason=None if t.tunable else (t.skip_reason or "not tunable"),
                )
                for t in tasks
            ],
        )
    return workload_ids


def register_prepared(
    storage: TuningStorage, prepared: PreparedModel, model_id: int | None
) -> dict[str, int]:
    """:func:`register_workloads` of a prepared model's tasks."""
    workload_json = [tvm.ir.save_json(e.dispatched[0]) for e in prepared.partition.extracted]
    return register_workloads(storage, prepared.partition.tasks, workload_json, model_id)
