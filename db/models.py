"""SQLAlchemy 2 ORM models: the schema of the tuning database.

The migrations in ``db/migrations/versions`` create exactly these tables; a change here needs a new
migration. Nothing outside :mod:`db` imports this module: the storage converts rows into the frozen
dataclasses of :mod:`db.types`.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    func,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

#: 64-bit ids on PostgreSQL; SQLite needs INTEGER PRIMARY KEY to alias the rowid.
BigId = BigInteger().with_variant(Integer(), "sqlite")

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

_STATUS_CHECK = "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _created() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


class WorkloadRow(Base):
    __tablename__ = "workloads"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    key: Mapped[str] = mapped_column(String(16), nullable=False, unique=True)
    mod_json: Mapped[str] = mapped_column(Text, nullable=False)
    flops: Mapped[float | None] = mapped_column(Float)
    summary: Mapped[str] = mapped_column(Text, nullable=False, server_default="")
    created_at: Mapped[datetime] = _created()


class TargetRow(Base):
    __tablename__ = "targets"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    key: Mapped[str] = mapped_column(String(16), nullable=False, unique=True)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    target_json: Mapped[str] = mapped_column(Text, nullable=False)
    fingerprint_json: Mapped[str] = mapped_column(Text, nullable=False)
    tvm_version: Mapped[str] = mapped_column(String(64), nullable=False)
    created_at: Mapped[datetime] = _created()


class TuningRecordModel(Base):
    __tablename__ = "tuning_records"
    __table_args__ = (
        UniqueConstraint("workload_id", "target_id", "trace_hash"),
        # Top-k is an index range scan in order; with ``id`` in the key it is index-only when only
        # ids are asked for (the adapter's warm path) and the ``ORDER BY mean_secs, id``
        # tie-break needs no sort.
        Index("ix_tuning_records_top_k", "workload_id", "target_id", "is_valid", "mean_secs", "id"),
        Index("ix_tuning_records_target", "target_id", "is_valid"),
        # A job's records in id order with what its history needs (the dashboard's curves):
        # an index-only range scan from any ``after`` id; also serves ``job_id`` counts.
        Index(
            "ix_tuning_records_job_history",
            "job_id",
            "id",
            "workload_id",
            "mean_secs",
            "measured_at",
        ),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    workload_id: Mapped[int] = mapped_column(
        ForeignKey("workloads.id", ondelete="CASCADE"), nullable=False
    )
    target_id: Mapped[int] = mapped_column(
        ForeignKey("targets.id", ondelete="CASCADE"), nullable=False
    )
    trace_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    trace_json: Mapped[str] = mapped_column(Text, nullable=False)
    run_secs_json: Mapped[str] = mapped_column(Text, nullable=False)
    mean_secs: Mapped[float | None] = mapped_column(Float)
    is_valid: Mapped[bool] = mapped_column(Boolean, nullable=False)
    error_text: Mapped[str | None] = mapped_column(Text)
    args_info_json: Mapped[str] = mapped_column(Text, nullable=False)
    measured_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    worker: Mapped[str | None] = mapped_column(String(128))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    #: Held as implausible, or quarantined by an operator: stored with ``is_valid`` false.
    quarantined: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=false())


class RemeasurementRow(Base):
    """A record's schedule measured again side by side with its task's other top records before a
    final build (:mod:`tuner.final_build.remeasure`): the mean run time of each round, their median
    and spread. Never changes the record's own measurement."""

    __tablename__ = "remeasurements"
    __table_args__ = (
        Index("ix_remeasurements_record", "record_id"),
        Index("ix_remeasurements_job", "job_id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    record_id: Mapped[int] = mapped_column(
        ForeignKey("tuning_records.id", ondelete="CASCADE"), nullable=False
    )
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    worker: Mapped[str | None] = mapped_column(String(128))
    rounds_json: Mapped[str] = mapped_column(Text, nullable=False)
    median_secs: Mapped[float] = mapped_column(Float, nullable=False)
    spread: Mapped[float] = mapped_column(Float, nullable=False)
    chosen: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=false())
    measured_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )


class LibraryRecordRow(Base):
    """A library call (e.g. OpenBLAS ``sgemm`` behind a shim) measured as one more candidate of
    a tuning task (issue 21): what was called (``library``, ``version``, ``call_json``), the time
    of each round, their median and spread. Shared by every model with the task, like a
    schedule; deleting the workload or target deletes it, deleting the job keeps it."""

    __tablename__ = "library_records"
    __table_args__ = (
        Index("ix_library_records_task", "workload_id", "target_id"),
        Index("ix_library_records_job", "job_id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    workload_id: Mapped[int] = mapped_column(
        ForeignKey("workloads.id", ondelete="CASCADE"), nullable=False
    )
    target_id: Mapped[int] = mapped_column(
        ForeignKey("targets.id", ondelete="CASCADE"), nullable=False
    )
    library: Mapped[str] = mapped_column(String(64), nullable=False)
    version: Mapped[str] = mapped_column(String(128), nullable=False)
    call_json: Mapped[str] = mapped_column(Text, nullable=False)
    run_secs_json: Mapped[str] = mapped_column(Text, nullable=False)
    median_secs: Mapped[float] = mapped_column(Float, nullable=False)
    spread: Mapped[float] = mapped_column(Float, nullable=False)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    worker: Mapped[str | None] = mapped_column(String(128))
    measured_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    #: Held as implausible (issue 31, migration 0012): never a best library record.
    quarantined: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=false())
    held_reason: Mapped[str | None] = mapped_column(String(512))


class IdFloorRow(Base):
    """The highest id ever handed out of a table whose rows are deleted (SQLite reuses the
    highest rowid after a delete; see migration 0006)."""

    __tablename__ = "id_floors"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    last_id: Mapped[int] = mapped_column(BigInteger, nullable=False)


class ModelRow(Base):
    __tablename__ = "models"
    __table_args__ = (UniqueConstraint("owner", "content_hash"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    content_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    format: Mapped[str] = mapped_column(String(16), nullable=False)
    filename: Mapped[str] = mapped_column(String(255), nullable=False)
    size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    owner: Mapped[str] = mapped_column(String(128), nullable=False)
    created_at: Mapped[datetime] = _created()
    #: The shape buckets of a model with symbolic dimensions (JSON), ``NULL`` for static ones.
    buckets_json: Mapped[str | None] = mapped_column(Text, nullable=True)


class ModelWorkloadRow(Base):
    __tablename__ = "model_workloads"
    __table_args__ = (UniqueConstraint("model_id", "workload_id", "task_name"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    model_id: Mapped[int] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), nullable=False
    )
    workload_id: Mapped[int] = mapped_column(
        ForeignKey("workloads.id", ondelete="CASCADE"), nullable=False, index=True
    )
    task_name: Mapped[str] = mapped_column(String(255), nullable=False)
    weight: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("1"))
    #: Why the task is not tuned (e.g. indexing ops that crash random-input measurement); NULL:
    #: tunable. Planning a distributed job reads it instead of re-importing the model.
    skip_reason: Mapped[str | None] = mapped_column(Text)


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(_STATUS_CHECK, name="status"),
        Index("ix_jobs_status_priority", "status", "priority"),
        Index("ix_jobs_owner", "owner", "id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    model_id: Mapped[int | None] = mapped_column(ForeignKey("models.id", ondelete="SET NULL"))
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id"), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False, server_default="queued")
    trial_budget: Mapped[int] = mapped_column(Integer, nullable=False)
    trials_done: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    priority: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    owner: Mapped[str | None] = mapped_column(String(128))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()
    #: The worker the job is pinned to (a ``tunehub tune`` run's, from its creation: no other
    #: worker plans or leases it), else ``None`` until the worker that finalized it.
    worker: Mapped[str | None] = mapped_column(String(128))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: What the job's runs' search features did, summed (:class:`tuner.jobs.protocol.SearchReport`
    #: JSON).
    search_json: Mapped[str | None] = mapped_column(Text)


class JobTaskRow(Base):
    __tablename__ = "job_tasks"
    __table_args__ = (
        CheckConstraint(_STATUS_CHECK, name="status"),
        UniqueConstraint("job_id", "workload_id"),
        Index("ix_job_tasks_status", "status"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"), nullable=False)
    name: Mapped[str] = mapped_column(String(255), nullable=False)
    weight: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("1"))
    flops: Mapped[float | None] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16), nullable=False, server_default="queued")
    trial_budget: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    trials_done: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    best_mean_secs: Mapped[float | None] = mapped_column(Float)
    leased_by: Mapped[str | None] = mapped_column(String(128))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()


class LeaseTaskRow(Base):
    """A task a tune lease covers. A tune lease covers one or several queued tasks of one job
    (their search shares the lease's trials, spread by MetaSchedule's gradient task scheduler);
    ``position`` 0 is the lease's own ``task_id``, the others follow in claim order."""

    __tablename__ = "lease_tasks"

    lease_id: Mapped[int] = mapped_column(
        ForeignKey("task_leases.id", ondelete="CASCADE"), primary_key=True
    )
    task_id: Mapped[int] = mapped_column(
        ForeignKey("job_tasks.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(Integer, nullable=False)


class TaskLeaseRow(Base):
    """A worker's lease: trial batches of one or several tasks of a job (``tune``; the tasks in
    ``lease_tasks``, the first of them in ``task_id``), a job's ``finalize`` step, or its
    ``preview`` (the zero-trial artifact built while the job tunes).

    ``work_key`` names the work (``task:<id>`` / ``finalize:<job id>`` / ``preview:<job id>``);
    at most one *active*
    lease per work key (partial unique index), so two claimers can never both hold it; and at
    most one *active* lease per worker (another), so a worker holds one piece of work at a time.
    ``expires_at`` moves forward with the worker's heartbeats and uploads (database clock).
    """

    __tablename__ = "task_leases"
    __table_args__ = (
        CheckConstraint("kind IN ('tune', 'finalize', 'preview')", name="kind"),
        CheckConstraint(
            "status IN ('active', 'done', 'expired', 'returned', 'failed', 'cancelled')",
            name="status",
        ),
        Index(
            "uq_task_leases_active_work",
            "work_key",
            unique=True,
            postgresql_where=text("status = 'active'"),
            sqlite_where=text("status = 'active'"),
        ),
        Index(
            "uq_task_leases_active_worker",
            "worker",
            unique=True,
            postgresql_where=text("status = 'active'"),
            sqlite_where=text("status = 'active'"),
        ),
        Index("ix_task_leases_worker", "worker", "status"),
        Index("ix_task_leases_job", "job_id", "id"),
        Index("ix_task_leases_expiry", "status", "expires_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False)
    task_id: Mapped[int | None] = mapped_column(ForeignKey("job_tasks.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    work_key: Mapped[str] = mapped_column(String(64), nullable=False)
    worker: Mapped[str] = mapped_column(String(128), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False, server_default="active")
    trials: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    trials_done: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    batches_done: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    task_links: Mapped[list[LeaseTaskRow]] = relationship(
        order_by=LeaseTaskRow.position, lazy="selectin", cascade="all, delete-orphan"
    )

    @property
    def task_ids(self) -> tuple[int, ...]:
        """The tasks of a tune lease, its own ``task_id`` first (empty for other kinds)."""
        return tuple(link.task_id for link in self.task_links)


class WorkerRow(Base):
    __tablename__ = "workers"
    __table_args__ = (CheckConstraint("status IN ('idle', 'busy', 'offline')", name="status"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), nullable=False, unique=True)
    fingerprint_json: Mapped[str] = mapped_column(Text, nullable=False, server_default="{}")
    target_id: Mapped[int | None] = mapped_column(ForeignKey("targets.id", ondelete="SET NULL"))
    status: Mapped[str] = mapped_column(String(16), nullable=False, server_default="idle")
    last_heartbeat: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _created()
    #: The worker token that registered the name (``None``: an in-process worker).
    token_id: Mapped[int | None] = mapped_column(BigId)
    #: The current registration: one process at a time holds the name.
    instance: Mapped[str | None] = mapped_column(String(64))


class ArtifactRow(Base):
    __tablename__ = "artifacts"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False, index=True
    )
    path: Mapped[str] = mapped_column(Text, nullable=False)
    sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    verified: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("false"))
    manifest_json: Mapped[str] = mapped_column(Text, nullable=False, server_default="{}")
    #: ``final`` (the job's result) or ``preview`` (its zero-trial build, published while it tunes)
    kind: Mapped[str] = mapped_column(String(16), nullable=False, server_default="final")
    created_at: Mapped[datetime] = _created()


class CostModelRow(Base):
    __tablename__ = "cost_models"
    __table_args__ = (Index("ix_cost_models_lookup", "target_id", "feature_version", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    target_id: Mapped[int] = mapped_column(
        ForeignKey("targets.id", ondelete="CASCADE"), nullable=False
    )
    blob: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    feature_version: Mapped[str] = mapped_column(String(32), nullable=False)
    tvm_version: Mapped[str] = mapped_column(String(64), nullable=False)
    n_samples: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    created_at: Mapped[datetime] = _created()


class ApiTokenRow(Base):
    __tablename__ = "api_tokens"
    __table_args__ = (CheckConstraint("kind IN ('user', 'worker')", name="kind"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), nullable=False)
    token_hash: Mapped[str] = mapped_column(String(128), nullable=False, unique=True)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    revoked: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("false"))
    created_at: Mapped[datetime] = _created()
