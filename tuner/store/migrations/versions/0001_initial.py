"""Initial schema: models, jobs, workloads, tasks, tuning records, artifacts.

Revision ID: 0001
Revises:
Create Date: 2026-05-20
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the column types as of this revision (never import them from tuner.store.orm,
# which moves on with later revisions).
UTC = sa.DateTime(timezone=True)
RECORD_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Create every table of Kiln 0.1."""
    op.create_table(
        "models",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("format", sa.String(32), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("signature_json", sa.Text(), nullable=False),
        sa.Column("blob_path", sa.String(1024), nullable=False),
        sa.Column("created_at", UTC, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_models"),
    )
    op.create_index("ix_models_sha256", "models", ["sha256"], unique=True)

    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("model_id", sa.String(32), nullable=False),
        sa.Column("spec_json", sa.Text(), nullable=False),
        sa.Column("target_key", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", UTC, nullable=False),
        sa.Column("started_at", UTC, nullable=True),
        sa.Column("finished_at", UTC, nullable=True),
        sa.Column("heartbeat_at", UTC, nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("baseline_latency_ms", sa.Float(), nullable=True),
        sa.Column("tuned_latency_ms", sa.Float(), nullable=True),
        sa.Column("worker", sa.String(255), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("trials_done", sa.Integer(), server_default="0", nullable=False),
        sa.Column("trials_total", sa.Integer(), server_default="0", nullable=False),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"], name="fk_jobs_model_id_models"),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
    )
    op.create_index("ix_jobs_model_id", "jobs", ["model_id"])
    op.create_index("ix_jobs_target_key", "jobs", ["target_key"])
    op.create_index("ix_jobs_status", "jobs", ["status"])

    op.create_table(
        "workloads",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("shash", sa.String(32), nullable=False),
        sa.Column("workload_json", sa.Text(), nullable=False),
        sa.Column("tir_script", sa.Text(), nullable=False),
        sa.Column("created_at", UTC, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_workloads"),
    )
    op.create_index("ix_workloads_shash", "workloads", ["shash"])

    op.create_table(
        "tasks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("weight", sa.Integer(), nullable=False),
        sa.Column("flops", sa.Float(), nullable=False),
        sa.Column("trials", sa.Integer(), server_default="0", nullable=False),
        sa.Column("best_latency_us", sa.Float(), nullable=True),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_tasks_job_id_jobs", ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["workload_id"], ["workloads.id"], name="fk_tasks_workload_id_workloads"),
        sa.PrimaryKeyConstraint("id", name="pk_tasks"),
    )
    op.create_index("ix_tasks_job_id", "tasks", ["job_id"])
    op.create_index("ix_tasks_workload_id", "tasks", ["workload_id"])

    op.create_table(
        "tuning_records",
        sa.Column("id", RECORD_ID, autoincrement=True, nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(32), nullable=True),
        sa.Column("target_key", sa.String(255), nullable=False),
        sa.Column("target_json", sa.Text(), nullable=False),
        sa.Column("trace_json", sa.Text(), nullable=False),
        sa.Column("run_secs_json", sa.Text(), nullable=False),
        sa.Column("mean_run_sec", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("args_info_json", sa.Text(), nullable=False),
        sa.Column("record_json", sa.Text(), nullable=False),
        sa.Column("created_at", UTC, nullable=False),
        sa.ForeignKeyConstraint(
            ["workload_id"], ["workloads.id"], name="fk_tuning_records_workload_id_workloads"
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_tuning_records_job_id_jobs", ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_tuning_records"),
    )
    op.create_index("ix_tuning_records_workload_id", "tuning_records", ["workload_id"])
    op.create_index("ix_tuning_records_job_id", "tuning_records", ["job_id"])
    op.create_index("ix_tuning_records_target_key", "tuning_records", ["target_key"])
    op.create_index("ix_tuning_records_mean_run_sec", "tuning_records", ["mean_run_sec"])
    op.create_index(
        "ix_tuning_records_lookup", "tuning_records", ["workload_id", "target_key", "mean_run_sec"]
    )

    op.create_table(
        "artifacts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("path", sa.String(1024), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", UTC, nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_artifacts_job_id_jobs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_artifacts"),
        sa.UniqueConstraint("job_id", name="uq_artifacts_job_id"),
    )


def downgrade() -> None:
    """Drop every table (and its data)."""
    op.drop_table("artifacts")
    op.drop_table("tuning_records")
    op.drop_table("tasks")
    op.drop_table("workloads")
    op.drop_table("jobs")
    op.drop_table("models")
