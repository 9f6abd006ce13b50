"""The worker protocol's messages, defined once: the coordinator builds them, the REST API sends
them as they are (they are its request and response bodies), and workers parse them back.

A worker asks for work and gets a :class:`WorkOffer`: a lease of one job task's trials
(``kind="tune"``: the workload's TIR module, the trial count, the batch size) or of a job's
finalize step (``kind="finalize"``: the model to compile and the job's tasks) or preview
(``kind="preview"``: the same, built with no records while the job tunes). A tune lease then
fetches its :class:`LeaseContext` (the records its search starts from, the schedules the server
already holds, the task's siblings' best schedules). Measurements go back as
:class:`BatchUpload` batches, acknowledged with a :class:`BatchAck`; the lease ends with a
:class:`LeaseFinish` and its :class:`SearchReport`. All are frozen pydantic models; nothing here
imports TVM or the database.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tuner.engine.reports import SearchReport, SiblingSchedule


class _Message(BaseModel):
    """A protocol message the server sends: immutable; fields a newer server adds are ignored."""

    model_config = ConfigDict(frozen=True)


class _Request(BaseModel):
    """A protocol message a worker sends: immutable, and unknown fields are refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class TargetInfo(_Message):
    """A target as the coordinator stores it (see :class:`compiler.target.TargetSpec`)."""

    key: str
    kind: str
    target_json: str
    fingerprint_json: str
    tvm_version: str

    @classmethod
    def of(cls, target: Any) -> TargetInfo:
        """The info of anything with a target's five fields (a ``TargetSpec``, a target row)."""
        return cls(
            key=target.key,
            kind=target.kind,
            target_json=target.target_json,
            fingerprint_json=target.fingerprint_json,
            tvm_version=target.tvm_version,
        )

    def spec(self):
        from compiler.target import TargetSpec  # noqa: PLC0415 - keeps this module free of TVM

        return TargetSpec(self.kind, self.target_json, self.fingerprint_json, self.tvm_version)


class JobTaskInfo(_Message):
    """A task of the job being finalized (what the artifact's manifest reports)."""

    workload_key: str
    name: str
    weight: int
    flops: float | None
    status: str
    trials_done: int
    best_mean_secs: float | None


class LeasedTask(_Message):
    """One task of a tune lease: its job task, its workload and the workload's TIR module
    (``tvm.ir.save_json``)."""

    task_id: int
    workload_id: int
    workload_key: str
    workload_name: str
    mod_json: str


class WorkOffer(_Message):
    """One lease handed to a worker.

    ``tune``: measure ``trials`` candidates of the lease's tasks (``leased_tasks``: one or
    several workloads of the job; one search spreads the trials over them with MetaSchedule's
    gradient task scheduler) in batches of ``batch_size`` per task, each task's search starting
    from its :class:`LeaseContext`. The ``task_id``/``workload_*``/``mod_json`` fields repeat
    the first leased task (for workers that know only one); ``finalize``: compile the model
    (``model_url``) with the best records, verify it, upload the artifact; ``preview``: the
    same with no records (library peers and TVM's default schedules), published as the job's
    preview while it tunes. ``expires_at`` is ISO 8601 (database clock): the worker keeps the
    lease by heartbeating well before it.
    """

    lease_id: int
    kind: Literal["tune", "finalize", "preview"]
    job_id: int
    target: TargetInfo
    expires_at: str | None
    trials: int = 0
    batch_size: int = 0
    task_id: int | None = None
    workload_id: int | None = None
    workload_key: str | None = None
    workload_name: str | None = None
    mod_json: str | None = None
    model_id: int | None = None
    model_sha256: str | None = None
    model_format: str | None = None
    model_filename: str | None = None
    model_url: str | None = None
    #: The shape buckets of a model with symbolic dimensions (``ShapeBuckets.to_json()`` as
    #: JSON): the finalize step prepares the model with them, as its upload was validated.
    model_buckets: str | None = None
    job_trial_budget: int = 0
    job_trials_done: int = 0
    tasks: tuple[JobTaskInfo, ...] = ()
    leased_tasks: tuple[LeasedTask, ...] = ()


class LeaseOffer(_Message):
    """The answer to a lease request."""

    lease: WorkOffer | None = Field(description="null: no work for this worker right now")
    pending_jobs: int = Field(description="jobs of the worker's target still queued or running")


class LeaseContext(_Message):
    """What a tune lease's search starts from, as the server knows it when the lease begins.

    ``seeds``: the workload's best valid records on the target (``TuningRecord.as_json()``
    lists, best first): the search's initial population and the cost model's warm start.
    ``stored_keys``: the schedule keys (:func:`db.trace_hash` of the canonical trace) of every
    record the server holds for the workload, valid or failed: the search measures none of them
    again. ``siblings``: the best schedule of each sibling that runs at a higher FLOP/s than the
    task's own best, fastest first. ``flops``: the task's FLOP count (``None``: unknown).
    """

    workload_id: int
    flops: float | None
    seeds: tuple[list[Any], ...] = ()
    stored_keys: tuple[str, ...] = ()
    siblings: tuple[SiblingSchedule, ...] = ()


class SeedRecords(_Message):
    """A workload's best records on a target (what a finalize lease compiles with)."""

    data: list[list[Any]] = Field(
        description="TuningRecord.as_json() lists [trace, run_secs, target, args_info], best first"
    )
    count: int


class RecordUpload(_Request):
    """One measured candidate: ``TuningRecord.as_json()``'s trace, run times and argument info;
    ``run_secs`` is ``[1e10]`` (or ``None``) for a failure, with ``error_text``."""

    trace: list[Any] = Field(max_length=100_000, description="TuningRecord.as_json()[0]")
    run_secs: tuple[float, ...] | None = Field(
        max_length=1000, description="null or [1e10]: failed"
    )
    args_info: list[Any] = Field(max_length=1000)
    error_text: str | None = Field(None, max_length=20_000)


class BatchUpload(_Request):
    """One measured batch of one task of a tune lease (``task_id``: one of the lease's
    ``leased_tasks``; null: its first); ``batch`` numbers are 0, 1, ... per lease, whatever the
    task, and a repeated number counts once."""

    batch: int = Field(ge=0, le=10_000_000, description="0, 1, ... per lease; a repeat counts once")
    task_id: int | None = Field(None, description="the leased task measured (null: the first)")
    records: tuple[RecordUpload, ...] = Field(max_length=4096)


class BatchAck(_Message):
    """The coordinator's answer to an uploaded batch.

    ``counted``: the batch's trials were added to the lease, task and job (false for a repeated
    upload or a lease no longer active: the records are stored all the same). ``keep_going``:
    the lease is still the worker's and its job still running.
    """

    accepted: int = Field(description="records stored (duplicates keep the better measurement)")
    counted: bool = Field(
        description="the batch's trials were counted (false for a repeat or a "
        "lease no longer active)"
    )
    keep_going: bool = Field(description="false: stop tuning (lease lost or job no longer running)")
    lease_status: str
    job_status: str
    trials_done: int


class LeaseFinish(_Request):
    """How the worker ends its lease, with what its search did (tune leases)."""

    outcome: Literal["done", "returned", "failed", "cancelled"]
    error: str | None = Field(None, max_length=20_000)
    search: SearchReport | None = None


class LeaseEnd(_Message):
    """What ending a lease left behind: the lease's final status and its job's status."""

    lease_status: str
    job_status: str
