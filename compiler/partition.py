"""Partition a Relax module into tuning tasks.

``partition`` runs the target's lowering (:func:`compiler.lowering.pipeline.fused_for_target`:
layout, the pass sequence MetaSchedule task extraction needs, layout-free weights; the final build
runs the same sequence) and promises a :class:`Partition`: the fused module that tuning and
compilation share, and one :class:`TaskInfo` per distinct workload, keyed by
:func:`compiler.keys.workload_key` so tasks are shared across every model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import tvm
from tvm import relax
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.analysis import estimate_tir_flops

from compiler.keys import workload_key
from compiler.llm.attention import is_attention_kernel
from compiler.lowering.pipeline import fuse, fused_for_target
from compiler.target import TargetSpec

__all__ = ["Partition", "TaskInfo", "fuse", "partition"]

# Tasks whose random measurement inputs make the measuring process read out of bounds
# (STACK.md: tuning ``take``/``gather`` crashes the runner). They are excluded from tuning.
_INDEXING_OPS = ("take", "gather", "embedding", "index")


@dataclass(frozen=True)
class TaskInfo:
    """One tuning task: a distinct fused subgraph of the model.

    ``weight`` is how many times the model calls it (a bucketed model with histogram shares:
    its calls per bucket weighted by the buckets' shares, :func:`weigh_by_shares`); ``flops``
    is per call; ``shapes`` lists the task's buffers as ``(name, shape, dtype)``. ``tunable``
    is false (with ``skip_reason``) for tasks that cannot be measured safely with random inputs.
    """

    key: str
    name: str
    flops: float
    weight: int
    shapes: tuple[tuple[str, tuple[int, ...], str], ...]
    tunable: bool = True
    skip_reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "name": self.name,
            "flops": self.flops,
            "weight": self.weight,
            "shapes": [{"name": n, "shape": list(s), "dtype": d} for n, s, d in self.shapes],
            "tunable": self.tunable,
            "skip_reason": self.skip_reason,
        }


@dataclass(frozen=True, eq=False)
class Partition:
    """The fused module plus its tasks (and the MetaSchedule tasks, same order, for tuning)."""

    fused: tvm.IRModule = field(repr=False)
    tasks: tuple[TaskInfo, ...]
    extracted: tuple[Any, ...] = field(repr=False)

    @property
    def total_flops(self) -> float:
        return sum(task.flops * task.weight for task in self.tasks)


def _buffer_shapes(func: Any) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    """``(name, shape, dtype)`` of each buffer parameter (TVM 0.27 params carry buffer types)."""
    shapes = []
    for param in func.params:
        shape = getattr(param, "shape", None)
        if shape is None:
            continue
        dims = tuple(int(d) if isinstance(d, (int, tvm.tirx.IntImm)) else -1 for d in shape)
        shapes.append((str(param.name), dims, str(param.dtype)))
    return tuple(shapes)


def _task_info(task: Any) -> TaskInfo:
    mod = task.dispatched[0]
    func = next(iter(mod.functions.values()))
    try:
        flops = float(estimate_tir_flops(mod))
    except Exception:  # noqa: BLE001 - TVM raises TVMError subclasses for opaque bodies
        flops = 0.0
    name = str(task.task_name)
    indexing = next((op for op in _INDEXING_OPS if op in name.lower()), None)
    if is_attention_kernel(func):
        reason = (
            "the CPU shim's attention over the cache's filled part (a library call: nothing to "
            "schedule)"
        )
    elif indexing:
        reason = (
            f"'{indexing}' reads data-dependent indices; random measurement inputs would read "
            "out of bounds and crash the runner"
        )
    else:
        reason = ""
    return TaskInfo(
        key=workload_key(mod),
        name=name,
        flops=flops,
        weight=int(task.weight),
        shapes=_buffer_shapes(func),
        tunable=not reason,
        skip_reason=reason,
    )


def partition(
    mod: tvm.IRModule, target: TargetSpec, shares: Mapping[str, float] | None = None
) -> Partition:
    """Fuse ``mod`` for ``target`` and extract its tuning tasks (heaviest first).

    ``shares``: a bucketed module's expected share of inputs per bucket function (from a
    histogram); each task's weight then counts its calls in each bucket by that bucket's share
    (:func:`weigh_by_shares`), so the tuning budget follows the inputs users expect."""
    fused = fused_for_target(mod, target)
    extracted = list(ms.relax_integration.extract_tasks(fused, target.tvm_target()))
    infos = [_task_info(task) for task in extracted]
    if shares:
        weights = weigh_by_shares(fused, target, shares)
        infos = [replace(info, weight=weights.get(info.key, info.weight)) for info in infos]
    order = sorted(
        range(len(infos)), key=lambda i: (-infos[i].flops * infos[i].weight, infos[i].name)
    )
    return Partition(
        fused=fused,
        tasks=tuple(infos[i] for i in order),
        extracted=tuple(extracted[i] for i in order),
    )


def weigh_by_shares(
    fused: tvm.IRModule, target: TargetSpec, shares: Mapping[str, float]
) -> dict[str, int]:
    """Task weights of a bucketed ``fused`` module by key: ``round(sum over buckets of calls
    x share x number of buckets)``, at least 1, so that equal shares give the plain call count.
    Each bucket's calls come from extracting the tasks of the module with only its function."""
    weighted: dict[str, float] = {}
    functions = [gv for gv, f in fused.functions_items() if isinstance(f, relax.Function)]
    for gvar in functions:
        share = shares.get(gvar.name_hint)
        if share is None:
            continue
        alone = tvm.IRModule(
            {
                gv: f
                for gv, f in fused.functions_items()
                if not isinstance(f, relax.Function) or gv.same_as(gvar)
            }
        )
        for task in ms.relax_integration.extract_tasks(alone, target.tvm_target()):
            key = workload_key(task.dispatched[0])
            weighted[key] = weighted.get(key, 0.0) + int(task.weight) * share * len(shares)
    return {key: max(1, round(value)) for key, value in weighted.items()}
