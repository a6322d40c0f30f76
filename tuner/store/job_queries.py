"""Jobs: creating, reading, progress and outcome, and the artifact a job produced."""

from __future__ import annotations

import dataclasses
import json
import zlib
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from tuner.entities import AccuracyReport, Artifact, IrLevel, Job, JobSpec, JobStatus, LatencyReport
from tuner.errors import Conflict, NotFound
from tuner.store.base import StoreBase, rowcount
from tuner.store.convert import artifact_entity, job_entity
from tuner.store.orm import ArtifactRow, JobIrLevelRow, JobRow, TaskRow, utcnow


class JobQueries(StoreBase):
    """Jobs and their artifacts."""

    # ---- jobs -------------------------------------------------------------------------------------------

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
            return job_entity(row)

    def get_job(self, job_id: str, owner: str | None = None) -> Job:
        """The job with this id (owned by ``owner`` when given); :class:`NotFound` otherwise."""
        with self.session_scope(write=False) as s:
            return job_entity(self._job_row(s, job_id, owner=owner))

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
            return [job_entity(r) for r in s.scalars(query.limit(limit).offset(offset))]

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
            if rowcount(result) == 0:
                raise Conflict(f"job '{job_id}' is {row.status}; only a queued job can start")
            return job_entity(row)

    def finish_job(
        self,
        job_id: str,
        status: JobStatus,
        *,
        error: str | None = None,
        baseline_latency_ms: float | None = None,
        tuned_latency_ms: float | None = None,
        reference_latency_ms: dict[str, float] | None = None,
        latency_report: LatencyReport | None = None,
        accuracy: AccuracyReport | None = None,
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
        if latency_report is not None:
            values["latency_report_json"] = json.dumps(latency_report.to_dict())
        if accuracy is not None:
            values["accuracy_json"] = json.dumps(accuracy.to_dict())
        unfinished = [JobStatus.QUEUED.value, JobStatus.RUNNING.value]
        with self.session_scope() as s:
            result = s.execute(
                sa.update(JobRow)
                .where(JobRow.id == job_id, JobRow.status.in_(unfinished))
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            row = self._job_row(s, job_id, fresh=True)
            if rowcount(result) == 0:
                raise Conflict(f"job '{job_id}' already finished ({row.status})")
            return job_entity(row)

    def update_job_progress(self, job_id: str, trials_done: int, trials_total: int) -> None:
        """Record how many trials of the job's budget have been measured."""
        with self.session_scope() as s:
            result = s.execute(
                sa.update(JobRow)
                .where(JobRow.id == job_id)
                .values(trials_done=trials_done, trials_total=trials_total)
                .execution_options(synchronize_session=False)
            )
            if rowcount(result) == 0:
                raise NotFound(f"job '{job_id}' not found")

    def set_tuning_time(self, job_id: str, tuning_s: float, since: datetime | None) -> None:
        """Record the seconds the job has spent tuning, as of ``since`` (None once tuning has ended)."""
        with self.session_scope() as s:
            s.execute(
                sa.update(JobRow)
                .where(JobRow.id == job_id)
                .values(tuning_s=tuning_s, tuning_since=since)
                .execution_options(synchronize_session=False)
            )

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

    # ---- artifacts --------------------------------------------------------------------------------------

    def add_artifact(self, job_id: str, path: str, sha256: str, size_bytes: int) -> Artifact:
        """Record the compiled package of a job; a job has at most one (:class:`Conflict` otherwise)."""
        with self.session_scope(conflict=f"job '{job_id}' already has an artifact") as s:
            self._job_row(s, job_id)
            row = ArtifactRow(job_id=job_id, path=path, sha256=sha256, size_bytes=size_bytes)
            s.add(row)
            s.flush()
            return artifact_entity(row)

    def get_artifact(self, job_id: str) -> Artifact:
        """The artifact of a job; :class:`NotFound` when it has none."""
        with self.session_scope(write=False) as s:
            row = s.scalars(sa.select(ArtifactRow).where(ArtifactRow.job_id == job_id)).first()
            if row is None:
                raise NotFound(f"artifact of job '{job_id}' not found")
            return artifact_entity(row)

    # ---- lowering levels --------------------------------------------------------------------------------

    def set_ir_levels(self, job_id: str, levels: list[IrLevel]) -> None:
        """Keep a job's lowering levels, replacing any an earlier attempt of it kept."""
        with self.session_scope() as s:
            self._job_row(s, job_id)
            s.execute(sa.delete(JobIrLevelRow).where(JobIrLevelRow.job_id == job_id))
            for level in levels:
                summary = {k: v for k, v in dataclasses.asdict(level).items() if k not in _LEVEL_COLUMNS}
                s.add(
                    JobIrLevelRow(
                        job_id=job_id,
                        position=level.position,
                        name=level.name,
                        changed=level.changed,
                        text_zlib=zlib.compress(level.text.encode(), 6),
                        summary_json=json.dumps(summary),
                    )
                )

    def list_ir_levels(self, job_id: str) -> list[IrLevel]:
        """A job's lowering levels in order, without their texts (empty when it recorded none)."""
        columns = [
            JobIrLevelRow.position,
            JobIrLevelRow.name,
            JobIrLevelRow.changed,
            JobIrLevelRow.summary_json,
        ]
        with self.session_scope(write=False) as s:
            rows = s.execute(
                sa.select(*columns).where(JobIrLevelRow.job_id == job_id).order_by(JobIrLevelRow.position)
            ).all()
            return [_level(position, name, changed, "", summary) for position, name, changed, summary in rows]

    def get_ir_level(self, job_id: str, position: int) -> IrLevel:
        """One level of a job's lowering with its text (an unchanged level's is the text of the last level
        that changed the program); :class:`NotFound` when there is none."""
        with self.session_scope(write=False) as s:
            row = s.scalar(
                sa.select(JobIrLevelRow).where(
                    JobIrLevelRow.job_id == job_id, JobIrLevelRow.position == position
                )
            )
            if row is None:
                raise NotFound(f"job '{job_id}' has no lowering level {position}")
            text_of = row
            if not row.changed:
                text_of = s.scalar(
                    sa.select(JobIrLevelRow)
                    .where(
                        JobIrLevelRow.job_id == job_id,
                        JobIrLevelRow.position < position,
                        JobIrLevelRow.changed.is_(True),
                    )
                    .order_by(JobIrLevelRow.position.desc())
                    .limit(1)
                )
            text = zlib.decompress(text_of.text_zlib).decode() if text_of is not None else ""
            return _level(row.position, row.name, row.changed, text, row.summary_json)


#: IrLevel's fields that are columns of their own (the others go to summary_json).
_LEVEL_COLUMNS = ("position", "name", "changed", "text")


def _level(position: int, name: str, changed: bool, text: str, summary_json: str) -> IrLevel:
    return IrLevel(position=position, name=name, changed=changed, text=text, **json.loads(summary_json))


def _job_filter(query: Any, status: JobStatus | None, owner: str | None) -> Any:
    if status is not None:
        query = query.where(JobRow.status == JobStatus(status).value)
    if owner is not None:
        query = query.where(JobRow.owner == owner)
    return query
