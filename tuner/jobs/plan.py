"""Decide what a tuning run does with each task before MetaSchedule starts.

A :class:`TuningPlan` promises, for a model's tasks, a budget and what the database already knows:
- tasks that cannot be measured safely (see :class:`compiler.partition.TaskInfo`) are *skipped*
  with their reason;
- tasks already tuned for this exact target and hardware are *reused* (zero measurements) unless
  ``continue_tuning`` asks to tune them further;
- the rest are *tuned*, heaviest (FLOPs × weight) first, with a batch size chosen so the first
  round reaches every tuned task when the budget allows it, leaving the rest of the budget to
  MetaSchedule's gradient task scheduler (expected gain by weighted latency share).
When the budget cannot give every task even a minimal batch, only the heaviest tasks that fit are
tuned and the others are reported as *deferred* (they compile with default schedules).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from compiler.partition import TaskInfo

MIN_BATCH = 4
MAX_BATCH = 64


@dataclass(frozen=True)
class TaskDecision:
    task: TaskInfo
    action: str  # "tune" | "reuse" | "skip" | "defer"
    reason: str = ""


@dataclass(frozen=True)
class TuningPlan:
    decisions: tuple[TaskDecision, ...]
    trials: int
    batch_size: int

    def by_action(self, action: str) -> list[TaskInfo]:
        return [d.task for d in self.decisions if d.action == action]

    @property
    def to_tune(self) -> list[TaskInfo]:
        return self.by_action("tune")


def choose_batch_size(num_tasks: int, trials: int) -> int:
    """Trials per MetaSchedule iteration: the first round (one batch per task) takes at most
    half the budget, within ``[MIN_BATCH, MAX_BATCH]``."""
    if num_tasks <= 0 or trials <= 0:
        return MIN_BATCH
    return max(MIN_BATCH, min(MAX_BATCH, trials // (2 * num_tasks)))


def task_batch_size(task_trials: int) -> int:
    """Trials per measured batch when one task is tuned alone (a distributed lease): two batches
    at least when the task's budget allows it, within ``[MIN_BATCH, MAX_BATCH]``."""
    return max(MIN_BATCH, min(MAX_BATCH, task_trials // 2))


def allot_trials(plan: TuningPlan) -> dict[str, int]:
    """Split ``plan.trials`` over the tuned tasks, for workers that tune tasks separately.

    Every tuned task gets one batch (``plan.batch_size``: the plan's first round); the rest goes
    by each task's share of the tuned FLOPs x weight (largest remainders), so the heavy tasks get
    most measurements, as the gradient task scheduler would give them. The allotments add up to
    ``plan.trials`` exactly (or to nothing when nothing is tuned).
    """
    tuned = plan.to_tune
    if not tuned or plan.trials <= 0:
        return {}
    base = min(plan.batch_size, plan.trials // len(tuned))
    allot = {task.key: base for task in tuned}
    rest = plan.trials - base * len(tuned)
    work = [max(task.flops, 0.0) * task.weight for task in tuned]
    total = sum(work)
    shares = [w / total * rest if total > 0 else rest / len(tuned) for w in work]
    whole = [int(share) for share in shares]
    left = rest - sum(whole)
    order = sorted(range(len(tuned)), key=lambda i: (-(shares[i] - whole[i]), i))
    for i in order[:left]:
        whole[i] += 1
    for task, extra in zip(tuned, whole):
        allot[task.key] += extra
    return allot


def plan_tuning(
    tasks: Sequence[TaskInfo],
    trials: int,
    *,
    tuned_keys: Collection[str] = (),
    continue_tuning: bool = False,
) -> TuningPlan:
    """Build the plan (see module docstring). ``tuned_keys``: workloads already tuned here."""
    if trials < 0:
        raise ValueError(f"trials must be >= 0, got {trials}")
    decisions: list[TaskDecision] = []
    candidates: list[TaskInfo] = []
    for task in tasks:
        if not task.tunable:
            decisions.append(TaskDecision(task, "skip", task.skip_reason))
        elif task.key in tuned_keys and not continue_tuning:
            decisions.append(TaskDecision(task, "reuse", "already tuned for this target"))
        else:
            candidates.append(task)
    candidates.sort(key=lambda t: (-t.flops * t.weight, t.name))
    fit = len(candidates) if trials >= MIN_BATCH * len(candidates) else trials // MIN_BATCH
    batch = choose_batch_size(fit, trials)
    for index, task in enumerate(candidates):
        if index < fit:
            decisions.append(TaskDecision(task, "tune"))
        else:
            decisions.append(
                TaskDecision(task, "defer", f"budget of {trials} trials too small for this task")
            )
    order = {task.key: i for i, task in enumerate(tasks)}
    decisions.sort(key=lambda d: order[d.task.key])
    return TuningPlan(tuple(decisions), trials, batch)
