"""Plain data exchanged between the coordinator (server side) and workers, over HTTP or in process.

A worker asks for work and gets a :class:`WorkOffer`: a lease of one job task's trials
(``kind="tune"``: the workload's TIR module, the trial count, the batch size) or of a job's
finalize step (``kind="finalize"``: the model to compile and the job's tasks). Measurements go
back as :class:`RecordUpload` batches, acknowledged with a :class:`BatchAck`. Nothing here imports
TVM or the database.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TargetInfo:
    """A target as the coordinator stores it (see :class:`compiler.target.TargetSpec`)."""

    key: str
    kind: str
    target_json: str
    fingerprint_json: str
    tvm_version: str

    def spec(self):
        from compiler.target import TargetSpec  # noqa: PLC0415 - keeps this module free of TVM

        return TargetSpec(self.kind, self.target_json, self.fingerprint_json, self.tvm_version)


@dataclass(frozen=True)
class JobTaskInfo:
    """A task of the job being finalized (what the artifact's manifest reports)."""

    workload_key: str
    name: str
    weight: int
    flops: float | None
    status: str
    trials_done: int
    best_mean_secs: float | None


@dataclass(frozen=True)
class WorkOffer:
    """One lease handed to a worker.

    Tune leases carry ``workload_key``/``workload_name``/``mod_json`` (``tvm.ir.save_json`` of the
    task's TIR module), ``trials`` and ``batch_size``; finalize leases carry the model
    (``model_*``) and the job's ``tasks``. ``expires_at`` is ISO 8601 (database clock): the worker
    keeps the lease by heartbeating well before it.
    """

    lease_id: int
    kind: str
    job_id: int
    target: TargetInfo
    expires_at: str | None
    trials: int = 0
    batch_size: int = 0
    task_id: int | None = None
    workload_key: str | None = None
    workload_name: str | None = None
    mod_json: str | None = None
    model_id: int | None = None
    model_sha256: str | None = None
    model_format: str | None = None
    model_filename: str | None = None
    job_trial_budget: int = 0
    job_trials_done: int = 0
    tasks: tuple[JobTaskInfo, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class RecordUpload:
    """One measured candidate: ``TuningRecord.as_json()``'s trace, run times and argument info;
    ``run_secs`` is ``[1e10]`` (or ``None``) for a failure, with ``error_text``."""

    trace: Any
    run_secs: tuple[float, ...] | None
    args_info: Any
    error_text: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "trace": self.trace,
            "run_secs": None if self.run_secs is None else list(self.run_secs),
            "args_info": self.args_info,
            "error_text": self.error_text,
        }


@dataclass(frozen=True)
class BatchAck:
    """The coordinator's answer to an uploaded batch.

    ``counted``: the batch's trials were added to the lease, task and job (false for a repeated
    upload or a lease no longer active: the records are stored all the same). ``keep_going``:
    the lease is still the worker's and its job still running.
    """

    accepted: int
    counted: bool
    keep_going: bool
    lease_status: str
    job_status: str
    trials_done: int


@dataclass(frozen=True)
class LeaseEnd:
    """What ending a lease left behind: the lease's final status and its job's status."""

    lease_status: str
    job_status: str
