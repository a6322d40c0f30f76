"""ORM rows of Kiln's database. They never leave :mod:`tuner.store`; the store converts them to entities.

JSON payloads are kept as ``Text`` holding ``json.dumps`` output so that SQLite and PostgreSQL store the
same bytes, and the MetaSchedule JSON (traces, workloads) round-trips exactly.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Alembic names constraints from these templates, so migrations and ORM metadata agree on every name.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# MetaSchedule commits candidates that failed to build or run with run_secs=[1e10].
FAILED_RUN_SEC = 1e10
# Anything at or above this mean is a failed candidate, never a schedule to apply.
VALID_RUN_SEC_LIMIT = 1e9


def utcnow() -> datetime:
    """The current time, timezone-aware, in UTC."""
    return datetime.now(timezone.utc)


def new_id() -> str:
    """A fresh primary key for models and jobs (uuid4, hex)."""
    return uuid.uuid4().hex


class UTCDateTime(sa.TypeDecorator[datetime]):
    """A timestamp stored in UTC and always read back timezone-aware.

    SQLite has no time zone type and returns naive values; PostgreSQL returns the session's zone.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r} given; Kiln stores timezone-aware UTC timestamps")
        return value.astimezone(timezone.utc)

    def process_result_value(self, value: Any | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    """Declarative base of every row."""

    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)


class ModelRow(Base):
    """An uploaded model; its bytes live at ``blob_path`` (relative to the data directory)."""

    __tablename__ = "models"
    # The same bytes are stored once per owner (and once on disk, named by sha256).
    __table_args__ = (sa.Index("uq_models_owner_sha256", "owner", "sha256", unique=True),)

    id: Mapped[str] = mapped_column(sa.String(32), primary_key=True, default=new_id)
    owner: Mapped[str] = mapped_column(sa.String(64), default="", server_default="")
    name: Mapped[str] = mapped_column(sa.String(255))
    format: Mapped[str] = mapped_column(sa.String(32))
    sha256: Mapped[str] = mapped_column(sa.String(64), index=True)
    size_bytes: Mapped[int] = mapped_column(sa.BigInteger)
    signature_json: Mapped[str] = mapped_column(sa.Text)
    blob_path: Mapped[str] = mapped_column(sa.String(1024))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class JobRow(Base):
    """A tuning job: its spec, life cycle and outcome."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(sa.String(32), primary_key=True, default=new_id)
    owner: Mapped[str] = mapped_column(sa.String(64), default="", server_default="", index=True)
    model_id: Mapped[str] = mapped_column(sa.ForeignKey("models.id"), index=True)
    spec_json: Mapped[str] = mapped_column(sa.Text)
    target_key: Mapped[str] = mapped_column(sa.String(255), index=True)
    status: Mapped[str] = mapped_column(sa.String(16), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    error: Mapped[str | None] = mapped_column(sa.Text)
    baseline_latency_ms: Mapped[float | None] = mapped_column(sa.Float)
    tuned_latency_ms: Mapped[float | None] = mapped_column(sa.Float)
    worker: Mapped[str | None] = mapped_column(sa.String(255))
    attempts: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    trials_done: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    trials_total: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    cancel_requested: Mapped[bool] = mapped_column(sa.Boolean, default=False, server_default=sa.false())
    stage: Mapped[str | None] = mapped_column(sa.String(32))
    # End-to-end latency (ms) of the peers measured beside the tuned build, e.g. {"onnxruntime": 0.1}.
    reference_latency_json: Mapped[str | None] = mapped_column(sa.Text)
    latency_report_json: Mapped[str | None] = mapped_column(sa.Text)
    accuracy_json: Mapped[str | None] = mapped_column(sa.Text)
    tuning_s: Mapped[float] = mapped_column(sa.Float, default=0.0, server_default="0")
    tuning_since: Mapped[datetime | None] = mapped_column(UTCDateTime)


class WorkloadRow(Base):
    """A task's TIR. ``shash`` may collide; the tuner tells workloads apart with structural equality."""

    __tablename__ = "workloads"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    shash: Mapped[str] = mapped_column(sa.String(32), index=True)
    workload_json: Mapped[str] = mapped_column(sa.Text)
    tir_script: Mapped[str] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    #: The same operator at other shapes shares it (schedules.transfer.workload_family); None: not yet
    #: computed (a workload stored before 0012) or not one PrimFunc.
    family: Mapped[str | None] = mapped_column(sa.String(32), index=True)
    #: The same first reduction block under other fused epilogues shares it (schedules.transfer.
    #: anchor_family); "" when it has none; None: not yet computed (a workload stored before 0014).
    anchor: Mapped[str | None] = mapped_column(sa.String(32), index=True)


class TaskRow(Base):
    """One task of a job, in the job's order (``position``), with its tuning progress."""

    __tablename__ = "tasks"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    workload_id: Mapped[int] = mapped_column(sa.ForeignKey("workloads.id"), index=True)
    name: Mapped[str] = mapped_column(sa.String(255))
    weight: Mapped[int] = mapped_column(sa.Integer)
    flops: Mapped[float] = mapped_column(sa.Float)
    trials: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    best_latency_us: Mapped[float | None] = mapped_column(sa.Float)
    position: Mapped[int] = mapped_column(sa.Integer)
    #: What the schedule space's hooks did in the task's search (JSON), for spaces that keep statistics.
    search_stats_json: Mapped[str | None] = mapped_column(sa.Text)
    #: Where the schedule compiled into the job's model came from (tuner.schedule_choice.ScheduleSource).
    schedule_source: Mapped[str | None] = mapped_column(sa.String(16))
    #: The tuned kernel's assembly as compiled into the job's model (zlib), and its instruction mix (JSON);
    #: loaded only when asked for.
    asm_zlib: Mapped[bytes | None] = mapped_column(sa.LargeBinary, deferred=True)
    asm_mix_json: Mapped[str | None] = mapped_column(sa.Text, deferred=True)


class TaskGroupRow(Base):
    """Some of a split job's tasks (``task_indices``, JSON positions), claimed and tuned by one worker."""

    __tablename__ = "task_groups"
    __table_args__ = (sa.UniqueConstraint("job_id", "index"),)

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    index: Mapped[int] = mapped_column(sa.Integer)
    task_indices_json: Mapped[str] = mapped_column(sa.Text)
    trials: Mapped[int | None] = mapped_column(sa.Integer)
    status: Mapped[str] = mapped_column(sa.String(16), index=True)
    worker: Mapped[str | None] = mapped_column(sa.String(255))
    attempts: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    error: Mapped[str | None] = mapped_column(sa.Text)


class TuningRecordRow(Base):
    """One measured candidate; failed ones are kept with ``mean_run_sec`` = 1e10."""

    __tablename__ = "tuning_records"
    __table_args__ = (sa.Index("ix_tuning_records_lookup", "workload_id", "target_key", "mean_run_sec"),)

    # BIGINT on PostgreSQL (records accumulate across every job); SQLite only autoincrements INTEGER.
    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    workload_id: Mapped[int] = mapped_column(sa.ForeignKey("workloads.id"), index=True)
    job_id: Mapped[str | None] = mapped_column(sa.ForeignKey("jobs.id", ondelete="SET NULL"), index=True)
    target_key: Mapped[str] = mapped_column(sa.String(255), index=True)
    target_json: Mapped[str] = mapped_column(sa.Text)
    trace_json: Mapped[str] = mapped_column(sa.Text)
    run_secs_json: Mapped[str] = mapped_column(sa.Text)
    mean_run_sec: Mapped[float] = mapped_column(sa.Float, index=True)
    error: Mapped[str | None] = mapped_column(sa.Text)
    args_info_json: Mapped[str] = mapped_column(sa.Text)
    record_json: Mapped[str] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ArtifactRow(Base):
    """The compiled package of a job (at most one per job)."""

    __tablename__ = "artifacts"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"), unique=True)
    path: Mapped[str] = mapped_column(sa.String(1024))
    sha256: Mapped[str] = mapped_column(sa.String(64))
    size_bytes: Mapped[int] = mapped_column(sa.BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ModelPlanRow(Base):
    """A model's task preview on one target (and shapes), computed once in the sandbox: its outcome, or
    the error that planning it ended with (so a model that cannot be planned is not retried per request)."""

    __tablename__ = "model_plans"
    __table_args__ = (sa.Index("uq_model_plans_model_id_plan_key", "model_id", "plan_key", unique=True),)

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    model_id: Mapped[str] = mapped_column(sa.ForeignKey("models.id", ondelete="CASCADE"))
    plan_key: Mapped[str] = mapped_column(sa.String(64))
    target_key: Mapped[str] = mapped_column(sa.String(512))
    error_kind: Mapped[str | None] = mapped_column(sa.String(64), nullable=True)
    error_message: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    tasks_json: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    fusion_json: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    graph: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class JobIrLevelRow(Base):
    """One level of a job's lowering (:class:`tuner.entities.IrLevel`): its text zlib-compressed, the rest
    of it as JSON."""

    __tablename__ = "job_ir_levels"
    __table_args__ = (sa.Index("uq_job_ir_levels_job_id_position", "job_id", "position", unique=True),)

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(sa.Integer)
    name: Mapped[str] = mapped_column(sa.String(128))
    changed: Mapped[bool] = mapped_column(sa.Boolean)
    text_zlib: Mapped[bytes] = mapped_column(sa.LargeBinary)
    summary_json: Mapped[str] = mapped_column(sa.Text)


class JobProfileRow(Base):
    """A job's profile of its compiled model (:class:`tuner.entities.ModelProfile` as JSON, compressed)."""

    __tablename__ = "job_profiles"

    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    profile_zlib: Mapped[bytes] = mapped_column(sa.LargeBinary)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class MachineLimitsRow(Base):
    """One host's measured roofs for one target (:class:`tuner.entities.MachineLimits`), measured once."""

    __tablename__ = "machine_limits"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    host: Mapped[str] = mapped_column(sa.String(512), unique=True, index=True)
    limits_json: Mapped[str] = mapped_column(sa.Text)
    measured_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class CostModelRow(Base):
    """The cost model trained on one target's records (of one owner, or of the shared pool: ``scope`` "")
    : MetaSchedule's XGBoost model with the features it was trained on (``XGBModel.save``'s tar)."""

    __tablename__ = "cost_models"
    __table_args__ = (sa.UniqueConstraint("target_key", "scope"),)

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    target_key: Mapped[str] = mapped_column(sa.String(255))
    scope: Mapped[str] = mapped_column(sa.String(64))
    samples: Mapped[int] = mapped_column(sa.Integer)
    #: the newest tuning record it has learnt from: records after it are what it has not seen
    last_record_id: Mapped[int] = mapped_column(sa.BigInteger)
    model_tar: Mapped[bytes] = mapped_column(sa.LargeBinary)
    trained_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ServerUseRow(Base):
    """How many candidates of one job one RPC server of a device key measured, first and last when."""

    __tablename__ = "server_uses"
    __table_args__ = (sa.UniqueConstraint("job_id", "server"),)

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    key: Mapped[str] = mapped_column(sa.String(255), index=True)
    server: Mapped[str] = mapped_column(sa.String(512))
    candidates: Mapped[int] = mapped_column(sa.Integer)
    first_used_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_used_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ApiTokenRow(Base):
    """A bearer token of the REST API; only its sha256 is stored. ``name`` owns models and jobs."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(sa.String(64), unique=True, index=True)
    token_sha256: Mapped[str] = mapped_column(sa.String(64), unique=True, index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
