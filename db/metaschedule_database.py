"""A MetaSchedule ``Database`` backed by the SQL tuning storage, scoped to one target.

MetaSchedule's own query path ignores the target (an llvm record is returned for a CUDA query,
a 4-core record for a 2-core target) and ``get_top_k`` has no target argument. So an adapter
object serves exactly one target row: it reads and writes that target's records only, and
:meth:`MetaScheduleDatabase.query_tuning_record` answers ``None`` when asked about another target
(other kind, ``mcpu``, core count or GPU), whatever records exist.

Use::

    storage = db.open_storage(url)
    database = db.MetaScheduleDatabase(storage, compiler.target.cpu_target())
    database.set_context(job_id=job.id, worker="worker-1")   # optional, stored with each record
    ms.tir_integration.tune_tir(mod, database.target, ..., database=database)

Failed candidates: MetaSchedule commits them with ``run_secs=[1e10]``; they are stored with
``is_valid=False``. TVM drops the builder's/runner's error message, so add
:class:`RecordErrorsCallback` to the measure callbacks (after the default ones) to keep it, or call
:meth:`MetaScheduleDatabase.record_failure` yourself.

MetaSchedule's C++ calls these methods from the tuning thread, and an exception there aborts the
tuning run: misses return ``None``/``False``/``[]``; only real storage failures raise.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule import _ffi_api as ms_ffi

from compiler.keys import workload_key
from compiler.target import TargetSpec, canonical_target_json
from db.base import TuningStorage
from db.storage import open_storage
from db.types import (
    NewTuningRecord,
    TargetRecord,
    TuningRecordRow,
    canonical_trace_json,
    trace_hash,
)

logger = logging.getLogger(__name__)
#: Best records a query tries, best first, until one replays on the workload.
QUERY_CANDIDATES = 8


def replay(mod: tvm.IRModule, trace: Any) -> tvm.s_tir.Schedule:
    """The schedule of ``mod`` with the trace (``TuningRecord.as_json()[0]``) applied, its
    postprocessing included (a ``RewriteLayout`` leaves the weights in their tiled layout):
    nothing built or measured. Raises whatever TVM raises for a trace that does not apply."""
    sch = tvm.s_tir.Schedule(mod)
    tvm.s_tir.schedule.Trace.apply_json_to_schedule(trace, sch)
    return sch


def replay_error(mod: tvm.IRModule, trace: Any) -> str | None:
    """Why the trace does not replay on ``mod`` (:func:`replay`), or ``None`` when it does."""
    try:
        replay(mod, trace)
    except Exception as err:  # noqa: BLE001 - TVM raises many kinds for a bad trace
        return describe_error(err)
    return None


def describe_error(err: BaseException) -> str:
    """A one-line description of a TVM error (its type and last line)."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[-1] if text else ''}"


Workload = ms.database.Workload
TuningRecord = ms.database.TuningRecord


def _plain_json(obj: Any) -> Any:
    """A TVM JSON-like object (Array, Map, IntImm, ...) as plain Python, index maps as JSON text
    (the form ``Trace.as_json`` writes and ``TuningRecord.from_json`` reads back)."""
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, tvm.tirx.IntImm | tvm.tirx.FloatImm):
        return obj.value
    if isinstance(obj, tvm.tirx.IndexMap):
        return tvm.ir.save_json(obj)
    if hasattr(obj, "items"):
        return {_plain_json(k): _plain_json(v) for k, v in obj.items()}
    return [_plain_json(item) for item in obj]


def record_as_json(record: TuningRecord) -> list[Any]:
    """``record.as_json()``, also for traces holding index maps (``transform_layout`` in
    MetaSchedule's WMMA rules and in DLight's matmul): TVM 0.27's ``TuningRecord.as_json`` raises
    ``TypeError: Not supported type: IndexMap`` for those."""
    return _plain_json(ms_ffi.TuningRecordAsJSON(record))


def schedule_key(trace: Any, workload: Workload) -> str:
    """The ``trace_hash`` a record of the schedule with this ``trace`` of ``workload`` is stored
    under (the de-duplication key of the records table)."""
    trace_json = record_as_json(TuningRecord(trace, workload, None, None, None))[0]
    return trace_hash(canonical_trace_json(trace_json))


def describe_workload(mod: tvm.IRModule, mod_json: str | None = None) -> str:
    """A one-line readable summary: each function's parameters and its first blocks."""
    try:
        nodes = json.loads(mod_json or tvm.ir.save_json(mod))["nodes"]
        blocks = [
            nodes[n["data"]["name_hint"]]["data"]
            for n in nodes
            if n.get("type") == "s_tir.SBlock" and "name_hint" in n.get("data", {})
        ]
        blocks = [b for b in blocks if isinstance(b, str) and b != "root"]
    except Exception:  # noqa: BLE001 - a summary must never fail a commit
        blocks = []
    parts = []
    for gv, func in mod.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            parts.append(gv.name_hint)
            continue
        params = []
        try:
            for info in ms.arg_info.ArgInfo.from_prim_func(func):
                kind, dtype, shape = info.as_json()
                params.append(f"{dtype}[{'x'.join(str(d) for d in shape)}]")
        except Exception:  # noqa: BLE001
            params = [str(p.name) for p in func.params]
        parts.append(f"{gv.name_hint}({', '.join(params)})")
    summary = "; ".join(parts)
    if blocks:
        summary += " blocks:" + ",".join(blocks[:6]) + (",..." if len(blocks) > 6 else "")
    return summary


def estimate_flops(mod: tvm.IRModule) -> float | None:
    try:
        from tvm.s_tir.analysis import estimate_tir_flops  # noqa: PLC0415

        return float(estimate_tir_flops(mod))
    except Exception:  # noqa: BLE001 - unknown FLOPs are stored as NULL
        return None


def same_target(target_json: str, target: Any) -> bool:
    """Whether a TVM target (object or JSON dict) is the target whose canonical JSON is given.

    A host attached to the query (``Target(t, host=...)``) is ignored unless ``target_json``
    itself names a host: kernels are scheduled for the device part.
    """
    if not isinstance(target, tvm.target.Target):
        target = tvm.target.Target(target)
    text = canonical_target_json(target)
    if text == target_json:
        return True
    if '"host"' not in target_json:
        query = json.loads(text)
        if query.pop("host", None) is not None:
            return json.dumps(query, sort_keys=True, separators=(",", ":")) == target_json
    return False


@derived_object
class MetaScheduleDatabase(ms.database.PyDatabase):
    """MetaSchedule database over :class:`db.TuningStorage`, for one target.

    Args:
        storage: an open storage, or a URL (opened with :func:`db.open_storage`).
        target: the target (and hardware) every record read or written belongs to.
        job_id, worker: stored with each committed record (see :meth:`set_context`).
        record_cache_size: parsed ``TuningRecord`` objects kept in memory; rebuilding one replays
            its trace, and the evolutionary search asks for the same top records every round.

    Records committed through this object are stored under ``target`` whatever target the
    ``TuningRecord`` carries. Workloads are global (shared across targets and models).
    """

    def __init__(
        self,
        storage: TuningStorage | str,
        target: TargetSpec | TargetRecord,
        *,
        job_id: int | None = None,
        worker: str | None = None,
        record_cache_size: int = 4096,
    ) -> None:
        super().__init__()
        self._storage = open_storage(storage) if isinstance(storage, str) else storage
        spec = target.spec() if isinstance(target, TargetRecord) else target
        self._target_row = self._storage.ensure_target(spec)
        self._spec = spec
        self._target_dict = json.loads(spec.target_json)
        self._lock = threading.RLock()
        self._by_key: dict[str, tuple[int, Workload]] = {}
        self._by_id: dict[int, Workload] = {}
        self._by_object: dict[Workload, int] = {}
        self._records: OrderedDict[tuple, TuningRecord] = OrderedDict()
        self._record_cache_size = record_cache_size
        self.job_id = job_id
        self.worker = worker

    # -- plain accessors (not part of MetaSchedule's interface) -----------------------------
    @property
    def storage(self) -> TuningStorage:
        return self._storage

    @property
    def target_record(self) -> TargetRecord:
        return self._target_row

    @property
    def target_spec(self) -> TargetSpec:
        return self._spec

    @property
    def target(self) -> tvm.target.Target:
        """A TVM ``Target`` for this database's target (a new object on each call)."""
        return self._spec.tvm_target()

    def set_context(self, *, job_id: int | None = None, worker: str | None = None) -> None:
        """Attach ``job_id``/``worker`` to every record committed from now on (``None`` clears)."""
        self.job_id = job_id
        self.worker = worker

    def matches_target(self, target: tvm.target.Target | None) -> bool:
        """Whether ``target`` is this database's target (see :func:`same_target`)."""
        return target is None or same_target(self._spec.target_json, target)

    # -- workloads ---------------------------------------------------------------------------
    def _remember(self, key: str, workload_id: int, workload: Workload) -> Workload:
        with self._lock:
            existing = self._by_key.get(key)
            if existing is not None:
                workload = existing[1]
            else:
                self._by_key[key] = (workload_id, workload)
                self._by_id[workload_id] = workload
            self._by_object[workload] = workload_id
        return workload

    def has_workload(self, mod: tvm.IRModule) -> bool:
        key = workload_key(mod)
        if key in self._by_key:
            return True
        ids = self._storage.workload_ids([key])
        if key not in ids:
            return False
        self._remember(key, ids[key], Workload(mod))
        return True

    def commit_workload(self, mod: tvm.IRModule) -> Workload:
        key = workload_key(mod)
        cached = self._by_key.get(key)
        if cached is not None:
            return cached[1]
        ids = self._storage.workload_ids([key])
        if key in ids:
            workload_id = ids[key]
        else:
            workload_id = self._store_workload(key, mod)
        return self._remember(key, workload_id, Workload(mod))

    def _store_workload(self, key: str, mod: tvm.IRModule) -> int:
        mod_json = tvm.ir.save_json(mod)
        return self._storage.ensure_workload(
            key, mod_json, flops=estimate_flops(mod), summary=describe_workload(mod, mod_json)
        ).id

    def _workload_id(self, workload: Workload, *, create: bool) -> int | None:
        workload_id = self._by_object.get(workload)
        if workload_id is not None:
            return workload_id
        key = workload_key(workload.mod)
        cached = self._by_key.get(key)
        if cached is not None:
            workload_id = cached[0]
        else:
            ids = self._storage.workload_ids([key])
            if key in ids:
                workload_id = ids[key]
            elif create:
                workload_id = self._store_workload(key, workload.mod)
            else:
                return None
            self._remember(key, workload_id, workload)
        with self._lock:
            self._by_object[workload] = workload_id
        return workload_id

    def workload_id_of(self, workload: Workload) -> int | None:
        """The storage id of a workload this database committed or found (``None``: unknown;
        never stores one)."""
        return self._workload_id(workload, create=False)

    def _workload_for_id(self, workload_id: int) -> Workload:
        cached = self._by_id.get(workload_id)
        if cached is not None:
            return cached
        row = self._storage.get_workload_by_id(workload_id)
        if row is None:  # pragma: no cover - foreign keys make this impossible
            raise KeyError(workload_id)
        return self._remember(row.key, row.id, Workload(tvm.ir.load_json(row.mod_json)))

    # -- records -----------------------------------------------------------------------------
    def _new_record(self, record: TuningRecord) -> NewTuningRecord:
        workload_id = self._workload_id(record.workload, create=True)
        assert workload_id is not None
        return NewTuningRecord.from_metaschedule_json(
            workload_id,
            self._target_row.id,
            record_as_json(record),
            worker=self.worker,
            job_id=self.job_id,
        )

    def commit_tuning_record(self, record: TuningRecord) -> None:
        self._storage.commit_record(self._new_record(record))

    def commit_tuning_records(self, records: Sequence[TuningRecord]) -> None:
        """Store many MetaSchedule records in one transaction (not called by MetaSchedule)."""
        self._storage.commit_records([self._new_record(r) for r in records])

    def holds(self, mod: tvm.IRModule, candidates: Sequence[Any]) -> list[bool]:
        """For each MetaSchedule ``MeasureCandidate`` of workload ``mod``: whether a record of
        that very schedule (same trace, decisions included) is stored for this target, valid or
        failed. A workload the database does not know holds nothing."""
        workload = Workload(mod)
        workload_id = self._workload_id(workload, create=False)
        if workload_id is None:
            return [False] * len(candidates)
        return [
            self._storage.get_record(
                workload_id, self._target_row.id, schedule_key(candidate.sch.trace, workload)
            )
            is not None
            for candidate in candidates
        ]

    def record_failure(
        self,
        workload: Workload | tvm.IRModule,
        trace: Any,
        error_text: str,
        *,
        args_info: Any = None,
    ) -> None:
        """Store (or annotate) a failed candidate with the reason it failed.

        Args:
            workload: the task's ``Workload`` or its ``IRModule``.
            trace: the candidate's ``Trace`` (or its JSON object).
            error_text: the builder's or runner's error message.
            args_info: the ``ArgInfo`` list (its JSON with a JSON trace); defaults to the
                workload's.
        """
        if not isinstance(workload, Workload):
            workload = self.commit_workload(workload)
        workload_id = self._workload_id(workload, create=True)
        assert workload_id is not None
        if isinstance(trace, list | tuple):  # already JSON
            if args_info is None or (args_info and hasattr(args_info[0], "as_json")):
                infos = args_info or ms.arg_info.ArgInfo.from_entry_func(workload.mod)
                args_info = record_as_json(
                    TuningRecord(
                        tvm.s_tir.Schedule(workload.mod).trace, workload, None, None, list(infos)
                    )
                )[3]
            record_json = [trace, None, None, args_info]
        else:
            infos = args_info or ms.arg_info.ArgInfo.from_entry_func(workload.mod)
            record_json = record_as_json(TuningRecord(trace, workload, None, None, list(infos)))
        self._storage.commit_record(
            NewTuningRecord.from_metaschedule_json(
                workload_id,
                self._target_row.id,
                record_json,
                error_text=error_text,
                worker=self.worker,
                job_id=self.job_id,
            )
        )

    def _to_tuning_record(self, row: TuningRecordRow, workload: Workload) -> TuningRecord:
        cache_key = (row.id, row.mean_secs)
        with self._lock:
            cached = self._records.get(cache_key)
            if cached is not None:
                self._records.move_to_end(cache_key)
                return cached
        record = TuningRecord.from_json(
            [
                json.loads(row.trace_json),
                None if row.run_secs is None else list(row.run_secs),
                self._target_dict,
                json.loads(row.args_info_json),
            ],
            workload,
        )
        with self._lock:
            self._records[cache_key] = record
            while len(self._records) > self._record_cache_size:
                self._records.popitem(last=False)
        return record

    def get_top_k(self, workload: Workload, top_k: int) -> list[TuningRecord]:
        """Best first, valid only. Warm path: ids from the index, parsed records from the cache;
        only records not parsed yet (or improved since) are read in full and replayed."""
        if top_k <= 0:
            return []
        workload_id = self._workload_id(workload, create=False)
        if workload_id is None:
            return []
        keys = self._storage.top_k_ids(workload_id, self._target_row.id, int(top_k))
        with self._lock:
            found = {key: self._records.get(key) for key in keys}
            for key, rec in found.items():
                if rec is not None:
                    self._records.move_to_end(key)
        missing = [key[0] for key, rec in found.items() if rec is None]
        if missing:
            for row in self._storage.get_records(missing):
                # A record that does not parse for this workload (e.g. a module of the same
                # structural hash whose block names differ) is skipped, as query_tuning_record
                # skips one that does not replay: one record never fails a search or a build.
                try:
                    found[(row.id, row.mean_secs)] = self._to_tuning_record(row, workload)
                except Exception as err:  # noqa: BLE001 - TVM raises many kinds
                    logger.warning(
                        "record %s skipped: it does not apply to this workload (%s)",
                        row.id,
                        describe_error(err)[:300],
                    )
        # A record improved between the two reads is skipped this time rather than mislabelled.
        return [found[key] for key in keys if found.get(key) is not None]

    def get_all_tuning_records(self) -> list[TuningRecord]:
        return [
            self._to_tuning_record(row, self._workload_for_id(row.workload_id))
            for row in self._storage.iter_records(target_id=self._target_row.id)
        ]

    def __len__(self) -> int:
        return self._storage.count_records(target_id=self._target_row.id)

    def query_tuning_record(
        self, mod: tvm.IRModule, target: tvm.target.Target, workload_name: str | None = None
    ) -> TuningRecord | None:
        """The best valid record of ``mod`` for this target; ``None`` for any other target."""
        del workload_name  # workloads are identified by structural hash alone
        if not self.matches_target(target):
            return None
        key = workload_key(mod)
        cached = self._by_key.get(key)
        if cached is not None:
            workload_id, workload = cached
        else:
            ids = self._storage.workload_ids([key])
            if key not in ids:
                return None
            workload_id = ids[key]
            workload = self._remember(key, workload_id, Workload(mod))
        # The best record that replays: one bad record never fails a build (it is skipped
        # with a message and the next best is used).
        for row in self._storage.top_k(workload_id, self._target_row.id, QUERY_CANDIDATES):
            problem = replay_error(mod, json.loads(row.trace_json))
            if problem is None:
                try:
                    return self._to_tuning_record(row, workload)
                except Exception as err:  # noqa: BLE001 - TVM raises many kinds
                    problem = f"{type(err).__name__}: {err}"
            logger.warning(
                "record %s of workload %s skipped: it does not replay (%s)",
                row.id,
                key,
                problem[:300],
            )
        return None


@derived_object
class RecordErrorsCallback(ms.measure_callback.PyMeasureCallback):
    """Measure callback that keeps the error text of failed candidates in the database.

    Add it *after* the default callbacks (which commit the records)::

        callbacks = list(ms.measure_callback.MeasureCallback.create("default"))
        callbacks.append(db.RecordErrorsCallback(database))

    It never raises (an exception here would abort tuning); problems are logged.
    """

    def __init__(self, database: MetaScheduleDatabase) -> None:
        super().__init__()
        self.database = database

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        try:
            failures = []
            for candidate, built, ran in zip(
                measure_candidates, builder_results, runner_results, strict=False
            ):
                message = built.error_msg or (ran.error_msg if ran is not None else None)
                if message:
                    failures.append((candidate, str(message)))
            if not failures:
                return
            mod = task_scheduler.tasks_[task_id].ctx.mod
            workload = self.database.commit_workload(mod)
            for candidate, message in failures:
                self.database.record_failure(
                    workload, candidate.sch.trace, message, args_info=list(candidate.args_info)
                )
        except Exception:  # noqa: BLE001 - never abort tuning from a callback
            logger.exception("RecordErrorsCallback: could not store failure messages")
