"""Issue 33: one tune lease covers several tasks of a job, and its one search spreads the trials
over them (the gradient task scheduler) with the lease's roles: every batch goes to ``on_batch``
tagged with its task, and the lease's tasks of one family seed each other as they are measured,
as a run on the SQL database does (:class:`tuner.task_scheduler.sibling_seeds.LeaseSiblings`)."""

from __future__ import annotations

import dataclasses

from compiler.prepare import prepare_model
from compiler.target import cpu_target
from compiler.task_family import workload_family
from tuner.engine.search import FAST_SEARCH
from tuner.engine.task_tuning import LeasedWorkload, tune_workloads
from tuner.jobs.protocol import LeaseContext


def test_a_lease_of_several_tasks_tunes_them_in_one_search(example_model) -> None:
    target = cpu_target()
    prepared = prepare_model(example_model("mlp", "onnx"), target)
    tasks = [
        (task, extracted)
        for task, extracted in zip(
            prepared.partition.tasks, prepared.partition.extracted, strict=True
        )
        if task.tunable
    ]
    families = [workload_family(task.name) for task, _ in tasks]
    # The MLP's two hidden layers are one family (matmul + add + relu): siblings.
    assert any(families.count(f) >= 2 for f in families), families
    workloads = [
        LeasedWorkload(
            extracted.mod,
            task.name,
            LeaseContext(workload_id=100 + i, flops=task.flops),
        )
        for i, (task, extracted) in enumerate(tasks)
    ]
    batches = []

    def on_batch(batch) -> bool:
        batches.append((batch.task_index, len(batch.records)))
        return True

    tuned = tune_workloads(
        workloads,
        target,
        trials=16,
        batch_size=4,
        on_batch=on_batch,
        search=dataclasses.replace(FAST_SEARCH, sibling_seeds=True),
        seed=0,
    )
    # The budget, and at most one batch past it (a lease counts only its trials of that one).
    assert not tuned.stopped and tuned.trials == sum(n for _, n in batches)
    assert 16 <= tuned.trials < 16 + 4
    # Every task measured in the one search.
    assert {index for index, _ in batches} == set(range(len(workloads)))
    # A hidden layer was seeded from the other's measured schedule within the lease.
    assert tuned.report.seeds_measured >= 1, tuned.report
