"""Task planning: skips, reuse, batch size and deferral under small budgets."""

from __future__ import annotations

import pytest

from compiler.partition import TaskInfo
from tuner.jobs.plan import MAX_BATCH, MIN_BATCH, choose_batch_size, plan_tuning


def task(key: str, flops: float, weight: int = 1, tunable: bool = True) -> TaskInfo:
    return TaskInfo(key, f"t{key}", flops, weight, (), tunable, "" if tunable else "take")


def test_batch_size_keeps_first_round_within_half_the_budget() -> None:
    assert choose_batch_size(3, 12) == MIN_BATCH
    assert choose_batch_size(3, 300) == 50
    assert choose_batch_size(2, 10_000) == MAX_BATCH
    assert choose_batch_size(19, 200) == 5


def test_skip_reuse_and_tune() -> None:
    tasks = [task("a", 10), task("b", 100, weight=3), task("c", 5, tunable=False)]
    plan = plan_tuning(tasks, 40, tuned_keys={"a"})
    actions = {d.task.key: d.action for d in plan.decisions}
    assert actions == {"a": "reuse", "b": "tune", "c": "skip"}
    assert [d.task.key for d in plan.decisions] == ["a", "b", "c"]  # model order kept
    assert plan_tuning(tasks, 40, tuned_keys={"a"}, continue_tuning=True).by_action("reuse") == []


def test_small_budget_tunes_the_heaviest_tasks_and_defers_the_rest() -> None:
    tasks = [task("light", 1), task("heavy", 1000), task("mid", 10, weight=50)]
    plan = plan_tuning(tasks, 8)
    assert [t.key for t in plan.to_tune] == ["heavy", "mid"]
    assert [t.key for t in plan.by_action("defer")] == ["light"]
    assert plan.batch_size == MIN_BATCH


def test_negative_budget_is_refused() -> None:
    with pytest.raises(ValueError):
        plan_tuning([task("a", 1)], -1)


def test_allotments_add_up_and_follow_the_work() -> None:
    from tuner.jobs.plan import allot_trials, task_batch_size

    tasks = [
        task("big", 1000),
        task("mid", 100, weight=3),
        task("tiny", 1),
        task("skip", 5, tunable=False),
    ]
    for budget in (12, 13, 64, 301):
        plan = plan_tuning(tasks, budget)
        allot = allot_trials(plan)
        assert sum(allot.values()) == budget and set(allot) == {"big", "mid", "tiny"}
        assert all(n >= plan.batch_size for n in allot.values())  # one batch each at least
        assert allot["big"] >= allot["mid"] >= allot["tiny"]
    assert allot_trials(plan_tuning(tasks, 0)) == {}
    assert task_batch_size(8) == MIN_BATCH and task_batch_size(100) == 50
    assert task_batch_size(10_000) == MAX_BATCH
