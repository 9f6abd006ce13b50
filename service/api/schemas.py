"""Request and response bodies of the REST API (Base / Create / Public, lists as ``{data, count}``).

Latencies are milliseconds (``*_ms``); timestamps are UTC ISO 8601. Public objects are built from
the storage's frozen dataclasses by the ``from_*`` constructors, never from ORM rows.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

import db
from tuner.jobs.protocol import SearchReport
from tuner.jobs.start import job_search

MAX_ID = 2**63 - 1
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$"
KEY_PATTERN = r"^[0-9a-f]{16}$"


def _ms(secs: float | None) -> float | None:
    return None if secs is None else secs * 1e3


class ErrorBody(BaseModel):
    detail: str = Field(description="what went wrong, for people")
    code: str = Field(description="a stable, machine-readable reason")


# -- models ----------------------------------------------------------------------------------
class ModelBase(BaseModel):
    filename: str
    format: Literal["onnx", "pt2"]


class ModelBuckets(BaseModel):
    """The shape buckets of a model with symbolic dimensions: one static specialization per
    value of each symbol (``compiler.shapes.buckets``)."""

    symbols: dict[str, list[int]]
    defaulted: list[str] = Field(
        default_factory=list, description="symbols given no buckets, which got the defaults"
    )
    description: str = ""
    shares: dict[str, list[float]] = Field(
        default_factory=dict,
        description="symbols whose buckets a histogram gave: the share of the expected inputs "
        "each bucket serves (task weights, and so the tuning budget, follow them)",
    )
    histograms: dict[str, str] = Field(
        default_factory=dict, description="those symbols' histograms, 'SIZE:COUNT,.../BUCKETS'"
    )


class ModelPublic(ModelBase):
    id: int
    size: int = Field(description="bytes")
    sha256: str
    created_at: datetime | None
    buckets: ModelBuckets | None = Field(
        default=None, description="shape buckets (a model with symbolic dimensions)"
    )

    @classmethod
    def from_record(cls, row: db.ModelRecord) -> ModelPublic:
        return cls(
            id=row.id,
            filename=row.filename,
            format=row.format,  # type: ignore[arg-type]
            size=row.size,
            sha256=row.content_hash,
            created_at=row.created_at,
            buckets=None
            if row.buckets_json is None
            else ModelBuckets.model_validate_json(row.buckets_json),
        )


class ModelTask(BaseModel):
    """One tuning task of a model (a workload of the shared tuning database)."""

    name: str
    key: str
    workload_id: int
    weight: int
    flops: float | None
    summary: str


class ModelDetail(ModelPublic):
    tasks: list[ModelTask]


class ModelsPublic(BaseModel):
    data: list[ModelPublic]
    count: int


# -- jobs ------------------------------------------------------------------------------------
class JobBase(BaseModel):
    model_id: int = Field(ge=1, le=MAX_ID)
    target: str = Field(
        "cpu",
        min_length=1,
        max_length=64,
        description="'cpu' (this server's CPU) or the 16-hex key of a known target",
    )
    trial_budget: int = Field(ge=0, le=1_000_000, description="measured candidates, all tasks")
    priority: int = Field(0, ge=-1000, le=1000, description="higher runs first")
    weights: Literal["as_exported", "q8_0", "q4_0"] = Field(
        "as_exported",
        description="the weight format of the 'cpu' target: as_exported, q8_0 or q4_0 "
        "(llama.cpp's 8- and 4-bit blocks, applied to the weight matrices at load and verified "
        "as quantized)",
    )


class JobCreate(JobBase):
    model_config = ConfigDict(extra="forbid")


class JobTaskPublic(BaseModel):
    id: int
    name: str
    workload_id: int
    status: str
    weight: int
    flops: float | None
    trial_budget: int
    trials_done: int
    best_latency_ms: float | None
    leased_by: str | None = Field(None, description="the worker holding this task's lease")

    @classmethod
    def from_task(cls, task: db.JobTask) -> JobTaskPublic:
        return cls(
            id=task.id,
            name=task.name,
            workload_id=task.workload_id,
            status=task.status,
            weight=task.weight,
            flops=task.flops,
            trial_budget=task.trial_budget,
            trials_done=task.trials_done,
            best_latency_ms=_ms(task.best_mean_secs),
            leased_by=task.leased_by,
        )


class ArtifactPublic(BaseModel):
    sha256: str
    size: int
    verified: bool
    built_by: str = Field(
        description="who built model.so: 'server' (the server compiled it from its stored "
        "records), 'worker' (a remote worker's library, checked by the server in a sandbox) "
        "or 'local' (a worker of this installation, on the database)"
    )
    review: str | None = Field(
        description="how the server checked a remote worker's artifact (the manifest's "
        "server_review.kind), null for a local worker's"
    )
    created_at: datetime | None
    library_url: str
    manifest_url: str

    @classmethod
    def of(cls, artifact: db.Artifact, base_url: str) -> ArtifactPublic:
        """``artifact`` with its download links under ``base_url`` (a job's artifacts folder)."""
        review = _json(artifact.manifest_json).get("server_review")
        review = review if isinstance(review, dict) else {}
        return cls(
            sha256=artifact.sha256,
            size=artifact.size,
            verified=artifact.verified,
            built_by=str(review.get("built_by") or "local"),
            review=review.get("kind"),
            created_at=artifact.created_at,
            library_url=f"{base_url}/model.so",
            manifest_url=f"{base_url}/manifest.json",
        )


class JobPublic(BaseModel):
    id: int
    model_id: int | None
    target_key: str | None
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    trial_budget: int
    trials_done: int
    priority: int
    error: str | None
    worker: str | None
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    url: str
    search: SearchReport | None = Field(
        None,
        description="what the search features did in the job's runs, summed (sibling "
        "seeds, stored schedules skipped, default schedules, cost model); null before any run "
        "reported",
    )

    @classmethod
    def from_job(cls, job: db.Job, *, target_key: str | None, prefix: str) -> JobPublic:
        return cls(
            id=job.id,
            model_id=job.model_id,
            target_key=target_key,
            status=job.status,  # type: ignore[arg-type]
            trial_budget=job.trial_budget,
            trials_done=job.trials_done,
            priority=job.priority,
            error=job.error,
            worker=job.worker,
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            url=f"{prefix}/jobs/{job.id}",
            search=job_search(job),
        )


class JobDetail(JobPublic):
    tasks: list[JobTaskPublic]
    best_latency_ms: float | None = Field(
        description="the fastest task's best latency so far (per-task bests are in tasks)"
    )
    estimated_latency_ms: float | None = Field(
        description="sum of weight x best latency over the job's tasks; "
        "null while any is unmeasured"
    )
    measured_latency_ms: float | None = Field(description="median of the verified artifact")
    reference_latency_ms: float | None = Field(
        None,
        description="median of the reference framework (ONNX Runtime, or torch for .pt2) on the "
        "same inputs, timed when the artifact was published (CPU targets)",
    )
    reference_framework: str | None = Field(None, description="'onnxruntime' or 'torch'")
    artifact: ArtifactPublic | None
    preview: ArtifactPublic | None = Field(
        None,
        description="the job's zero-trial build (library peers and TVM's default "
        "schedules), verified and published while the job tunes; null until a worker built it",
    )

    @classmethod
    def build(
        cls,
        job: db.Job,
        tasks: list[db.JobTask],
        artifact: db.Artifact | None,
        *,
        target_key: str | None,
        prefix: str,
        model_tasks: int | None = None,
        preview: db.Artifact | None = None,
    ) -> JobDetail:
        public = JobPublic.from_job(job, target_key=target_key, prefix=prefix)
        bests = [t.best_mean_secs for t in tasks if t.best_mean_secs is not None]
        covers_model = model_tasks is None or len(tasks) >= model_tasks
        estimated = (
            sum(t.weight * t.best_mean_secs for t in tasks)  # type: ignore[operator]
            if tasks and len(bests) == len(tasks) and covers_model
            else None
        )
        measured = None
        reference: dict[str, Any] = {}
        artifact_public = None
        if artifact is not None and job.status == db.JobStatus.SUCCEEDED and artifact.verified:
            manifest = _json(artifact.manifest_json)
            measured = (manifest.get("measured") or {}).get("median_ms")
            reference = manifest.get("reference") or {}
            reference = reference if isinstance(reference, dict) else {}
            if manifest.get("estimated_ms") is not None:
                estimated = manifest["estimated_ms"] / 1e3
            artifact_public = ArtifactPublic.of(artifact, f"{public.url}/artifacts")
        return cls(
            **public.model_dump(),
            tasks=[JobTaskPublic.from_task(t) for t in tasks],
            best_latency_ms=_ms(min(bests)) if bests else None,
            estimated_latency_ms=_ms(estimated),
            measured_latency_ms=measured,
            reference_latency_ms=reference.get("median_ms"),
            reference_framework=reference.get("framework"),
            artifact=artifact_public,
            preview=ArtifactPublic.of(preview, f"{public.url}/artifacts/preview")
            if preview is not None and preview.verified
            else None,
        )


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int


class HistoryPointPublic(BaseModel):
    """A record that lowered its task's best latency."""

    id: int = Field(description="the record's id")
    trial: int = Field(description="1-based position of the record among the job's records")
    workload_id: int
    best_ms: float = Field(description="the record's mean latency: the task's new best")
    measured_at: datetime | None

    @classmethod
    def from_point(cls, point: db.HistoryPoint) -> HistoryPointPublic:
        return cls(
            id=point.id,
            trial=point.trial,
            workload_id=point.workload_id,
            best_ms=point.mean_secs * 1e3,
            measured_at=point.measured_at,
        )


class JobHistoryPublic(BaseModel):
    """The job's records with ``after < id`` (at most ``limit``, id order), reduced to counts and
    the best-so-far curve of each task: ``points`` holds every record that lowered its task's
    best within this page, so keeping the minimum per task across pages gives the exact curves.
    Poll with ``after=last_id`` for what is new."""

    job_id: int
    after: int
    last_id: int = Field(description="pass as ?after= to read only newer records")
    trials_before: int = Field(description="the job's records with id <= after")
    records: int = Field(description="records in this page, valid and failed")
    failed: int
    more: bool = Field(description="true when the page stopped at the limit")
    first_measured_at: datetime | None
    last_measured_at: datetime | None
    points: list[HistoryPointPublic]

    @classmethod
    def from_page(cls, page: db.JobHistoryPage) -> JobHistoryPublic:
        return cls(
            job_id=page.job_id,
            after=page.after_id,
            last_id=page.last_id,
            trials_before=page.trials_before,
            records=page.records,
            failed=page.failed,
            more=page.more,
            first_measured_at=page.first_measured_at,
            last_measured_at=page.last_measured_at,
            points=[HistoryPointPublic.from_point(p) for p in page.points],
        )


# -- the tuning database ---------------------------------------------------------------------
class TargetPublic(BaseModel):
    id: int
    key: str
    kind: str
    description: str
    tvm_version: str

    @classmethod
    def from_record(cls, row: db.TargetRecord) -> TargetPublic:
        fp = _json(row.fingerprint_json)
        if row.kind == "cuda":
            description = f"cuda ({fp.get('gpu', '?')})"
        else:
            description = f"cpu {fp.get('mcpu')} x{fp.get('cores')} ({fp.get('cpu_model')})"
        return cls(
            id=row.id,
            key=row.key,
            kind=row.kind,
            description=description,
            tvm_version=row.tvm_version,
        )


class TargetsPublic(BaseModel):
    data: list[TargetPublic]
    count: int


class WorkloadPublic(BaseModel):
    id: int
    key: str
    summary: str
    flops: float | None
    records_valid: int
    records_failed: int
    best_latency_ms: float | None

    @classmethod
    def from_summary(cls, row: db.WorkloadSummary) -> WorkloadPublic:
        return cls(
            id=row.id,
            key=row.key,
            summary=row.summary,
            flops=row.flops,
            records_valid=row.records_valid,
            records_failed=row.records_failed,
            best_latency_ms=_ms(row.best_mean_secs),
        )


class WorkloadsPublic(BaseModel):
    data: list[WorkloadPublic]
    count: int


class RemeasurementPublic(BaseModel):
    """A record's schedule measured again side by side with its task's other top records before
    a final build (``tuner/final_build/remeasure.py``)."""

    rounds_ms: list[float] = Field(description="the mean run time of each round")
    median_ms: float
    spread: float = Field(description="(max - min) / median of the rounds")
    chosen: bool = Field(description="the final build used this schedule for its task")
    job_id: int | None
    worker: str | None
    measured_at: datetime | None

    @classmethod
    def from_row(cls, row: db.Remeasurement) -> RemeasurementPublic:
        return cls(
            rounds_ms=[s * 1e3 for s in row.rounds_secs],
            median_ms=row.median_secs * 1e3,
            spread=row.spread,
            chosen=row.chosen,
            job_id=row.job_id,
            worker=row.worker,
            measured_at=row.measured_at,
        )


class LibraryRecordPublic(BaseModel):
    """A library call (e.g. OpenBLAS sgemm behind a shim) measured as one more candidate of a
    tuning task (issue 21, "kernels as peers"), shared by every model with the task."""

    id: int
    workload_key: str
    target_key: str
    library: str = Field(description='the library called, e.g. "openblas"')
    version: str = Field(description="the library's version")
    call: dict[str, Any] = Field(description="what was called and how (a JSON object)")
    median_ms: float = Field(description="the median of rounds_ms")
    spread: float = Field(description="(max - min) / median of the rounds")
    rounds_ms: list[float] = Field(description="the run time of each measurement round")
    job_id: int | None
    worker: str | None
    measured_at: datetime | None
    quarantined: bool = Field(
        False,
        description="held as implausible (faster than its task physically allows): never a "
        "best, never built",
    )
    held_reason: str | None = Field(None, description="why it is held")

    @classmethod
    def from_row(cls, row: db.LibraryRecord) -> LibraryRecordPublic:
        return cls(
            id=row.id,
            workload_key=row.workload_key,
            target_key=row.target_key,
            library=row.library,
            version=row.version,
            call=row.call,
            median_ms=row.median_secs * 1e3,
            spread=row.spread,
            rounds_ms=[s * 1e3 for s in row.run_secs],
            job_id=row.job_id,
            worker=row.worker,
            measured_at=row.measured_at,
            quarantined=row.quarantined,
            held_reason=row.held_reason,
        )


class RecordPublic(BaseModel):
    id: int
    workload_id: int
    target_id: int
    trace_hash: str
    is_valid: bool
    mean_ms: float | None
    run_ms: list[float] | None
    error_text: str | None
    measured_at: datetime | None
    worker: str | None
    job_id: int | None
    quarantined: bool = Field(
        False,
        description="held as implausible or quarantined: not "
        "used by any best record or build (its claimed times in run_ms)",
    )
    repeats: int = Field(0, description="how many timings run_ms holds (the runner's repeats)")
    spread: float | None = Field(None, description="(max - min) / median of run_ms")
    remeasurements: list[RemeasurementPublic] = Field(
        default_factory=list, description="this schedule measured again before final builds"
    )
    trace: Any | None = Field(None, description="the schedule trace (with include_trace=true)")

    @classmethod
    def from_row(
        cls,
        row: db.TuningRecordRow,
        *,
        include_trace: bool,
        remeasurements: list[db.Remeasurement] = (),  # type: ignore[assignment]
    ) -> RecordPublic:
        run_ms = (
            None
            if row.run_secs is None or not (row.is_valid or row.quarantined)
            else [s * 1e3 for s in row.run_secs]
        )
        return cls(
            id=row.id,
            workload_id=row.workload_id,
            target_id=row.target_id,
            trace_hash=row.trace_hash,
            is_valid=row.is_valid,
            mean_ms=_ms(row.mean_secs),
            run_ms=run_ms,
            repeats=len(run_ms or ()),
            spread=db.types.spread(run_ms or ()),
            remeasurements=[RemeasurementPublic.from_row(r) for r in remeasurements],
            error_text=row.error_text,
            measured_at=row.measured_at,
            worker=row.worker,
            job_id=row.job_id,
            quarantined=row.quarantined,
            trace=json.loads(row.trace_json) if include_trace else None,
        )


class RecordsPublic(BaseModel):
    data: list[RecordPublic]
    count: int = Field(description="all records matching the filters")
    next_after: int | None = Field(description="pass as ?after= for the next page; null at the end")
    library_records: list[LibraryRecordPublic] = Field(
        default_factory=list,
        description="library calls measured as candidates of the task (issue 21), oldest first: "
        "those matching ?workload=, ?target= and ?job_id= when a workload or a job is given "
        "(?valid=true: those not held, ?valid=false: the held ones); one page of at most "
        "?limit= of them, from after ?library_after= (the same on every page of records)",
    )
    library_count: int = Field(0, description="all library records matching the filters")
    library_next_after: int | None = Field(
        None, description="pass as ?library_after= for the next page of library records"
    )


class StatsPublic(BaseModel):
    schema_revision: str | None
    workloads: int
    targets: int
    records: dict[str, int]
    models: int
    jobs: int
    jobs_by_status: dict[str, int]
    per_target: list[dict[str, Any]]


# -- workers ---------------------------------------------------------------------------------
class TargetSpecBody(BaseModel):
    """A target as a worker describes its own hardware (``compiler.target.TargetSpec``)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["cpu", "cuda"]
    target_json: str = Field(min_length=2, max_length=4096)
    fingerprint_json: str = Field(min_length=2, max_length=4096)
    tvm_version: str = Field(min_length=1, max_length=64)


class WorkerRegister(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    fingerprint: dict[
        str, str | int | float | bool | None | dict[str, str | int | float | bool | None]
    ] = Field(
        default_factory=dict,
        description="the machine's fingerprint (a CPU target's carries its compile options)",
    )
    target_key: str | None = Field(None, pattern=KEY_PATTERN)
    target: TargetSpecBody | None = Field(
        None, description="the worker's own target (registered if new); overrides target_key"
    )


class WorkerHeartbeat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: Literal["idle", "busy", "offline"] | None = None
    instance: str | None = Field(
        None,
        max_length=64,
        description="the registration's instance (from /register): a heartbeat of a replaced "
        "registration is refused (409) and renews nothing",
    )


class LeasePublic(BaseModel):
    """A lease: trial batches of one or several tasks of a job (``tune``), a job's ``finalize``
    step or its ``preview`` (the zero-trial build published while it tunes)."""

    id: int
    kind: Literal["tune", "finalize", "preview"]
    job_id: int | None = Field(description="null on a lease of another user's job")
    task_id: int | None = Field(description="a tune lease's first task")
    task_ids: list[int] = Field(
        default_factory=list, description="every task a tune lease covers, its first one first"
    )
    worker: str
    status: Literal["active", "done", "expired", "returned", "failed", "cancelled"]
    trials: int = Field(description="trials leased (tune)")
    trials_done: int = Field(description="trials uploaded and counted while the lease was active")
    batches_done: int
    error: str | None
    created_at: datetime | None
    expires_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def from_lease(cls, lease: db.TaskLease) -> LeasePublic:
        return cls(
            id=lease.id,
            kind=lease.kind,
            job_id=lease.job_id,  # type: ignore[arg-type]
            task_id=lease.task_id,
            task_ids=list(lease.task_ids),
            worker=lease.worker,
            status=lease.status,  # type: ignore[arg-type]
            trials=lease.trials,
            trials_done=lease.trials_done,
            batches_done=lease.batches_done,
            error=lease.error,
            created_at=lease.created_at,
            expires_at=lease.expires_at,
            finished_at=lease.finished_at,
        )


class LeasesPublic(BaseModel):
    data: list[LeasePublic]
    next_after: int | None = Field(description="pass as ?after= for the next page; null at the end")


class WorkerPublic(BaseModel):
    id: int
    name: str
    status: str
    target_id: int | None
    last_heartbeat: datetime | None
    target_key: str | None = None
    fingerprint: dict[str, Any] = Field(default_factory=dict)
    current_lease: LeasePublic | None = Field(None, description="the worker's active lease, if any")
    instance: str | None = Field(
        None,
        description="this registration (only in /register's answer): send it with "
        "heartbeats and lease requests",
    )

    @classmethod
    def from_worker(
        cls, row: db.Worker, *, target_key: str | None = None, lease: db.TaskLease | None = None
    ) -> WorkerPublic:
        return cls(
            id=row.id,
            name=row.name,
            status=row.status,
            target_id=row.target_id,
            last_heartbeat=row.last_heartbeat,
            target_key=target_key,
            fingerprint=_json(row.fingerprint_json),
            current_lease=None if lease is None else LeasePublic.from_lease(lease),
        )


class WorkersPublic(BaseModel):
    data: list[WorkerPublic]
    count: int


class WorkerHeartbeatReply(WorkerPublic):
    leases: list[int] = Field(description="the worker's active leases, renewed by this heartbeat")


# The worker protocol's messages (offers, lease contexts, batches, acks, lease ends) are defined
# once, in :mod:`tuner.jobs.protocol`, and used by the routes as they are.


# -- health ----------------------------------------------------------------------------------
class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready", "unavailable"]
    database: str
    schema_revision: str | None
    storage_dir_writable: bool
    detail: str | None = None
