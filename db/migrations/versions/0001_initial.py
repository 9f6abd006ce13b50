"""Initial schema: workloads, targets, tuning records, models, jobs, workers, artifacts,
cost models and API tokens.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("token_hash", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("revoked", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint("kind IN ('user', 'worker')", name=op.f("ck_api_tokens_kind")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
    )
    op.create_table(
        "models",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("content_hash", sa.String(length=64), nullable=False),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
        sa.UniqueConstraint("owner", "content_hash", name=op.f("uq_models_owner_content_hash")),
    )
    op.create_table(
        "targets",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("key", sa.String(length=16), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("target_json", sa.Text(), nullable=False),
        sa.Column("fingerprint_json", sa.Text(), nullable=False),
        sa.Column("tvm_version", sa.String(length=64), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_targets")),
        sa.UniqueConstraint("key", name=op.f("uq_targets_key")),
    )
    op.create_table(
        "workloads",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("key", sa.String(length=16), nullable=False),
        sa.Column("mod_json", sa.Text(), nullable=False),
        sa.Column("flops", sa.Float(), nullable=True),
        sa.Column("summary", sa.Text(), server_default="", nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workloads")),
        sa.UniqueConstraint("key", name=op.f("uq_workloads_key")),
    )
    op.create_table(
        "cost_models",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column(
            "target_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.Column("feature_version", sa.String(length=32), nullable=False),
        sa.Column("tvm_version", sa.String(length=64), nullable=False),
        sa.Column("n_samples", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["target_id"],
            ["targets.id"],
            name=op.f("fk_cost_models_target_id_targets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cost_models")),
    )
    with op.batch_alter_table("cost_models", schema=None) as batch_op:
        batch_op.create_index(
            "ix_cost_models_lookup", ["target_id", "feature_version", "id"], unique=False
        )

    op.create_table(
        "jobs",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("model_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column(
            "target_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("status", sa.String(length=16), server_default="queued", nullable=False),
        sa.Column("trial_budget", sa.Integer(), nullable=False),
        sa.Column("trials_done", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("priority", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')",
            name=op.f("ck_jobs_status"),
        ),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name=op.f("fk_jobs_model_id_models"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["target_id"], ["targets.id"], name=op.f("fk_jobs_target_id_targets")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_status_priority", ["status", "priority"], unique=False)

    op.create_table(
        "model_workloads",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("model_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column(
            "workload_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("task_name", sa.String(length=255), nullable=False),
        sa.Column("weight", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_model_workloads_model_id_models"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["workload_id"],
            ["workloads.id"],
            name=op.f("fk_model_workloads_workload_id_workloads"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_workloads")),
        sa.UniqueConstraint(
            "model_id",
            "workload_id",
            "task_name",
            name=op.f("uq_model_workloads_model_id_workload_id_task_name"),
        ),
    )
    with op.batch_alter_table("model_workloads", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_model_workloads_workload_id"), ["workload_id"], unique=False
        )

    op.create_table(
        "workers",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("fingerprint_json", sa.Text(), server_default="{}", nullable=False),
        sa.Column("target_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("status", sa.String(length=16), server_default="idle", nullable=False),
        sa.Column("last_heartbeat", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint("status IN ('idle', 'busy', 'offline')", name=op.f("ck_workers_status")),
        sa.ForeignKeyConstraint(
            ["target_id"],
            ["targets.id"],
            name=op.f("fk_workers_target_id_targets"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workers")),
        sa.UniqueConstraint("name", name=op.f("uq_workers_name")),
    )
    op.create_table(
        "artifacts",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("verified", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("manifest_json", sa.Text(), server_default="{}", nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_artifacts_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_artifacts")),
    )
    with op.batch_alter_table("artifacts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_artifacts_job_id"), ["job_id"], unique=False)

    op.create_table(
        "job_tasks",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column(
            "workload_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("weight", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.Column("flops", sa.Float(), nullable=True),
        sa.Column("status", sa.String(length=16), server_default="queued", nullable=False),
        sa.Column("trial_budget", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("trials_done", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("best_mean_secs", sa.Float(), nullable=True),
        sa.Column("leased_by", sa.String(length=128), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')",
            name=op.f("ck_job_tasks_status"),
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_tasks_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["workload_id"], ["workloads.id"], name=op.f("fk_job_tasks_workload_id_workloads")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_tasks")),
        sa.UniqueConstraint("job_id", "workload_id", name=op.f("uq_job_tasks_job_id_workload_id")),
    )
    with op.batch_alter_table("job_tasks", schema=None) as batch_op:
        batch_op.create_index("ix_job_tasks_status", ["status"], unique=False)

    op.create_table(
        "tuning_records",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column(
            "workload_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column(
            "target_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("trace_hash", sa.String(length=64), nullable=False),
        sa.Column("trace_json", sa.Text(), nullable=False),
        sa.Column("run_secs_json", sa.Text(), nullable=False),
        sa.Column("mean_secs", sa.Float(), nullable=True),
        sa.Column("is_valid", sa.Boolean(), nullable=False),
        sa.Column("error_text", sa.Text(), nullable=True),
        sa.Column("args_info_json", sa.Text(), nullable=False),
        sa.Column(
            "measured_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("worker", sa.String(length=128), nullable=True),
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_tuning_records_job_id_jobs"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["target_id"],
            ["targets.id"],
            name=op.f("fk_tuning_records_target_id_targets"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["workload_id"],
            ["workloads.id"],
            name=op.f("fk_tuning_records_workload_id_workloads"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuning_records")),
        sa.UniqueConstraint(
            "workload_id",
            "target_id",
            "trace_hash",
            name=op.f("uq_tuning_records_workload_id_target_id_trace_hash"),
        ),
    )
    with op.batch_alter_table("tuning_records", schema=None) as batch_op:
        batch_op.create_index("ix_tuning_records_job", ["job_id"], unique=False)
        batch_op.create_index("ix_tuning_records_target", ["target_id", "is_valid"], unique=False)
        batch_op.create_index(
            "ix_tuning_records_top_k",
            ["workload_id", "target_id", "is_valid", "mean_secs", "id"],
            unique=False,
        )


def downgrade() -> None:
    with op.batch_alter_table("tuning_records", schema=None) as batch_op:
        batch_op.drop_index("ix_tuning_records_top_k")
        batch_op.drop_index("ix_tuning_records_target")
        batch_op.drop_index("ix_tuning_records_job")

    op.drop_table("tuning_records")
    with op.batch_alter_table("job_tasks", schema=None) as batch_op:
        batch_op.drop_index("ix_job_tasks_status")

    op.drop_table("job_tasks")
    with op.batch_alter_table("artifacts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_artifacts_job_id"))

    op.drop_table("artifacts")
    op.drop_table("workers")
    with op.batch_alter_table("model_workloads", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_model_workloads_workload_id"))

    op.drop_table("model_workloads")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_status_priority")

    op.drop_table("jobs")
    with op.batch_alter_table("cost_models", schema=None) as batch_op:
        batch_op.drop_index("ix_cost_models_lookup")

    op.drop_table("cost_models")
    op.drop_table("workloads")
    op.drop_table("targets")
    op.drop_table("models")
    op.drop_table("api_tokens")
