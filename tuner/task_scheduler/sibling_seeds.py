"""Start a task's search from the best schedules of its siblings: measured, and in its population.

MetaSchedule's evolutionary search begins each batch from the task's best measured schedules plus
random samples of its design space. A convolution on a new shape therefore starts from random
schedules, although the database may hold a fast schedule of the same fused operators on another
shape: ResNet-18 has eight ``conv2d + add + relu`` tasks, MobileNetV2 eighteen
``conv2d + add + clip``, and every model a user tunes adds more.

Siblings are tasks of one *workload family* (:func:`cost_model.transfer.workload_family`: the
fused operators without their numbers), found in every model the database knows and in the run
itself. When the scheduler picks a task, :class:`SiblingSeeds` offers the best schedule of the
sibling that runs at the highest throughput (FLOP/s) above the task's own, once per sibling
record: its trace is replayed on the task's module with every tile-size decision
(``SamplePerfectTile``) refitted to the task's loop extents (:func:`refit_tiles`), and the design
space's postprocessors are applied. The scheduler measures it like any candidate (it counts
against the trial budget, is stored as an ordinary record, and the cost model learns from it), so
the task's next batch starts from it when it is fast. A trace that does not replay (other block
names, a decision the new shape cannot take) is skipped.

The same refitting also feeds the search without measuring: :meth:`SiblingSeeds.population` gives
the top few records of every sibling, refitted, for the initial population of each batch
(:mod:`tuner.primed_database`), where the cost model scores them and mutation refines them.
"""
from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.schedule import Trace

from cost_model.transfer import workload_family
from db import TuningStorage
from db.metaschedule_database import MetaScheduleDatabase
from tuner.progress import mean_run_secs

logger = logging.getLogger(__name__)


def refit_tiles(extent: int, factors: list[int]) -> list[int]:
    """Tile sizes for a loop of ``extent`` as close to ``factors`` as divisibility allows.

    From the innermost factor outwards, each factor becomes the largest divisor of what is left
    of ``extent`` that does not exceed it; the outermost takes the rest. The product is always
    ``extent`` and the number of factors is kept. Raises ``ValueError`` for no factors or an
    extent below 1.
    """
    if not factors or extent < 1:
        raise ValueError(f"cannot tile extent {extent} into {factors}")
    fitted = [1] * len(factors)
    rest = extent
    for index in range(len(factors) - 1, 0, -1):
        factor = max(1, min(int(factors[index]), rest))
        while rest % factor:
            factor -= 1
        fitted[index] = factor
        rest //= factor
    fitted[0] = rest
    return fitted


def replay_on(trace: Trace, mod: tvm.IRModule) -> tvm.s_tir.Schedule:
    """Replay ``trace`` (without its postprocessing) on ``mod``, refitting tile sizes.

    Raises whatever TVM raises when an instruction does not apply to ``mod``.
    """
    sch = tvm.s_tir.Schedule(mod)

    def decide(inst, inputs, _attrs, decision):
        if inst.kind.name != "SamplePerfectTile":
            return decision
        extent = int(sch.get(inputs[0]).extent)
        factors = [int(f) for f in decision]
        return decision if math.prod(factors) == extent else refit_tiles(extent, factors)

    trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=decide)
    return sch


@dataclass(frozen=True)
class SeedTask:
    """What the seeder knows of one task of the run: ``workload_id`` in the database, its
    family and its FLOP count (``None`` or 0: no throughput, never seeded)."""

    workload_id: int
    family: str
    flops: float | None


class SiblingSeeds:
    """Sibling schedules to measure for a run's tasks (see the module docstring).

    ``database`` is the run's :class:`db.metaschedule_database.MetaScheduleDatabase`; ``tasks``
    are in MetaSchedule's task order. Families span every model registered in its storage plus
    the run's own tasks; records are its target's.
    """

    per_sibling = 4  # records of each sibling that :meth:`population` refits

    def __init__(self, database: MetaScheduleDatabase, tasks: list[SeedTask]) -> None:
        self.database = database
        self.storage: TuningStorage = database.storage
        self.target_id = database.target_record.id
        self.tasks = tasks
        self.offered = 0  # seeds handed out
        self.failed = 0  # sibling records that did not replay on the task
        self.known = 0  # replayed schedules the database already held for the task
        self.measured: list[tuple[int, float | None]] = []  # (task index, mean secs or None)
        self.populated = 0  # refitted sibling schedules handed to the search's populations
        self._family: dict[str, set[int]] = defaultdict(set)
        for model in self.storage.list_models():
            for task in self.storage.model_workloads(model.id):
                self._family[workload_family(task.task_name)].add(task.workload_id)
        for task in tasks:
            self._family[task.family].add(task.workload_id)
        self._tried: set[tuple[int, int]] = set()  # (task index, sibling record id)
        self._by_workload = {task.workload_id: task for task in tasks}
        self._refits: dict[tuple[int, int], Trace | None] = {}  # (workload, sibling record)
        self._workloads: dict[int, Any] = {}
        self._mods: dict[int, tvm.IRModule] = {}

    def candidates(self, task_index: int, context: Any) -> list[ms.MeasureCandidate]:
        """At most one candidate for task ``task_index`` (MetaSchedule's ``context``, whose
        design space supplies the postprocessors).

        Offers each sibling record once per task, fastest sibling first, and only a sibling
        whose best record runs at a higher FLOP/s than the task's own best record (any run's),
        and never a schedule the database already holds for the task (a resumed run).
        Never raises for a sibling schedule that does not replay; it is counted in
        :attr:`failed` and skipped.
        """
        task = self.tasks[task_index]
        if not task.flops:
            return []
        own = self.storage.best_record(task.workload_id, self.target_id)
        own_rate = task.flops / own.mean_secs if own is not None else 0.0
        for rate, record in self._faster_siblings(task_index, own_rate):
            self._tried.add((task_index, record.id))
            candidate = self._adapt(record, context)
            if candidate is None:
                self.failed += 1
            elif self.database.holds(context.mod, [candidate])[0]:
                self.known += 1  # measured before (an earlier or resumed run): nothing to learn
            else:
                self.offered += 1
                logger.debug("seeding task %d from workload %d (%.1f GFLOP/s)", task_index,
                             record.workload_id, rate / 1e9)
                return [candidate]
        return []

    def summary(self) -> dict[str, int]:
        """Counts for a run summary: seeds measured (and how many of them ran), sibling
        records that did not replay, seeds skipped because the database already held them,
        sibling schedules put in populations (summed over batches)."""
        return {"measured": len(self.measured),
                "valid": sum(secs is not None for _, secs in self.measured),
                "did_not_replay": self.failed,
                "already_stored": self.known,
                "in_populations": self.populated}

    def seed(self, scheduler: Any, task_id: int, builder: Any, runner: Any) -> list[Any]:
        """Measure :meth:`candidates` of ``task_id`` as MetaSchedule measures a batch.

        ``scheduler`` is the running ``TaskScheduler``: its measure callbacks (database commit,
        artifact removal, progress) see the seed as a batch of ``task_id``, and its cost model
        is updated with it (MetaSchedule's ``UpdateCostModel`` callback only accepts the batch
        in flight, so the update is called directly). Returns the ``RunnerResult`` of each seed
        measured (empty: nothing to seed); a seed that fails to build counts as a failed result.
        """
        record = scheduler.tasks_[task_id]
        candidates = self.candidates(task_id, record.ctx)
        if not candidates:
            return []
        target = record.ctx.target
        device = self.database.target_spec.device  # the runner's device name
        built = builder.build([ms.builder.BuilderInput(c.sch.mod, target) for c in candidates])
        results = []
        for candidate, result in zip(candidates, built, strict=True):
            if result.error_msg is not None:
                results.append(ms.runner.RunnerResult(run_secs=None, error_msg=result.error_msg))
                continue
            (future,) = runner.run([ms.runner.RunnerInput(result.artifact_path, device,
                                                          candidate.args_info)])
            results.append(future.result())
        self.measured.extend((task_id, mean_run_secs(r)) for r in results)
        for callback in scheduler.measure_callbacks_:
            if not isinstance(callback, ms.measure_callback.UpdateCostModel):
                callback.apply(scheduler, task_id, candidates, built, results)
        if scheduler.cost_model_ is not None:
            kept = [(c, r) for c, b, r in zip(candidates, built, results, strict=True)
                    if b.error_msg is None]
            scheduler.cost_model_.update(record.ctx, [c for c, _ in kept], [r for _, r in kept])
        return results

    def _faster_siblings(self, task_index: int, own_rate: float) -> list[tuple[float, Any]]:
        task = self.tasks[task_index]
        offers = []
        for workload_id in self._family[task.family] - {task.workload_id}:
            flops = self._workload(workload_id).flops
            record = self.storage.best_record(workload_id, self.target_id)
            if not flops or record is None or (task_index, record.id) in self._tried:
                continue
            rate = flops / record.mean_secs
            if rate > own_rate:
                offers.append((rate, record))
        return sorted(offers, key=lambda offer: -offer[0])

    def population(self, workload_id: int, mod: tvm.IRModule, limit: int) -> list[Trace]:
        """Up to ``limit`` sibling schedules refitted to the task of ``workload_id`` (whose
        module is ``mod``), unmeasured, for the evolutionary search's initial population: the
        top :attr:`per_sibling` records of each sibling, siblings in order of their best FLOP/s.
        Empty for a workload that is not one of the run's tasks. Traces that do not replay are
        skipped (never raises for them); each (task, record) pair is refitted once."""
        task = self._by_workload.get(workload_id)
        if task is None or limit <= 0:
            return []
        siblings = []
        for sibling in self._family[task.family] - {workload_id}:
            flops = self._workload(sibling).flops
            best = self.storage.best_record(sibling, self.target_id)
            if flops and best is not None:
                siblings.append((flops / best.mean_secs, sibling))
        traces: list[Trace] = []
        for _, sibling in sorted(siblings, reverse=True):
            ids = [i for i, _ in self.storage.top_k_ids(sibling, self.target_id, self.per_sibling)]
            missing = [i for i in ids if (workload_id, i) not in self._refits]
            for record in self.storage.get_records(missing) if missing else []:
                self._refits[(workload_id, record.id)] = self._refit(record, mod)
            traces.extend(t for i in ids if (t := self._refits[(workload_id, i)]) is not None)
            if len(traces) >= limit:
                break
        self.populated += min(len(traces), limit)
        return traces[:limit]

    def _refit(self, record: Any, mod: tvm.IRModule) -> Trace | None:
        """The trace of sibling ``record`` replayed on ``mod`` with refitted tiles (no
        postprocessing), or ``None`` when it does not replay."""
        try:
            return self._replay(record, mod).trace
        except Exception:  # noqa: BLE001 - a sibling that does not replay is skipped, by contract
            return None

    def _replay(self, record: Any, mod: tvm.IRModule) -> tvm.s_tir.Schedule:
        source = tvm.s_tir.Schedule(self._mod(record.workload_id))
        Trace.apply_json_to_schedule(json.loads(record.trace_json), source)
        return replay_on(source.trace, mod)

    def _adapt(self, record: Any, context: Any) -> ms.MeasureCandidate | None:
        try:
            sch = self._replay(record, context.mod)
            sch.enter_postproc()
            if not all(postproc.apply(sch) for postproc in context.space_generator.postprocs):
                return None
            return ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_entry_func(context.mod))
        except Exception:  # noqa: BLE001 - a sibling that does not replay is skipped, by contract
            return None

    def _workload(self, workload_id: int) -> Any:
        if workload_id not in self._workloads:
            self._workloads[workload_id] = self.storage.get_workload_by_id(workload_id)
        return self._workloads[workload_id]

    def _mod(self, workload_id: int) -> tvm.IRModule:
        if workload_id not in self._mods:
            self._mods[workload_id] = tvm.ir.load_json(self._workload(workload_id).mod_json)
        return self._mods[workload_id]
