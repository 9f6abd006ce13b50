"""TuneHub settings, read from ``TUNEHUB_*`` environment variables (pydantic-settings).

One class for the CLI, the service and the workers, so a limit set once applies everywhere.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from compiler.frontends.model_spec import ModelLimits


class Settings(BaseSettings):
    """Environment: ``TUNEHUB_MAX_MODEL_BYTES``, ``TUNEHUB_DATABASE_URL``, ``TUNEHUB_PORT``, ..."""

    model_config = SettingsConfigDict(env_prefix="TUNEHUB_", extra="ignore")

    # -- model validation (the compiler's limits) ----------------------------------------------
    max_model_bytes: int = Field(512 * 1024 * 1024, gt=0, description="largest accepted model file")
    max_input_elements: int = Field(1 << 26, gt=0, description="largest declared input tensor")
    max_total_input_bytes: int = Field(1 << 30, gt=0, description="all inputs together")
    max_model_nodes: int = Field(20_000, gt=0, description="operator nodes of a model's graph")
    max_constant_elements: int = Field(
        1 << 27, gt=0, description="elements of any tensor built at compile time (folded constants)"
    )
    max_constant_bytes: int = Field(
        1 << 29, gt=0, description="bytes of any tensor built at compile time (folded constants)"
    )
    max_pt2_programs: int = Field(
        8,
        gt=0,
        le=256,
        description="programs one .pt2 archive may hold (each is loaded, tuned and verified)",
    )
    local_max_model_bytes: int = Field(
        16 << 30,
        gt=0,
        description="largest model file the CLI (inspect, compile, tune) reads from local disk, "
        "and its largest compile-time constant: the machine's own user, not an upload (a "
        "1.2 B-parameter fp32 decoder is ~5 GB, its embedding ~0.5 GB)",
    )
    validation_timeout_secs: float = Field(
        120.0, gt=0, description="an upload's validation is stopped (and refused) after this long"
    )
    validation_memory_bytes: int = Field(
        4 << 30, gt=0, description="memory one upload's validation process may allocate"
    )
    validation_queue_secs: float = Field(
        60.0, ge=0, description="how long an upload waits for a free validation slot (then 503)"
    )

    # -- the service ---------------------------------------------------------------------------
    database_url: str | None = Field(
        None, description="tuning database URL (default: the embedded SQLite file in the home)"
    )
    home: Path | None = Field(None, description="local state directory (default ~/.tunehub)")
    storage_dir: Path | None = Field(
        None, description="uploaded models and artifacts (default: $TUNEHUB_HOME/storage)"
    )
    max_upload_bytes: int = Field(
        512 * 1024 * 1024, gt=0, description="largest upload (also bounded by max_model_bytes)"
    )
    host: str = Field("127.0.0.1", description="address `tunehub serve` binds")
    port: int = Field(8470, ge=0, le=65535, description="port `tunehub serve` binds")
    public_url: str | None = Field(None, description="URL printed for clients (default from host)")
    token_file: Path | None = Field(
        None, description="where serve keeps the local user token (default $TUNEHUB_HOME/token)"
    )
    validation_concurrency: int = Field(
        2, ge=1, description="upload validations at once (each in its own process)"
    )
    api_threads: int = Field(
        8, ge=1, le=256, description="request threads (each holds one database connection)"
    )
    metrics_public: bool = Field(True, description="serve /metrics without a token")
    job_status_cache_secs: float = Field(
        0.25, ge=0, description="how long a job's status page is reused (polled by many clients)"
    )
    token_cache_secs: float = Field(
        5.0, ge=0, description="how long a token lookup is cached (a revocation's delay)"
    )
    history_cache_jobs: int = Field(
        64, ge=0, description="jobs whose whole tuning history is kept between reads (0: none)"
    )

    # -- request bodies (service.api.request_guard; model uploads: max_upload_bytes) -----------
    max_json_body_bytes: int = Field(
        1 << 20,
        gt=0,
        description="largest request body of every route but the uploads below (JSON bodies "
        "of a few KiB: jobs, registrations, heartbeats, lease ends)",
    )
    max_batch_body_bytes: int = Field(
        16 << 20,
        gt=0,
        description="largest measured batch a worker uploads (POST /workers/leases/{id}/records); "
        "a batch of 64 records is about 0.15 MiB, 1.5 MiB with the longest error texts",
    )
    max_artifact_body_bytes: int | None = Field(
        None,
        gt=0,
        description="largest artifact upload (POST /workers/leases/{id}/artifact: model.so and "
        "manifest.json); default: the upload limit plus 4 MiB for the manifest",
    )

    # -- workers -------------------------------------------------------------------------------
    search_population: int = Field(
        128, ge=4, description="evolutionary-search population per task (smaller: faster)"
    )
    search_seed: int | None = Field(None, description="search seed (reproducible runs)")
    worker_poll_secs: float = Field(1.0, gt=0, description="idle worker's claim interval")
    cost_model_retrain_secs: float = Field(
        600.0,
        gt=0,
        description="an idle embedded worker checks this often whether enough new "
        "records arrived to retrain the transferred cost model",
    )
    heartbeat_secs: float = Field(5.0, gt=0, description="worker heartbeat interval")
    worker_nice: int = Field(
        10,
        ge=0,
        le=19,
        description="CPU niceness of serve's embedded workers (API stays responsive)",
    )
    stale_after_secs: float = Field(
        60.0, gt=0, description="a running job's worker is dead after this long without heartbeat"
    )

    lease_secs: float = Field(
        60.0,
        gt=0,
        description="a worker's lease expires this long after its last heartbeat or upload",
    )
    lease_batches: int = Field(
        4, ge=1, le=1000, description="measured batches of each task per tune lease"
    )
    lease_tasks: int = Field(
        4,
        ge=1,
        le=1000,
        description="tasks of one job a tune lease covers at most (one search spreads its "
        "trials over them with MetaSchedule's gradient task scheduler)",
    )
    lease_max_attempts: int = Field(
        3,
        ge=1,
        description="a task (or finalize step) whose leases expire or fail this often fails",
    )
    worker_retry_secs: float = Field(
        300.0, gt=0, description="how long a worker retries an unreachable server before giving up"
    )
    max_workers_per_token: int = Field(
        64,
        ge=1,
        description="worker names one worker token may register (`tunehub worker --concurrency "
        "N` registers N)",
    )

    # -- a remote worker's artifact (tuner.final_build.artifact_review) ----------------------------
    server_build: bool = Field(
        True,
        description="build a remote worker's artifact on the server from the stored records "
        "(where the server can build for the target); off: check the worker's library in a "
        "sandbox instead",
    )
    artifact_review_secs: float = Field(
        600.0, gt=0, description="the server's build or sandboxed check of an artifact stops here"
    )
    artifact_review_memory_bytes: int = Field(
        8 << 30, gt=0, description="address space of the server's build or check process"
    )

    def lease_policy(self):
        from tuner.jobs.coordinator import LeasePolicy  # noqa: PLC0415 - settings stay free of TVM

        return LeasePolicy(
            lease_secs=self.lease_secs,
            batches_per_lease=self.lease_batches,
            max_attempts=self.lease_max_attempts,
            tasks_per_lease=self.lease_tasks,
        )

    def model_limits(self) -> ModelLimits:
        return ModelLimits(
            max_bytes=self.max_model_bytes,
            max_input_elements=self.max_input_elements,
            max_total_input_bytes=self.max_total_input_bytes,
            max_nodes=self.max_model_nodes,
            max_constant_elements=self.max_constant_elements,
            max_constant_bytes=self.max_constant_bytes,
            max_programs=self.max_pt2_programs,
        )

    def local_model_limits(self) -> ModelLimits:
        """:meth:`model_limits` for a model file the CLI reads from local disk: a file of at
        most ``local_max_model_bytes``, constants up to that size (or the upload limit's, if
        larger), the other limits as for uploads."""
        limits = self.model_limits()
        size = self.local_max_model_bytes
        return dataclasses.replace(
            limits,
            max_bytes=size,
            max_constant_bytes=max(limits.max_constant_bytes, size),
            max_constant_elements=max(limits.max_constant_elements, size // 4),
        )

    def validation_limits(self):
        from service.validation import ValidationLimits  # noqa: PLC0415 - and of the compiler

        return ValidationLimits(
            timeout_secs=self.validation_timeout_secs, memory_bytes=self.validation_memory_bytes
        )

    @property
    def upload_limit(self) -> int:
        return min(self.max_upload_bytes, self.max_model_bytes)

    @property
    def artifact_body_limit(self) -> int:
        """Bytes an artifact upload's whole multipart body may have."""
        if self.max_artifact_body_bytes is not None:
            return self.max_artifact_body_bytes
        return self.upload_limit + (4 << 20) + (64 << 10)

    def home_dir(self) -> Path:
        if self.home is not None:
            return self.home.expanduser()
        from db import tunehub_home  # noqa: PLC0415 - and of SQLAlchemy

        return tunehub_home()

    def resolved_storage_dir(self) -> Path:
        return (self.storage_dir or self.home_dir() / "storage").expanduser().absolute()

    def resolved_token_file(self) -> Path:
        return (self.token_file or self.home_dir() / "token").expanduser()

    def resolved_database_url(self) -> tuple[str, bool]:
        """``(url, is_embedded_default)``: the embedded default is the home's SQLite file."""
        if self.database_url:
            return self.database_url, False
        return f"sqlite:///{self.home_dir() / 'tunehub.db'}", True

    def base_url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = self.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
