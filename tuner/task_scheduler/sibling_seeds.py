"""Start a task's search from the best schedules of its siblings: measured, and in its population.

MetaSchedule's evolutionary search begins each batch from the task's best measured schedules plus
random samples of its design space. A convolution on a new shape therefore starts from random
schedules, although the database may hold a fast schedule of the same fused operators on another
shape: ResNet-18 has eight ``conv2d + add + relu`` tasks, MobileNetV2 eighteen
``conv2d + add + clip``, and every model a user tunes adds more.

Siblings are tasks of one *workload family* (:func:`compiler.task_family.workload_family`: the
fused operators without their numbers), found in every model the database knows and in the run
itself. Where the sibling schedules come from is a :class:`SiblingSource`: the SQL database in a
run that holds it (:class:`StorageSiblings`), or the server's answer to a lease
(:class:`LeaseSiblings`, from :class:`tuner.jobs.protocol.LeaseContext`); both go through
:func:`tuner.engine.siblings.faster_siblings`. When the scheduler picks a task,
:class:`SiblingSeeds` offers the best schedule of the sibling that runs at the highest throughput
(FLOP/s) above the task's own, once per sibling record: its trace is replayed on the task's module
with every tile-size decision (``SamplePerfectTile``) refitted to the task's loop extents
(:func:`refit_tiles`), and the design space's postprocessors are applied. The scheduler measures it
like any candidate (it counts against the trial budget, is stored as an ordinary record, and the
cost model learns from it), so the task's next batch starts from it when it is fast. A trace that
does not replay (other block names, a decision the new shape cannot take) is skipped.

The same refitting also feeds the search without measuring: :meth:`SiblingSeeds.population` gives
the top few records of every sibling, refitted, for the initial population of each batch
(:mod:`tuner.database.primed`), where the cost model scores them and mutation refines them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.schedule import Trace

from db.metaschedule_database import record_as_json
from db.types import mean_run_secs, measurement
from tuner.engine.reports import SiblingSchedule
from tuner.engine.siblings import family_members, faster_siblings

if TYPE_CHECKING:  # pragma: no cover - the protocol's messages need pydantic
    from tuner.jobs.protocol import LeaseContext

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


class SiblingSource(Protocol):
    """Where a run finds its tasks' sibling schedules (see the module docstring)."""

    def faster(self, task: SeedTask, own_rate: float, tried: set[int]) -> list[SiblingSchedule]:
        """The best schedule of each sibling of ``task`` faster than ``own_rate`` FLOP/s whose
        record id is not in ``tried``, fastest first."""

    def population(self, task: SeedTask, per_sibling: int) -> list[SiblingSchedule]:
        """Up to ``per_sibling`` top schedules of each sibling of ``task``, siblings in order of
        their best FLOP/s (for primed populations)."""


class StorageSiblings:
    """Siblings from the SQL database: every registered model's tasks plus the run's own."""

    def __init__(self, storage: Any, target_id: int, tasks: Sequence[SeedTask]) -> None:
        self.storage = storage
        self.target_id = target_id
        self._members = family_members(storage)
        for task in tasks:
            self._members[task.family].add(task.workload_id)

    def faster(self, task: SeedTask, own_rate: float, tried: set[int]) -> list[SiblingSchedule]:
        return faster_siblings(
            self.storage,
            self.target_id,
            workload_id=task.workload_id,
            members=self._members[task.family],
            above_rate=own_rate,
            exclude_records=tried,
        )

    def population(self, task: SeedTask, per_sibling: int) -> list[SiblingSchedule]:
        out: list[SiblingSchedule] = []
        for best in faster_siblings(
            self.storage,
            self.target_id,
            workload_id=task.workload_id,
            members=self._members[task.family],
            above_rate=-1.0,
        ):
            ids = [
                i for i, _ in self.storage.top_k_ids(best.workload_id, self.target_id, per_sibling)
            ]
            for row in sorted(self.storage.get_records(ids), key=lambda r: r.mean_secs or 0.0):
                out.append(
                    dataclasses.replace(
                        best,
                        record_id=row.id,
                        mean_secs=row.mean_secs,
                        trace=json.loads(row.trace_json),
                    )
                )
        return out


class LeaseSiblings:
    """Siblings of a tune lease's tasks: those the server handed the lease
    (:attr:`tuner.jobs.protocol.LeaseContext.siblings`, one context per leased task: the best
    schedule of each sibling faster than the task when the lease began) and, as the lease measures
    them, the lease's other tasks of the same family (``leased``: each task with its workload's TIR
    module as ``tvm.ir.save_json``; their best records are read from ``database``, the lease's
    :class:`tuner.database.lease.LeaseDatabase`). So the tasks of one lease seed each other as a
    run on the SQL database does (:class:`StorageSiblings`)."""

    def __init__(
        self,
        contexts: Sequence[LeaseContext],
        database: Any = None,
        leased: Sequence[tuple[SeedTask, str]] = (),
    ) -> None:
        self.contexts = {context.workload_id: context for context in contexts}
        self.database = database
        self.leased = list(leased)

    def _siblings(self, task: SeedTask) -> list[SiblingSchedule]:
        context = self.contexts.get(task.workload_id)
        served = list(context.siblings) if context is not None else []
        return sorted(served + self._in_lease(task), key=lambda s: -s.rate)

    def _in_lease(self, task: SeedTask) -> list[SiblingSchedule]:
        """The best record so far of each other leased task of ``task``'s family. Its id is
        negative (not a server record id), and a new best record gets a new one."""
        if self.database is None:
            return []
        out = []
        for other, mod_json in self.leased:
            if other.workload_id == task.workload_id or other.family != task.family:
                continue
            if not other.flops:
                continue
            best = self.database.best_record(other.workload_id)
            secs = measurement([float(x) for x in best.run_secs])[1] if best else None
            if not secs:
                continue
            trace = record_as_json(best)[0]
            digest = hash((other.workload_id, json.dumps(trace, sort_keys=True)))
            out.append(
                SiblingSchedule(
                    record_id=-1 - (digest & 0x3FFFFFFFFFFFFFFF),
                    workload_id=other.workload_id,
                    mod_json=mod_json,
                    flops=float(other.flops),
                    mean_secs=secs,
                    trace=trace,
                )
            )
        return out

    def faster(self, task: SeedTask, own_rate: float, tried: set[int]) -> list[SiblingSchedule]:
        return [s for s in self._siblings(task) if s.record_id not in tried and s.rate > own_rate]

    def population(self, task: SeedTask, per_sibling: int) -> list[SiblingSchedule]:
        return self._siblings(task)


class SiblingSeeds:
    """Sibling schedules to measure for a run's tasks (see the module docstring); a
    :class:`tuner.task_scheduler.seeds.Seeder`.

    ``database`` is the run's MetaSchedule database: the SQL adapter
    (:class:`db.metaschedule_database.MetaScheduleDatabase`) or a lease's
    (:class:`tuner.database.lease.LeaseDatabase`); it answers the task's own best record and
    which schedules are stored. ``tasks`` are in MetaSchedule's task order. ``source`` defaults
    to :class:`StorageSiblings` of the SQL adapter's storage and target.
    """

    per_sibling = 4  # records of each sibling that :meth:`population` refits

    def __init__(
        self, database: Any, tasks: list[SeedTask], source: SiblingSource | None = None
    ) -> None:
        self.database = database
        self.tasks = tasks
        self.source = source or StorageSiblings(database.storage, database.target_record.id, tasks)
        self.offered = 0  # seeds handed out
        self.failed = 0  # sibling records that did not replay on the task
        self.known = 0  # replayed schedules the database already held for the task
        self.measured: list[tuple[int, float | None]] = []  # (task index, mean secs or None)
        self.populated = 0  # refitted sibling schedules handed to the search's populations
        self._tried: dict[int, set[int]] = {}  # task index -> sibling record ids offered
        self._by_workload = {task.workload_id: task for task in tasks}
        self._refits: dict[tuple[int, int], Trace | None] = {}  # (workload, sibling record)
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
        tried = self._tried.setdefault(task_index, set())
        for sibling in self.source.faster(task, self._own_rate(task, context.mod), tried):
            tried.add(sibling.record_id)
            candidate = self._adapt(sibling, context)
            if candidate is None:
                self.failed += 1
            elif self.database.holds(context.mod, [candidate])[0]:
                self.known += 1  # measured before (an earlier or resumed run): nothing to learn
            else:
                self.offered += 1
                logger.debug(
                    "seeding task %d from workload %d (%.1f GFLOP/s)",
                    task_index,
                    sibling.workload_id,
                    sibling.rate / 1e9,
                )
                return [candidate]
        return []

    def observe(self, task_index: int, results: Sequence[Any]) -> None:
        self.measured.extend((task_index, mean_run_secs(r)) for r in results)

    def summary(self) -> dict[str, int]:
        """Counts for a run summary: seeds measured (and how many of them ran), sibling
        records that did not replay, seeds skipped because the database already held them,
        sibling schedules put in populations (summed over batches)."""
        return {
            "measured": len(self.measured),
            "valid": sum(secs is not None for _, secs in self.measured),
            "did_not_replay": self.failed,
            "already_stored": self.known,
            "in_populations": self.populated,
        }

    def _own_rate(self, task: SeedTask, mod: tvm.IRModule) -> float:
        best = self.database.get_top_k(self.database.commit_workload(mod), 1)
        secs = measurement([float(x) for x in best[0].run_secs])[1] if best else None
        return task.flops / secs if task.flops and secs else 0.0

    def population(self, workload_id: int, mod: tvm.IRModule, limit: int) -> list[Trace]:
        """Up to ``limit`` sibling schedules refitted to the task of ``workload_id`` (whose
        module is ``mod``), unmeasured, for the evolutionary search's initial population: the
        top :attr:`per_sibling` records of each sibling, siblings in order of their best FLOP/s.
        Empty for a workload that is not one of the run's tasks. Traces that do not replay are
        skipped (never raises for them); each (task, record) pair is refitted once."""
        task = self._by_workload.get(workload_id)
        if task is None or limit <= 0:
            return []
        traces: list[Trace] = []
        for sibling in self.source.population(task, self.per_sibling):
            key = (workload_id, sibling.record_id)
            if key not in self._refits:
                self._refits[key] = self._refit(sibling, mod)
            if self._refits[key] is not None:
                traces.append(self._refits[key])
            if len(traces) >= limit:
                break
        self.populated += min(len(traces), limit)
        return traces[:limit]

    def _refit(self, sibling: SiblingSchedule, mod: tvm.IRModule) -> Trace | None:
        """The sibling's trace replayed on ``mod`` with refitted tiles (no postprocessing), or
        ``None`` when it does not replay."""
        try:
            return self._replay(sibling, mod).trace
        except Exception:  # noqa: BLE001 - a sibling that does not replay is skipped, by contract
            return None

    def _replay(self, sibling: SiblingSchedule, mod: tvm.IRModule) -> tvm.s_tir.Schedule:
        source = tvm.s_tir.Schedule(self._mod(sibling))
        Trace.apply_json_to_schedule(sibling.trace, source)
        return replay_on(source.trace, mod)

    def _adapt(self, sibling: SiblingSchedule, context: Any) -> ms.MeasureCandidate | None:
        try:
            sch = self._replay(sibling, context.mod)
            sch.enter_postproc()
            if not all(postproc.apply(sch) for postproc in context.space_generator.postprocs):
                return None
            # The scheduled function's arguments, as MetaSchedule's search takes them: a
            # prepacked weight has the tiled layout the postprocessing (RewriteLayout) gave it.
            args = ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)
            return ms.MeasureCandidate(sch, args)
        except Exception:  # noqa: BLE001 - a sibling that does not replay is skipped, by contract
            return None

    def _mod(self, sibling: SiblingSchedule) -> tvm.IRModule:
        if sibling.workload_id not in self._mods:
            self._mods[sibling.workload_id] = tvm.ir.load_json(sibling.mod_json)
        return self._mods[sibling.workload_id]
