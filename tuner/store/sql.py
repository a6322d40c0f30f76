"""Kiln's SQL store: the one place that opens sessions. It speaks entities, never ORM rows.

Works on SQLite (the embedded default, one file in the data directory) and on PostgreSQL (shared by a
pool of workers). The schema is owned by alembic; :meth:`Store.ensure_schema` refuses an old one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta, timezone
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from tuner.entities import (
    ApiToken,
    Artifact,
    BestRecord,
    FusionSummary,
    Job,
    JobSpec,
    JobStatus,
    ModelFormat,
    ModelInfo,
    ModelPlan,
    ModelSignature,
    PlanError,
    Record,
    StoredRecord,
    StoredWorkload,
    Task,
    TaskInfo,
    TimelineEntry,
)
from tuner.errors import Conflict, NotFound, SchemaOutdated
from tuner.store.models import (
    FAILED_RUN_SEC,
    VALID_RUN_SEC_LIMIT,
    ApiTokenRow,
    ArtifactRow,
    Base,
    JobRow,
    ModelPlanRow,
    ModelRow,
    TaskRow,
    TuningRecordRow,
    WorkloadRow,
    utcnow,
)

if TYPE_CHECKING:
    from tuner.settings import Settings

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000
# Execution option read by the SQLite "begin" hook: which BEGIN a connection of this engine emits.
_SQLITE_BEGIN = "kiln_sqlite_begin"


def alembic_config(connection: sa.Connection | None = None, url: str | None = None) -> Config:
    """Alembic configuration for Kiln's migrations, built in code (no ``alembic.ini``).

    Pass ``connection`` to run migrations on it; ``url`` is used only when no connection is given.
    """
    cfg = Config()
    # ConfigParser interpolates '%', which may appear in paths and URLs.
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    cfg.set_main_option("path_separator", "os")
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Take BEGIN away from the sqlite3 module (it defers it past SELECTs, breaking read-modify-write);
    # _sqlite_on_begin emits it instead.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        # WAL lets the web server read while a tuning worker writes.
        cursor.execute("PRAGMA journal_mode=WAL")
    finally:
        cursor.close()


def _sqlite_on_begin(conn: sa.Connection) -> None:
    # Writers take the write lock up front (BEGIN IMMEDIATE): a deferred transaction that reads first
    # cannot wait for the lock later in WAL mode and fails with "database is locked" at once.
    conn.exec_driver_sql(conn.get_execution_options().get(_SQLITE_BEGIN, "BEGIN"))


def normalize_url(url: str) -> sa.URL:
    """Parse a database URL; a bare ``postgresql://`` gets the psycopg (3) driver Kiln installs."""
    parsed = sa.make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def _create_engine(url: str) -> sa.Engine:
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = sa.create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        sa.event.listen(engine, "connect", _sqlite_on_connect)
        sa.event.listen(engine, "begin", _sqlite_on_begin)
        return engine
    return sa.create_engine(parsed, pool_pre_ping=True)


def _describe(exc: IntegrityError) -> str:
    detail = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc)
    return f"the change conflicts with data already stored ({detail})"


def _mean_run_sec(run_secs: list[float]) -> float:
    """Mean run time of a candidate; failed or unmeasured candidates get MetaSchedule's 1e10."""
    if not run_secs or not all(math.isfinite(x) and x >= 0 for x in run_secs):
        return FAILED_RUN_SEC
    return sum(run_secs) / len(run_secs)


def _is_valid(mean_run_sec: float) -> bool:
    return mean_run_sec < VALID_RUN_SEC_LIMIT


# ---- row -> entity -----------------------------------------------------------------------------------


def _model(row: ModelRow) -> ModelInfo:
    return ModelInfo(
        id=row.id,
        name=row.name,
        format=ModelFormat(row.format),
        sha256=row.sha256,
        size_bytes=row.size_bytes,
        signature=ModelSignature.from_dict(json.loads(row.signature_json)),
        created_at=row.created_at,
        owner=row.owner,
    )


def _job(row: JobRow) -> Job:
    return Job(
        id=row.id,
        spec=JobSpec.from_dict(json.loads(row.spec_json)),
        target_key=row.target_key,
        status=JobStatus(row.status),
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        error=row.error,
        baseline_latency_ms=row.baseline_latency_ms,
        tuned_latency_ms=row.tuned_latency_ms,
        worker=row.worker,
        attempts=row.attempts,
        owner=row.owner,
        heartbeat_at=row.heartbeat_at,
        cancel_requested=bool(row.cancel_requested),
        stage=row.stage,
        trials_done=row.trials_done,
        trials_total=row.trials_total,
        reference_latency_ms=json.loads(row.reference_latency_json) if row.reference_latency_json else {},
    )


def _task(row: TaskRow, shash: str) -> Task:
    return Task(
        id=row.id,
        job_id=row.job_id,
        workload_id=row.workload_id,
        name=row.name,
        weight=row.weight,
        flops=row.flops,
        workload_hash=shash,
        trials=row.trials,
        best_latency_us=row.best_latency_us,
    )


def _record(row: TuningRecordRow) -> Record:
    return Record(
        id=row.id,
        workload_id=row.workload_id,
        job_id=row.job_id,
        target_key=row.target_key,
        run_secs=tuple(float(x) for x in json.loads(row.run_secs_json)),
        mean_latency_us=row.mean_run_sec * 1e6 if _is_valid(row.mean_run_sec) else None,
        trace=json.loads(row.trace_json),
        created_at=row.created_at,
        error=row.error,
    )


def _artifact(row: ArtifactRow) -> Artifact:
    return Artifact(
        id=row.id,
        job_id=row.job_id,
        path=row.path,
        sha256=row.sha256,
        size_bytes=row.size_bytes,
        created_at=row.created_at,
    )


class Store:
    """Models, jobs, tasks, workloads, tuning records and artifacts in one SQL database."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._engine = _create_engine(url)
        self._read_sessions = sessionmaker(self._engine, expire_on_commit=False)
        writer = self._engine.execution_options(**{_SQLITE_BEGIN: "BEGIN IMMEDIATE"})
        self._write_sessions = sessionmaker(writer, expire_on_commit=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> Store:
        """The store the settings point at; creates the data directory for SQLite."""
        url = settings.resolved_database_url
        parsed = sa.make_url(url)
        if parsed.get_backend_name() == "sqlite":
            settings.data_dir.mkdir(parents=True, exist_ok=True)
            if parsed.database and parsed.database != ":memory:" and not parsed.database.startswith("file:"):
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        return cls(url)

    def __repr__(self) -> str:
        return f"Store({self._engine.url.render_as_string(hide_password=True)!r})"

    @property
    def engine(self) -> sa.Engine:
        """The SQLAlchemy engine (for migrations tooling and tests; application code uses methods)."""
        return self._engine

    @property
    def backend(self) -> str:
        """The database backend: ``"sqlite"`` or ``"postgresql"``."""
        return self._engine.dialect.name

    def dispose(self) -> None:
        """Close every pooled connection."""
        self._engine.dispose()

    @contextmanager
    def session_scope(self, *, write: bool = True, conflict: str | None = None) -> Iterator[Session]:
        """A session that commits on success and rolls back on error (for the store's methods and tests).

        An integrity violation becomes :class:`Conflict` (with ``conflict`` as its message when given);
        other database errors pass through. ``write=False`` lets SQLite readers run beside a writer.
        """
        session = (self._write_sessions if write else self._read_sessions)()
        try:
            yield session
            session.commit()
        except IntegrityError as exc:
            session.rollback()
            raise Conflict(conflict or _describe(exc)) from exc
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    # ---- schema ------------------------------------------------------------------------------------

    @cached_property
    def _scripts(self) -> ScriptDirectory:
        return ScriptDirectory.from_config(alembic_config())

    def upgrade(self, revision: str = "head") -> None:
        """Migrate the database to ``revision`` (the latest by default)."""
        with self._engine.begin() as conn:
            command.upgrade(alembic_config(conn), revision)

    def current_revision(self) -> str | None:
        """The alembic revision the database is at (None for a database Kiln never migrated)."""
        with self._engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def head_revision(self) -> str:
        """The revision this version of Kiln needs."""
        head = self._scripts.get_current_head()
        assert head is not None, "Kiln ships at least one migration"
        return head

    def ensure_schema(self, auto_create: bool = True) -> None:
        """Check that the schema is current; create it in an empty database when ``auto_create``.

        Raises :class:`SchemaOutdated` (saying which command fixes it) for any other revision.
        """
        head = self.head_revision()
        with self._engine.connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
            tables = set(sa.inspect(conn).get_table_names())
        if current == head:
            return
        if current is None and not tables & set(Base.metadata.tables):
            if auto_create:
                log.info("creating Kiln's schema (revision %s) in an empty database", head)
                self.upgrade()
                return
            raise SchemaOutdated(f"the database has no Kiln schema, Kiln needs {head}: run `kiln db upgrade`")
        if current is not None and not self._known_revision(current):
            raise SchemaOutdated(
                f"database schema is at revision {current}, which this version of Kiln does not know "
                f"(it needs {head}): upgrade Kiln or point it at another database"
            )
        raise SchemaOutdated(
            f"database schema is at revision {current or 'none'}, Kiln needs {head}: run `kiln db upgrade`"
        )

    def _known_revision(self, revision: str) -> bool:
        try:
            return self._scripts.get_revision(revision) is not None
        except CommandError:
            return False

    # ---- models ------------------------------------------------------------------------------------

    def add_model(
        self,
        *,
        name: str,
        format: ModelFormat,
        sha256: str,
        size_bytes: int,
        signature: ModelSignature,
        blob_path: str,
        owner: str = "",
    ) -> tuple[ModelInfo, bool]:
        """Store a model's metadata; the same bytes (sha256) from the same owner give back that model.

        Returns the model and whether it was newly created.
        """
        try:
            with self.session_scope() as s:
                existing = s.scalars(
                    sa.select(ModelRow).where(ModelRow.sha256 == sha256, ModelRow.owner == owner)
                ).first()
                if existing is not None:
                    return _model(existing), False
                row = ModelRow(
                    owner=owner,
                    name=name,
                    format=ModelFormat(format).value,
                    sha256=sha256,
                    size_bytes=size_bytes,
                    signature_json=json.dumps(signature.to_dict()),
                    blob_path=blob_path,
                )
                s.add(row)
                s.flush()
                created = _model(row)
        except Conflict:
            # A concurrent upload of the same bytes committed first.
            raced = self.find_model_by_sha256(sha256, owner)
            if raced is None:
                raise
            return raced, False
        return created, True

    def get_model(self, model_id: str, owner: str | None = None) -> ModelInfo:
        """The model with this id (owned by ``owner`` when given); :class:`NotFound` otherwise."""
        with self.session_scope(write=False) as s:
            return _model(self._model_row(s, model_id, owner))

    def find_model_by_sha256(self, sha256: str, owner: str = "") -> ModelInfo | None:
        """The owner's model with these bytes, if stored."""
        with self.session_scope(write=False) as s:
            row = s.scalars(
                sa.select(ModelRow).where(ModelRow.sha256 == sha256, ModelRow.owner == owner)
            ).first()
            return _model(row) if row is not None else None

    def list_models(self, owner: str | None = None) -> list[ModelInfo]:
        """Every model (of ``owner`` when given), newest first."""
        query = sa.select(ModelRow).order_by(ModelRow.created_at.desc(), ModelRow.id)
        if owner is not None:
            query = query.where(ModelRow.owner == owner)
        with self.session_scope(write=False) as s:
            return [_model(r) for r in s.scalars(query)]

    def model_blob_path(self, model_id: str) -> str:
        """Where the model's bytes are stored, relative to the data directory."""
        with self.session_scope(write=False) as s:
            return self._model_row(s, model_id).blob_path

    @staticmethod
    def _model_row(s: Session, model_id: str, owner: str | None = None) -> ModelRow:
        row = s.get(ModelRow, model_id)
        # Another owner's model is reported exactly like a missing one.
        if row is None or (owner is not None and row.owner != owner):
            raise NotFound(f"model '{model_id}' not found")
        return row

    # ---- jobs --------------------------------------------------------------------------------------

    def create_job(self, spec: JobSpec, target_key: str, owner: str = "") -> Job:
        """Queue a job for ``spec``; ``target_key`` is the canonical target its records are keyed by."""
        with self.session_scope() as s:
            self._model_row(s, spec.model_id, owner or None)
            row = JobRow(
                owner=owner,
                model_id=spec.model_id,
                spec_json=json.dumps(spec.to_dict()),
                target_key=target_key,
                status=JobStatus.QUEUED.value,
                attempts=0,
                trials_done=0,
                trials_total=0,
            )
            s.add(row)
            s.flush()
            return _job(row)

    def get_job(self, job_id: str, owner: str | None = None) -> Job:
        """The job with this id (owned by ``owner`` when given); :class:`NotFound` otherwise."""
        with self.session_scope(write=False) as s:
            return _job(self._job_row(s, job_id, owner=owner))

    def list_jobs(
        self,
        status: JobStatus | None = None,
        limit: int = 100,
        offset: int = 0,
        owner: str | None = None,
    ) -> list[Job]:
        """Jobs, newest first, optionally only those with ``status`` and of ``owner``."""
        query = _job_filter(sa.select(JobRow), status, owner)
        query = query.order_by(JobRow.created_at.desc(), JobRow.id.desc())
        with self.session_scope(write=False) as s:
            return [_job(r) for r in s.scalars(query.limit(limit).offset(offset))]

    def count_jobs(self, status: JobStatus | None = None, owner: str | None = None) -> int:
        """How many jobs :meth:`list_jobs` would page through."""
        query = _job_filter(sa.select(sa.func.count(JobRow.id)), status, owner)
        with self.session_scope(write=False) as s:
            return int(s.scalar(query) or 0)

    def mark_job_running(self, job_id: str, worker: str) -> Job:
        """Move a queued job to running on ``worker``; counts the attempt.

        Raises :class:`Conflict` when the job is not queued (already running, finished or cancelled).
        """
        now = utcnow()
        with self.session_scope() as s:
            # One conditional UPDATE, so that two workers cannot both start the same job.
            result = s.execute(
                sa.update(JobRow)
                .where(JobRow.id == job_id, JobRow.status == JobStatus.QUEUED.value)
                .values(
                    status=JobStatus.RUNNING.value,
                    worker=worker,
                    started_at=now,
                    heartbeat_at=now,
                    attempts=JobRow.attempts + 1,
                )
                .execution_options(synchronize_session=False)
            )
            row = self._job_row(s, job_id, fresh=True)
            if _rowcount(result) == 0:
                raise Conflict(f"job '{job_id}' is {row.status}; only a queued job can start")
            return _job(row)

    def finish_job(
        self,
        job_id: str,
        status: JobStatus,
        *,
        error: str | None = None,
        baseline_latency_ms: float | None = None,
        tuned_latency_ms: float | None = None,
        reference_latency_ms: dict[str, float] | None = None,
    ) -> Job:
        """Record a job's outcome (succeeded, failed or cancelled).

        Raises :class:`Conflict` when the job already finished: a cancelled job stays cancelled.
        """
        status = JobStatus(status)
        if not status.finished:
            raise ValueError(f"finish_job needs a final status, not '{status.value}'")
        values: dict[str, Any] = {
            "status": status.value,
            "finished_at": utcnow(),
            "error": error,
            "stage": None,
        }
        if baseline_latency_ms is not None:
            values["baseline_latency_ms"] = baseline_latency_ms
        if tuned_latency_ms is not None:
            values["tuned_latency_ms"] = tuned_latency_ms
        if reference_latency_ms:
            values["reference_latency_json"] = json.dumps(reference_latency_ms)
        unfinished = [JobStatus.QUEUED.value, JobStatus.RUNNING.value]
        with self.session_scope() as s:
            result = s.execute(
                sa.update(JobRow)
                .where(JobRow.id == job_id, JobRow.status.in_(unfinished))
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            row = self._job_row(s, job_id, fresh=True)
            if _rowcount(result) == 0:
                raise Conflict(f"job '{job_id}' already finished ({row.status})")
            return _job(row)

    def update_job_progress(self, job_id: str, trials_done: int, trials_total: int) -> None:
        """Record how many trials of the job's budget have been measured."""
        with self.session_scope() as s:
            result = s.execute(
                sa.update(JobRow)
                .where(JobRow.id == job_id)
                .values(trials_done=trials_done, trials_total=trials_total)
                .execution_options(synchronize_session=False)
            )
            if _rowcount(result) == 0:
                raise NotFound(f"job '{job_id}' not found")

    def job_progress(self, job_id: str) -> dict[str, int]:
        """Trials done/total and tasks done/total; a task is done once it has trials or a best latency."""
        with self.session_scope(write=False) as s:
            row = self._job_row(s, job_id)
            task_done = sa.or_(TaskRow.trials > 0, TaskRow.best_latency_us.is_not(None))
            tasks_total, tasks_done = s.execute(
                sa.select(
                    sa.func.count(TaskRow.id),
                    sa.func.count(TaskRow.id).filter(task_done),
                ).where(TaskRow.job_id == job_id)
            ).one()
            return {
                "trials_done": row.trials_done,
                "trials_total": row.trials_total,
                "tasks_done": int(tasks_done),
                "tasks_total": int(tasks_total),
            }

    def set_job_stage(self, job_id: str, stage: str) -> None:
        """Record what a running job is doing (importing, tuning, compiling, ...)."""
        with self.session_scope() as s:
            s.execute(
                sa.update(JobRow)
                .where(JobRow.id == job_id)
                .values(stage=stage[:32])
                .execution_options(synchronize_session=False)
            )

    # ---- the job queue -----------------------------------------------------------------------------

    def claim_job(self, worker: str) -> Job | None:
        """Atomically move the oldest queued job to running on ``worker`` (counting the attempt).

        PostgreSQL: ``UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING``, so workers
        racing for jobs never take the same one and never wait on each other's row. SQLite: the
        write transaction (BEGIN IMMEDIATE) already serializes every claimer. None when the queue is empty.
        """
        oldest = (
            sa.select(JobRow.id)
            .where(JobRow.status == JobStatus.QUEUED.value)
            .order_by(JobRow.created_at, JobRow.id)
            .limit(1)
        )
        if self.backend == "postgresql":
            oldest = oldest.with_for_update(skip_locked=True)
        now = utcnow()
        with self.session_scope() as s:
            job_id = s.execute(
                sa.update(JobRow)
                .where(JobRow.id == oldest.scalar_subquery(), JobRow.status == JobStatus.QUEUED.value)
                .values(
                    status=JobStatus.RUNNING.value,
                    worker=worker,
                    started_at=now,
                    heartbeat_at=now,
                    stage="starting",
                    attempts=JobRow.attempts + 1,
                )
                .returning(JobRow.id)
                .execution_options(synchronize_session=False)
            ).scalar_one_or_none()
            if job_id is None:
                return None
            return _job(self._job_row(s, job_id, fresh=True))

    def heartbeat(self, job_id: str, worker: str) -> Job | None:
        """Mark ``worker`` alive on its running job; None when the job is no longer running on it."""
        with self.session_scope() as s:
            result = s.execute(
                sa.update(JobRow)
                .where(
                    JobRow.id == job_id,
                    JobRow.status == JobStatus.RUNNING.value,
                    JobRow.worker == worker,
                )
                .values(heartbeat_at=utcnow())
                .execution_options(synchronize_session=False)
            )
            if _rowcount(result) == 0:
                return None
            return _job(self._job_row(s, job_id, fresh=True))

    def request_cancel(self, job_id: str, owner: str | None = None) -> Job:
        """Cancel a job: a queued one at once, a running one by asking its worker to stop.

        Raises :class:`Conflict` for a job that already finished.
        """
        with self.session_scope() as s:
            self._job_row(s, job_id, owner=owner)
            base = sa.update(JobRow).execution_options(synchronize_session=False)
            queued = s.execute(
                base.where(JobRow.id == job_id, JobRow.status == JobStatus.QUEUED.value).values(
                    status=JobStatus.CANCELLED.value,
                    finished_at=utcnow(),
                    error="cancelled before it started",
                    stage=None,
                )
            )
            if _rowcount(queued) == 0:
                s.execute(
                    base.where(JobRow.id == job_id, JobRow.status == JobStatus.RUNNING.value).values(
                        cancel_requested=True
                    )
                )
            row = self._job_row(s, job_id, fresh=True)
            if row.status != JobStatus.RUNNING.value and _rowcount(queued) == 0:
                raise Conflict(f"job '{job_id}' already finished ({row.status})")
            return _job(row)

    def release_job(self, job_id: str, worker: str) -> bool:
        """Hand a running job back to the queue (a worker shutting down); the attempt is not counted."""
        with self.session_scope() as s:
            result = s.execute(
                sa.update(JobRow)
                .where(
                    JobRow.id == job_id,
                    JobRow.status == JobStatus.RUNNING.value,
                    JobRow.worker == worker,
                    JobRow.cancel_requested.is_(False),
                )
                .values(
                    status=JobStatus.QUEUED.value,
                    worker=None,
                    heartbeat_at=None,
                    stage="requeued",
                    attempts=sa.case((JobRow.attempts > 0, JobRow.attempts - 1), else_=0),
                )
                .execution_options(synchronize_session=False)
            )
            return _rowcount(result) > 0

    def requeue_stale(self, stale_after_s: float, max_attempts: int) -> list[Job]:
        """Requeue running jobs whose worker stopped heartbeating; fail those out of attempts.

        A requeued job resumes from the records measured before (they are in the database already).
        Returns the jobs changed.
        """
        cutoff = utcnow() - timedelta(seconds=stale_after_s)
        query = sa.select(JobRow).where(
            JobRow.status == JobStatus.RUNNING.value,
            sa.or_(JobRow.heartbeat_at.is_(None), JobRow.heartbeat_at < cutoff),
        )
        if self.backend == "postgresql":
            query = query.with_for_update(skip_locked=True)
        changed = []
        with self.session_scope() as s:
            for row in s.scalars(query):
                last = row.heartbeat_at.isoformat(timespec="seconds") if row.heartbeat_at else "never"
                lost = f"worker {row.worker} stopped heartbeating (last heartbeat {last})"
                if row.cancel_requested:
                    row.status, row.error = JobStatus.CANCELLED.value, f"cancelled; {lost}"
                    row.finished_at, row.stage = utcnow(), None
                elif row.attempts >= max_attempts:
                    row.status = JobStatus.FAILED.value
                    row.error = f"{lost}; gave up after {row.attempts} attempts"
                    row.finished_at, row.stage = utcnow(), None
                else:
                    log.warning("requeueing job %s: %s", row.id, lost)
                    row.status, row.worker, row.heartbeat_at, row.stage = (
                        JobStatus.QUEUED.value,
                        None,
                        None,
                        "requeued",
                    )
                s.flush()
                changed.append(_job(row))
        return changed

    def service_stats(self) -> dict[str, Any]:
        """Counts for monitoring: jobs by status, records, and how long jobs waited in the queue."""
        with self.session_scope(write=False) as s:
            by_status = dict(
                s.execute(sa.select(JobRow.status, sa.func.count()).group_by(JobRow.status)).all()
            )
            records_total, records_valid, trials = s.execute(
                sa.select(
                    sa.func.count(TuningRecordRow.id),
                    sa.func.count(TuningRecordRow.id).filter(
                        TuningRecordRow.mean_run_sec < VALID_RUN_SEC_LIMIT
                    ),
                    sa.func.count(TuningRecordRow.job_id),
                )
            ).one()
            started = s.execute(
                sa.select(JobRow.created_at, JobRow.started_at).where(JobRow.started_at.is_not(None))
            ).all()
            oldest_queued = s.scalar(
                sa.select(sa.func.min(JobRow.created_at)).where(JobRow.status == JobStatus.QUEUED.value)
            )
        waits = [max(0.0, (b - a).total_seconds()) for a, b in started]
        if oldest_queued is not None and oldest_queued.tzinfo is None:
            oldest_queued = oldest_queued.replace(tzinfo=timezone.utc)
        return {
            "jobs": {status.value: int(by_status.get(status.value, 0)) for status in JobStatus},
            "records_total": int(records_total),
            "records_valid": int(records_valid),
            "trials_measured": int(trials),
            "queue_wait_sum_s": sum(waits),
            "queue_wait_count": len(waits),
            "oldest_queued_wait_s": (utcnow() - oldest_queued).total_seconds() if oldest_queued else 0.0,
        }

    @staticmethod
    def _job_row(s: Session, job_id: str, *, fresh: bool = False, owner: str | None = None) -> JobRow:
        row = s.get(JobRow, job_id, populate_existing=fresh)
        if row is None or (owner is not None and row.owner != owner):
            raise NotFound(f"job '{job_id}' not found")
        return row

    # ---- workloads ---------------------------------------------------------------------------------

    def find_workloads(self, shash: str) -> list[StoredWorkload]:
        """Every workload with this structural hash, oldest first."""
        with self.session_scope(write=False) as s:
            rows = s.execute(
                sa.select(WorkloadRow.id, WorkloadRow.workload_json)
                .where(WorkloadRow.shash == shash)
                .order_by(WorkloadRow.id)
            )
            return [StoredWorkload(wid, wjson) for wid, wjson in rows]

    def add_workload(self, shash: str, workload_json: str, tir_script: str) -> int:
        """Store a workload and return its id; an identical one (same hash and JSON) is reused.

        Structurally equal workloads with different JSON are told apart by the caller, which has TVM.
        """
        with self.session_scope() as s:
            if self.backend == "postgresql":
                # Serialize writers of one hash so that two workers tuning the same task share one row.
                s.execute(sa.select(sa.func.pg_advisory_xact_lock(zlib.crc32(shash.encode()))))
            existing = s.scalars(
                sa.select(WorkloadRow.id)
                .where(WorkloadRow.shash == shash, WorkloadRow.workload_json == workload_json)
                .order_by(WorkloadRow.id)
            ).first()
            if existing is not None:
                return existing
            row = WorkloadRow(shash=shash, workload_json=workload_json, tir_script=tir_script)
            s.add(row)
            s.flush()
            return row.id

    def get_workload_script(self, workload_id: int) -> str:
        """The TVMScript of a workload."""
        with self.session_scope(write=False) as s:
            script = s.scalar(sa.select(WorkloadRow.tir_script).where(WorkloadRow.id == workload_id))
            if script is None:
                raise NotFound(f"workload {workload_id} not found")
            return script

    # ---- tasks -------------------------------------------------------------------------------------

    def add_tasks(self, job_id: str, tasks: list[dict[str, Any]]) -> list[Task]:
        """Append tasks (dicts with name, weight, flops, workload_id) to a job, in order."""
        with self.session_scope() as s:
            self._job_row(s, job_id)
            wanted = {int(t["workload_id"]) for t in tasks}
            hashes = dict(
                s.execute(
                    sa.select(WorkloadRow.id, WorkloadRow.shash).where(WorkloadRow.id.in_(wanted))
                ).all()
            )
            missing = sorted(wanted - hashes.keys())
            if missing:
                raise NotFound(f"workload {missing[0]} not found")
            start = s.scalar(sa.select(sa.func.count(TaskRow.id)).where(TaskRow.job_id == job_id)) or 0
            rows = [
                TaskRow(
                    job_id=job_id,
                    workload_id=int(t["workload_id"]),
                    name=str(t["name"]),
                    weight=int(t["weight"]),
                    flops=float(t["flops"]),
                    trials=0,
                    position=start + i,
                )
                for i, t in enumerate(tasks)
            ]
            s.add_all(rows)
            s.flush()
            return [_task(r, hashes[r.workload_id]) for r in rows]

    def list_tasks(self, job_id: str) -> list[Task]:
        """The job's tasks in extraction order."""
        with self.session_scope(write=False) as s:
            rows = s.execute(
                sa.select(TaskRow, WorkloadRow.shash)
                .join(WorkloadRow, WorkloadRow.id == TaskRow.workload_id)
                .where(TaskRow.job_id == job_id)
                .order_by(TaskRow.position, TaskRow.id)
            )
            return [_task(task, shash) for task, shash in rows]

    def update_task(self, task_id: int, *, trials: int, best_latency_us: float | None) -> Task:
        """Record a task's tuning progress; returns the updated task."""
        with self.session_scope() as s:
            row = s.get(TaskRow, task_id)
            if row is None:
                raise NotFound(f"task {task_id} not found")
            row.trials = trials
            row.best_latency_us = best_latency_us
            s.flush()
            shash = s.scalar(sa.select(WorkloadRow.shash).where(WorkloadRow.id == row.workload_id))
            return _task(row, shash or "")

    # ---- tuning records ----------------------------------------------------------------------------

    def add_record(
        self,
        *,
        workload_id: int,
        job_id: str | None,
        target_key: str,
        target_json: str,
        trace_json: str,
        run_secs: list[float],
        args_info_json: str,
        record_json: str,
        error: str | None = None,
    ) -> int:
        """Store one measured candidate in its own transaction; returns its id.

        Failed candidates (no or non-finite run times, or MetaSchedule's 1e10) are kept, never applied.
        """
        secs = [float(x) for x in run_secs]
        with self.session_scope() as s:
            row = TuningRecordRow(
                workload_id=workload_id,
                job_id=job_id,
                target_key=target_key,
                target_json=target_json,
                trace_json=trace_json,
                run_secs_json=json.dumps(secs),
                mean_run_sec=_mean_run_sec(secs),
                error=error,
                args_info_json=args_info_json,
                record_json=record_json,
            )
            s.add(row)
            s.flush()
            return row.id

    def job_records(self, job: Job, owner: str | None = None) -> list[StoredRecord]:
        """The valid records of a job's tasks' workloads on its target (of ``owner``'s jobs when given):
        what its artifact ships and its record download holds."""
        workload_ids = [t.workload_id for t in self.list_tasks(job.id)]
        return self.all_records(job.target_key, workload_ids=workload_ids, valid_only=True, owner=owner)

    def top_records(self, workload_id: int, target_key: str, k: int, owner: str | None = None) -> list[str]:
        """``record_json`` of the ``k`` fastest valid records of a workload on a target, fastest first.

        ``owner`` (here and in the other record queries): only records of that owner's jobs; None: all.
        """
        if k <= 0:
            return []
        query = (
            sa.select(TuningRecordRow.record_json)
            .where(
                TuningRecordRow.workload_id == workload_id,
                TuningRecordRow.target_key == target_key,
                TuningRecordRow.mean_run_sec < VALID_RUN_SEC_LIMIT,
            )
            .order_by(TuningRecordRow.mean_run_sec, TuningRecordRow.id)
            .limit(k)
        )
        with self.session_scope(write=False) as s:
            return list(s.scalars(_of_owner(query, owner)))

    def all_records(
        self,
        target_key: str,
        workload_ids: Iterable[int] | None = None,
        job_id: str | None = None,
        valid_only: bool = False,
        owner: str | None = None,
    ) -> list[StoredRecord]:
        """A target's records with their workloads, in commit order."""
        query = (
            sa.select(TuningRecordRow.workload_id, WorkloadRow.workload_json, TuningRecordRow.record_json)
            .join(WorkloadRow, WorkloadRow.id == TuningRecordRow.workload_id)
            .where(TuningRecordRow.target_key == target_key)
            .order_by(TuningRecordRow.id)
        )
        if workload_ids is not None:
            ids = list(workload_ids)
            if not ids:
                return []
            query = query.where(TuningRecordRow.workload_id.in_(ids))
        if job_id is not None:
            query = query.where(TuningRecordRow.job_id == job_id)
        if valid_only:
            query = query.where(TuningRecordRow.mean_run_sec < VALID_RUN_SEC_LIMIT)
        with self.session_scope(write=False) as s:
            return [
                StoredRecord(wid, wjson, rjson) for wid, wjson, rjson in s.execute(_of_owner(query, owner))
            ]

    def list_records(
        self, job_id: str | None = None, workload_id: int | None = None, target_key: str | None = None
    ) -> list[Record]:
        """Records matching every given filter, in commit order."""
        query = sa.select(TuningRecordRow).order_by(TuningRecordRow.id)
        if job_id is not None:
            query = query.where(TuningRecordRow.job_id == job_id)
        if workload_id is not None:
            query = query.where(TuningRecordRow.workload_id == workload_id)
        if target_key is not None:
            query = query.where(TuningRecordRow.target_key == target_key)
        with self.session_scope(write=False) as s:
            return [_record(r) for r in s.scalars(query)]

    def count_records(
        self, target_key: str | None = None, job_id: str | None = None, owner: str | None = None
    ) -> int:
        """Number of records (valid or not) matching the given filters."""
        query = _of_owner(sa.select(sa.func.count(TuningRecordRow.id)), owner)
        if target_key is not None:
            query = query.where(TuningRecordRow.target_key == target_key)
        if job_id is not None:
            query = query.where(TuningRecordRow.job_id == job_id)
        with self.session_scope(write=False) as s:
            return int(s.scalar(query) or 0)

    def job_timeline(self, job_id: str, workload_id: int | None = None) -> list[TimelineEntry]:
        """A job's records (of one workload when given), in commit order."""
        query = (
            sa.select(
                TuningRecordRow.id,
                TuningRecordRow.workload_id,
                TuningRecordRow.mean_run_sec,
                TuningRecordRow.created_at,
            )
            .where(TuningRecordRow.job_id == job_id)
            .order_by(TuningRecordRow.id)
        )
        if workload_id is not None:
            query = query.where(TuningRecordRow.workload_id == workload_id)
        with self.session_scope(write=False) as s:
            return [
                TimelineEntry(rid, wid, sec * 1e6 if _is_valid(sec) else None, at)
                for rid, wid, sec, at in s.execute(query)
            ]

    def best_latency_before(
        self, workload_id: int, target_key: str, before_record_id: int, owner: str | None = None
    ) -> float | None:
        """The best valid latency (us) of a workload on a target among records older than the given one."""
        query = sa.select(sa.func.min(TuningRecordRow.mean_run_sec)).where(
            TuningRecordRow.workload_id == workload_id,
            TuningRecordRow.target_key == target_key,
            TuningRecordRow.mean_run_sec < VALID_RUN_SEC_LIMIT,
            TuningRecordRow.id < before_record_id,
        )
        with self.session_scope(write=False) as s:
            best = s.scalar(_of_owner(query, owner))
            return float(best) * 1e6 if best is not None else None

    def job_trial_counts(self, job_id: str) -> dict[int, int]:
        """Per workload: how many records (valid or not) this job measured."""
        query = (
            sa.select(TuningRecordRow.workload_id, sa.func.count(TuningRecordRow.id))
            .where(TuningRecordRow.job_id == job_id)
            .group_by(TuningRecordRow.workload_id)
        )
        with self.session_scope(write=False) as s:
            return {wid: int(n) for wid, n in s.execute(query)}

    def best_record(self, workload_id: int, target_key: str, owner: str | None = None) -> BestRecord | None:
        """A workload's fastest valid record."""
        query = (
            sa.select(WorkloadRow.workload_json, TuningRecordRow.record_json, TuningRecordRow.mean_run_sec)
            .join(WorkloadRow, WorkloadRow.id == TuningRecordRow.workload_id)
            .where(
                TuningRecordRow.workload_id == workload_id,
                TuningRecordRow.target_key == target_key,
                TuningRecordRow.mean_run_sec < VALID_RUN_SEC_LIMIT,
            )
            .order_by(TuningRecordRow.mean_run_sec, TuningRecordRow.id)
            .limit(1)
        )
        with self.session_scope(write=False) as s:
            row = s.execute(_of_owner(query, owner)).first()
            return BestRecord(row[0], row[1], float(row[2])) if row is not None else None

    def best_latency_us(self, workload_id: int, target_key: str, owner: str | None = None) -> float | None:
        """The fastest valid mean run time of a workload on a target, in microseconds."""
        query = sa.select(sa.func.min(TuningRecordRow.mean_run_sec)).where(
            TuningRecordRow.workload_id == workload_id,
            TuningRecordRow.target_key == target_key,
            TuningRecordRow.mean_run_sec < VALID_RUN_SEC_LIMIT,
        )
        with self.session_scope(write=False) as s:
            best = s.scalar(_of_owner(query, owner))
            return float(best) * 1e6 if best is not None else None

    # ---- model plans -------------------------------------------------------------------------------

    def get_model_plan(self, model_id: str, plan_key: str) -> ModelPlan | PlanError | None:
        """The stored outcome of planning a model under ``plan_key`` (target, shapes, passes), if any."""
        with self.session_scope(write=False) as s:
            row = s.scalar(
                sa.select(ModelPlanRow).where(
                    ModelPlanRow.model_id == model_id, ModelPlanRow.plan_key == plan_key
                )
            )
            if row is None:
                return None
            if row.error_kind is not None:
                return PlanError(row.target_key, row.error_kind, row.error_message or "")
            return ModelPlan(
                target_key=row.target_key,
                tasks=[TaskInfo(**t) for t in json.loads(row.tasks_json or "[]")],
                fusion=FusionSummary(**json.loads(row.fusion_json or "{}")),
                graph=row.graph or "",
            )

    def add_model_plan(self, model_id: str, plan_key: str, outcome: ModelPlan | PlanError) -> None:
        """Keep a model's plan (or planning error); a plan stored meanwhile by another request wins."""
        row = ModelPlanRow(model_id=model_id, plan_key=plan_key, target_key=outcome.target_key)
        if isinstance(outcome, PlanError):
            row.error_kind, row.error_message = outcome.kind, outcome.message
        else:
            row.tasks_json = json.dumps([dataclasses.asdict(t) for t in outcome.tasks])
            row.fusion_json = json.dumps(dataclasses.asdict(outcome.fusion))
            row.graph = outcome.graph
        try:
            with self.session_scope() as s:
                s.add(row)
        except Conflict:
            pass

    # ---- artifacts ---------------------------------------------------------------------------------

    def add_artifact(self, job_id: str, path: str, sha256: str, size_bytes: int) -> Artifact:
        """Record the compiled package of a job; a job has at most one (:class:`Conflict` otherwise)."""
        with self.session_scope(conflict=f"job '{job_id}' already has an artifact") as s:
            self._job_row(s, job_id)
            row = ArtifactRow(job_id=job_id, path=path, sha256=sha256, size_bytes=size_bytes)
            s.add(row)
            s.flush()
            return _artifact(row)

    def get_artifact(self, job_id: str) -> Artifact:
        """The artifact of a job; :class:`NotFound` when it has none."""
        with self.session_scope(write=False) as s:
            row = s.scalars(sa.select(ArtifactRow).where(ArtifactRow.job_id == job_id)).first()
            if row is None:
                raise NotFound(f"artifact of job '{job_id}' not found")
            return _artifact(row)

    # ---- API tokens --------------------------------------------------------------------------------

    def add_token(self, name: str, token_sha256: str) -> None:
        """Store a token's hash under ``name`` (who owns what it creates); :class:`Conflict` if taken."""
        with self.session_scope(conflict=f"a token named '{name}' already exists") as s:
            s.add(ApiTokenRow(name=name, token_sha256=token_sha256))

    def token_owner(self, token_sha256: str) -> str | None:
        """The name a token belongs to, or None for an unknown token."""
        with self.session_scope(write=False) as s:
            return s.scalar(sa.select(ApiTokenRow.name).where(ApiTokenRow.token_sha256 == token_sha256))

    def list_tokens(self) -> list[ApiToken]:
        """Every stored token."""
        with self.session_scope(write=False) as s:
            return [
                ApiToken(n, at) for n, at in s.execute(sa.select(ApiTokenRow.name, ApiTokenRow.created_at))
            ]

    def has_tokens(self) -> bool:
        """Whether any token is stored (the API then requires one)."""
        with self.session_scope(write=False) as s:
            return s.scalar(sa.select(sa.func.count(ApiTokenRow.id))) > 0

    def delete_token(self, name: str) -> None:
        """Revoke the token called ``name``."""
        with self.session_scope() as s:
            result = s.execute(sa.delete(ApiTokenRow).where(ApiTokenRow.name == name))
            if _rowcount(result) == 0:
                raise NotFound(f"no token named '{name}'")


def _of_owner(query: Any, owner: str | None) -> Any:
    """Records of ``owner``'s jobs only (None: every record, the shared pool)."""
    if owner is None:
        return query
    return query.where(TuningRecordRow.job_id.in_(sa.select(JobRow.id).where(JobRow.owner == owner)))


def _job_filter(query: Any, status: JobStatus | None, owner: str | None) -> Any:
    if status is not None:
        query = query.where(JobRow.status == JobStatus(status).value)
    if owner is not None:
        query = query.where(JobRow.owner == owner)
    return query


def _rowcount(result: sa.Result[Any]) -> int:
    return int(getattr(result, "rowcount", 0))


__all__ = ["MIGRATIONS_DIR", "Store", "alembic_config", "normalize_url"]
