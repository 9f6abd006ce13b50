"""Frozen domain objects returned by the storage: callers never receive ORM rows.

All timestamps are timezone-aware UTC ``datetime`` objects taken from the database clock.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # pragma: no cover
    from compiler.target import TargetSpec

#: MetaSchedule stores a candidate that failed to build or run with ``run_secs=[1e10]``.
FAILED_RUN_SECS: Final = 1e10
#: Any measurement at or above this many seconds is a failure marker, not a latency.
_FAILURE_THRESHOLD: Final = 1e9


def trace_hash(trace_json: str) -> str:
    """sha256 hex digest of a trace's JSON text: the de-duplication key of a record."""
    return hashlib.sha256(trace_json.encode("utf-8")).hexdigest()


def dumps_compact(obj: object) -> str:
    """The JSON text TuneHub stores: no whitespace, key order kept (traces are lists)."""
    return json.dumps(obj, separators=(",", ":"))


def _ints_for_bools(obj: object) -> object:
    if isinstance(obj, bool):
        return int(obj)
    if isinstance(obj, list | tuple):
        return [_ints_for_bools(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _ints_for_bools(v) for k, v in obj.items()}
    return obj


def canonical_trace_json(trace: object) -> str:
    """The canonical JSON text of a trace (a ``Trace.as_json()`` object): what gets hashed.

    MetaSchedule writes one trace's boolean attributes as ``true``/``false`` from Python but as
    ``1``/``0`` after a round trip through its JSON files, so booleans become integers here
    (TVM reads both). Without this, the same schedule imported from a JSON database would be a
    second record.
    """
    return dumps_compact(_ints_for_bools(trace))


def measurement(run_secs: Sequence[float] | None) -> tuple[bool, float | None]:
    """``(is_valid, mean_secs)`` for a list of run times; failures give ``(False, None)``."""
    if not run_secs:
        return False, None
    values = [float(x) for x in run_secs]
    if any(not math.isfinite(v) or v <= 0.0 or v >= _FAILURE_THRESHOLD for v in values):
        return False, None
    return True, sum(values) / len(values)


def mean_run_secs(result: Any | None) -> float | None:
    """Mean measured seconds of one ``RunnerResult``, or ``None`` for a failed (or missing)
    measurement."""
    if result is None or result.error_msg:
        return None
    return measurement(result.run_secs)[1]


class JobStatus:
    """Status values of jobs and job tasks, and the transitions the storage allows."""

    QUEUED: Final = "queued"
    RUNNING: Final = "running"
    SUCCEEDED: Final = "succeeded"
    FAILED: Final = "failed"
    CANCELLED: Final = "cancelled"

    ALL: Final = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED)
    TERMINAL: Final = frozenset({SUCCEEDED, FAILED, CANCELLED})
    #: ``running -> queued`` is the requeue of work whose worker died or lost its lease.
    TRANSITIONS: Final = {
        QUEUED: frozenset({RUNNING, CANCELLED}),
        RUNNING: frozenset({SUCCEEDED, FAILED, CANCELLED, QUEUED}),
        SUCCEEDED: frozenset(),
        FAILED: frozenset(),
        CANCELLED: frozenset(),
    }

    @classmethod
    def allowed(cls, current: str, new: str) -> bool:
        return new in cls.TRANSITIONS.get(current, frozenset())


WORKER_STATUSES: Final = ("idle", "busy", "offline")


class LeaseStatus:
    """Status values of task leases. ``active`` is the only non-final one."""

    ACTIVE: Final = "active"
    DONE: Final = "done"
    EXPIRED: Final = "expired"
    RETURNED: Final = "returned"
    FAILED: Final = "failed"
    CANCELLED: Final = "cancelled"

    ALL: Final = (ACTIVE, DONE, EXPIRED, RETURNED, FAILED, CANCELLED)
    #: What a worker may end its own lease with (``expired`` is the reaper's).
    OUTCOMES: Final = (DONE, RETURNED, FAILED, CANCELLED)


LEASE_KINDS: Final = ("tune", "finalize", "preview")
TOKEN_KINDS: Final = ("user", "worker")


@dataclass(frozen=True)
class TargetRecord:
    """A row of ``targets``: one :class:`compiler.target.TargetSpec`."""

    id: int
    key: str
    kind: str
    target_json: str
    fingerprint_json: str
    tvm_version: str
    created_at: datetime | None = None

    def spec(self) -> TargetSpec:
        from compiler.target import TargetSpec  # noqa: PLC0415 - keeps `import db` free of TVM

        return TargetSpec(self.kind, self.target_json, self.fingerprint_json, self.tvm_version)


@dataclass(frozen=True)
class WorkloadRecord:
    """A row of ``workloads``: a TIR module keyed by :func:`compiler.keys.workload_key`.

    ``mod_json`` is ``tvm.ir.save_json(mod)``; ``flops`` may be unknown (``None``).
    """

    id: int
    key: str
    mod_json: str
    flops: float | None = None
    summary: str = ""
    created_at: datetime | None = None


@dataclass(frozen=True)
class NewTuningRecord:
    """A measurement to store (the input of :meth:`TuningStorage.commit_records`).

    ``trace_json`` is :func:`canonical_trace_json` of the trace and ``args_info_json`` the JSON
    text of the argument info of a MetaSchedule ``TuningRecord`` (see
    :meth:`from_metaschedule_json`); ``run_secs`` is ``None`` or ``[1e10]`` for a failed candidate,
    whose reason goes in ``error_text``.
    """

    workload_id: int
    target_id: int
    trace_json: str
    run_secs: tuple[float, ...] | None
    args_info_json: str = "[]"
    error_text: str | None = None
    worker: str | None = None
    job_id: int | None = None
    trace_hash: str = field(default="", compare=False)
    #: Held (implausible): stored with ``is_valid`` false and the claimed run times.
    quarantined: bool = False

    @classmethod
    def from_metaschedule_json(
        cls, workload_id: int, target_id: int, record_json: Sequence, **context: object
    ) -> NewTuningRecord:
        """Build from ``TuningRecord.as_json()`` (``[trace, run_secs, target, args_info]``; the
        record's own target is ignored). ``context``: ``error_text``, ``worker``, ``job_id``."""
        trace, run_secs, _target, args_info = record_json
        return cls(
            workload_id=workload_id,
            target_id=target_id,
            trace_json=canonical_trace_json(trace),
            run_secs=None if run_secs is None else tuple(float(x) for x in run_secs),
            args_info_json=dumps_compact(args_info if args_info is not None else []),
            **context,  # type: ignore[arg-type]
        )

    def __post_init__(self) -> None:
        if self.run_secs is not None and not isinstance(self.run_secs, tuple):
            object.__setattr__(self, "run_secs", tuple(float(x) for x in self.run_secs))
        if not self.trace_hash:
            object.__setattr__(self, "trace_hash", trace_hash(self.trace_json))

    @property
    def is_valid(self) -> bool:
        return measurement(self.run_secs)[0]

    @property
    def mean_secs(self) -> float | None:
        return measurement(self.run_secs)[1]


@dataclass(frozen=True)
class TuningRecordRow:
    """A stored measurement. ``mean_secs`` is ``None`` and ``is_valid`` false for failures."""

    id: int
    workload_id: int
    target_id: int
    trace_hash: str
    trace_json: str
    run_secs: tuple[float, ...] | None
    mean_secs: float | None
    is_valid: bool
    args_info_json: str
    error_text: str | None = None
    measured_at: datetime | None = None
    worker: str | None = None
    job_id: int | None = None
    quarantined: bool = False


@dataclass(frozen=True)
class NewRemeasurement:
    """A stored record's schedule measured again (the input of
    :meth:`TuningStorage.add_remeasurements`): ``rounds_secs`` holds the mean run time of each
    round (all finite and positive), ``chosen`` whether the final build used this schedule."""

    record_id: int
    rounds_secs: tuple[float, ...]
    chosen: bool = False
    job_id: int | None = None
    worker: str | None = None

    def __post_init__(self) -> None:
        values = tuple(float(x) for x in self.rounds_secs)
        if not values or any(not math.isfinite(v) or v <= 0.0 for v in values):
            raise ValueError("a re-measurement needs at least one finite, positive round time")
        object.__setattr__(self, "rounds_secs", values)

    @property
    def median_secs(self) -> float:
        return statistics.median(self.rounds_secs)

    @property
    def spread(self) -> float:
        """``(max - min) / median`` of the rounds: 0.0 for one round."""
        return spread(self.rounds_secs)  # type: ignore[return-value]


def spread(values: Sequence[float]) -> float | None:
    """``(max - min) / median`` of repeated timings (how far they scatter); ``None`` for none or
    a median that is not positive."""
    if not values:
        return None
    median = statistics.median(values)
    return (max(values) - min(values)) / median if median > 0 else None


@dataclass(frozen=True)
class Remeasurement:
    """A stored re-measurement of record ``record_id`` (see :class:`NewRemeasurement`)."""

    id: int
    record_id: int
    rounds_secs: tuple[float, ...]
    median_secs: float
    spread: float
    chosen: bool
    job_id: int | None = None
    worker: str | None = None
    measured_at: datetime | None = None


#: Bounds of a :class:`NewLibraryRecord` (the columns of ``library_records``, migration 0008).
LIBRARY_MAX_CHARS: Final = 64
LIBRARY_VERSION_MAX_CHARS: Final = 128
LIBRARY_CALL_MAX_BYTES: Final = 4096
LIBRARY_MAX_RUNS: Final = 64
WORKER_MAX_CHARS: Final = 128
HELD_REASON_MAX_CHARS: Final = 512


def canonical_call_json(call: object) -> str:
    """The text a library record's ``call`` is stored as: canonical compact JSON (sorted keys,
    no whitespace, no NaN or infinity) of a JSON object, at most ``LIBRARY_CALL_MAX_BYTES``
    bytes of UTF-8. Raises ``ValueError`` for anything else."""
    if not isinstance(call, Mapping):
        raise ValueError(f"a library call must be a JSON object, not {type(call).__name__}")
    if not all(isinstance(k, str) for k in call):
        raise ValueError("a library call's keys must be strings")
    try:
        text = json.dumps(
            dict(call), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError, RecursionError) as err:
        raise ValueError(f"a library call must be plain JSON: {err}") from None
    size = len(text.encode("utf-8"))
    if size > LIBRARY_CALL_MAX_BYTES:
        raise ValueError(
            f"a library call is at most {LIBRARY_CALL_MAX_BYTES} bytes of JSON, this one {size}"
        )
    return text


def _bounded_text(name: str, value: object, limit: int) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= limit:
        raise ValueError(
            f"a library record's {name} must be a string of 1..{limit} characters, "
            f"not {value!r:.80}"
        )
    return value


@dataclass(frozen=True)
class NewLibraryRecord:
    """A library call (e.g. OpenBLAS ``sgemm`` behind a shim) measured as one more candidate of
    a tuning task (issue 21, "kernels as peers"): the input of
    :meth:`TuningStorage.add_library_records`.

    ``workload_key`` and ``target_key`` name an existing workload and target (``workloads.key``,
    ``targets.key``); ``library`` (1..64 characters) and ``version`` (1..128) say what was
    called, ``call`` (a JSON object, at most 4096 bytes as canonical JSON) how; ``run_secs``
    holds 1..64 finite, positive times, one per measurement round. ``held_reason`` (1..512
    characters): the record is stored *held* (``quarantined``: implausible, never a best) and
    why; ``None``: not held. Checked on construction (``ValueError``); ``call`` is kept as the
    plain ``dict`` its canonical JSON reads back as (what will be stored) and ``run_secs`` as a
    tuple of floats.
    """

    workload_key: str
    target_key: str
    library: str
    version: str
    call: Mapping[str, Any]
    run_secs: tuple[float, ...]
    job_id: int | None = None
    worker: str | None = None
    held_reason: str | None = None

    def __post_init__(self) -> None:
        for name in ("workload_key", "target_key"):  # an unknown key: ConflictError on add
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"a library record's {name} must be a non-empty string")
        _bounded_text("library", self.library, LIBRARY_MAX_CHARS)
        _bounded_text("version", self.version, LIBRARY_VERSION_MAX_CHARS)
        if self.worker is not None:
            _bounded_text("worker", self.worker, WORKER_MAX_CHARS)
        if self.held_reason is not None:
            _bounded_text("held_reason", self.held_reason, HELD_REASON_MAX_CHARS)
        if self.job_id is not None and (
            isinstance(self.job_id, bool) or not isinstance(self.job_id, int)
        ):
            raise ValueError(
                f"a library record's job_id must be an int or None, not {self.job_id!r:.80}"
            )
        object.__setattr__(self, "call", json.loads(canonical_call_json(self.call)))
        raw = self.run_secs
        if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
            raise ValueError("a library record's run_secs must be a sequence of times")
        if any(isinstance(x, bool) or not isinstance(x, numbers.Real) for x in raw):
            raise ValueError("a library record's run_secs must be numbers")
        values = tuple(float(x) for x in raw)
        if not 1 <= len(values) <= LIBRARY_MAX_RUNS:
            raise ValueError(
                f"a library record needs 1..{LIBRARY_MAX_RUNS} run times, not {len(values)}"
            )
        if any(not math.isfinite(v) or v <= 0.0 for v in values):
            raise ValueError("a library record's run times must be finite and positive")
        object.__setattr__(self, "run_secs", values)

    @property
    def quarantined(self) -> bool:
        """Whether it is stored held (it has a ``held_reason``)."""
        return self.held_reason is not None

    @property
    def call_json(self) -> str:
        """``call`` as stored (:func:`canonical_call_json`)."""
        return canonical_call_json(self.call)

    @property
    def median_secs(self) -> float:
        return statistics.median(self.run_secs)

    @property
    def spread(self) -> float:
        """``(max - min) / median`` of the run times: 0.0 for one."""
        return spread(self.run_secs)  # type: ignore[return-value]


@dataclass(frozen=True)
class LibraryRecord:
    """A stored library record (see :class:`NewLibraryRecord`): ``median_secs`` is the median of
    ``run_secs``, ``spread`` their ``(max - min) / median``; ``quarantined``: held (never a
    best library record), ``held_reason`` why."""

    id: int
    workload_key: str
    target_key: str
    library: str
    version: str
    call: dict[str, Any]
    run_secs: tuple[float, ...]
    median_secs: float
    spread: float
    job_id: int | None
    worker: str | None
    measured_at: datetime
    quarantined: bool = False
    held_reason: str | None = None


@dataclass(frozen=True)
class WorkloadSummary:
    """A workload without its module text, with its records (on one target, if asked for one)."""

    id: int
    key: str
    summary: str
    flops: float | None
    records_valid: int
    records_failed: int
    best_mean_secs: float | None


@dataclass(frozen=True)
class TargetStats:
    target: TargetRecord
    records_valid: int
    records_failed: int
    workloads: int


@dataclass(frozen=True)
class DatabaseStats:
    """Counts shown by ``tunehub db stats``."""

    url: str
    schema_revision: str | None
    workloads: int
    targets: int
    records_valid: int
    records_failed: int
    models: int
    jobs: int
    per_target: tuple[TargetStats, ...] = ()

    def as_dict(self) -> dict:
        return {
            "url": self.url,
            "schema_revision": self.schema_revision,
            "workloads": self.workloads,
            "targets": self.targets,
            "records": {"valid": self.records_valid, "failed": self.records_failed},
            "models": self.models,
            "jobs": self.jobs,
            "per_target": [
                {
                    "key": t.target.key,
                    "kind": t.target.kind,
                    "target_json": t.target.target_json,
                    "fingerprint_json": t.target.fingerprint_json,
                    "tvm_version": t.target.tvm_version,
                    "workloads": t.workloads,
                    "records": {"valid": t.records_valid, "failed": t.records_failed},
                }
                for t in self.per_target
            ],
        }


@dataclass(frozen=True)
class ModelRecord:
    id: int
    content_hash: str
    format: str
    filename: str
    size: int
    owner: str
    created_at: datetime | None = None
    #: The shape buckets it was validated with (``ShapeBuckets.to_json()``), ``None``: static.
    buckets_json: str | None = None


@dataclass(frozen=True)
class ModelWorkload:
    """One tuning task of a model; ``skip_reason`` is set when the task is not tunable."""

    model_id: int
    workload_id: int
    task_name: str
    weight: int
    skip_reason: str | None = None


@dataclass(frozen=True)
class Job:
    id: int
    model_id: int | None
    target_id: int
    status: str
    trial_budget: int
    trials_done: int
    priority: int
    owner: str | None
    error: str | None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    worker: str | None = None
    search_json: str | None = None


@dataclass(frozen=True)
class NewJobTask:
    """A job task to create; ``status`` ``succeeded`` (with ``best_mean_secs``) records a task
    reused from earlier tuning, which needs no measurement."""

    workload_id: int
    name: str
    weight: int = 1
    flops: float | None = None
    trial_budget: int = 0
    status: str = JobStatus.QUEUED
    best_mean_secs: float | None = None


@dataclass(frozen=True)
class JobTask:
    id: int
    job_id: int
    workload_id: int
    name: str
    weight: int
    flops: float | None
    status: str
    trial_budget: int
    trials_done: int
    best_mean_secs: float | None
    leased_by: str | None = None
    lease_expires_at: datetime | None = None


@dataclass(frozen=True)
class JobProgress:
    """A job with everything its status page shows, read in one transaction."""

    job: Job
    tasks: tuple[JobTask, ...]
    artifacts: tuple[Artifact, ...]
    target_key: str
    model_tasks: int | None


@dataclass(frozen=True)
class HistoryPoint:
    """A record of a job that lowered its workload's best latency (within one history page)."""

    id: int
    #: 1-based position of the record among all the job's records, in id order.
    trial: int
    workload_id: int
    mean_secs: float
    measured_at: datetime | None


@dataclass(frozen=True)
class JobHistoryPage:
    """One page of a job's tuning history: the records with ``after_id < id``, at most a limit.

    ``points`` are the page's records that beat every earlier valid record *of the same page*
    for their workload, in id order: a superset of the job-wide improvements in the page, so a
    reader that keeps the best per workload across pages gets the exact best-so-far curves.
    """

    job_id: int
    after_id: int
    #: the highest record id in the page (``after_id`` when the page is empty): the next ``after``.
    last_id: int
    #: the job's records with ``id <= after_id``.
    trials_before: int
    records: int
    failed: int
    #: whether records past ``last_id`` exist (the page was cut at the limit).
    more: bool
    first_measured_at: datetime | None
    last_measured_at: datetime | None
    points: tuple[HistoryPoint, ...]


@dataclass(frozen=True)
class Worker:
    id: int
    name: str
    fingerprint_json: str
    target_id: int | None
    status: str
    last_heartbeat: datetime | None = None
    created_at: datetime | None = None
    token_id: int | None = None
    instance: str | None = None


@dataclass(frozen=True)
class TaskLease:
    """A worker's lease: ``trials`` shared by one or several tasks of a job (``kind='tune'``:
    ``task_ids``, the first of them ``task_id``) or the compile/verify/publish step of a job
    (``kind='finalize'``/``'preview'``: ``task_id`` ``None``, no ``task_ids``).

    ``trials_done``/``batches_done`` count the batches uploaded while the lease was active;
    ``expires_at`` is pushed forward by the worker's heartbeats and uploads (database clock).
    """

    id: int
    job_id: int
    task_id: int | None
    kind: str
    work_key: str
    worker: str
    status: str
    trials: int
    trials_done: int
    batches_done: int
    error: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    expires_at: datetime | None = None
    finished_at: datetime | None = None
    task_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class LeaseBatchResult:
    """What :meth:`TuningStorage.record_lease_batch` did: ``counted`` is false for a batch
    already counted (a retried upload) or a lease that is no longer active."""

    lease: TaskLease
    counted: bool
    job_status: str


@dataclass(frozen=True)
class Artifact:
    """A published library of a job: ``kind`` ``final`` (the job's result, built from its tuned
    records) or ``preview`` (its zero-trial build, published while the job tunes)."""

    id: int
    job_id: int
    path: str
    sha256: str
    size: int
    verified: bool
    manifest_json: str
    kind: str = "final"
    created_at: datetime | None = None


@dataclass(frozen=True)
class CostModelBlob:
    id: int
    target_id: int
    blob: bytes
    feature_version: str
    tvm_version: str
    n_samples: int
    created_at: datetime | None = None


@dataclass(frozen=True)
class ApiToken:
    id: int
    name: str
    token_hash: str
    kind: str
    revoked: bool
    created_at: datetime | None = None
