"""The job queue shared by workers: claim, heartbeat, cancel, release, requeue, and its counters.

PostgreSQL lets workers race with ``FOR UPDATE SKIP LOCKED``; SQLite serializes them with BEGIN IMMEDIATE."""

from __future__ import annotations

import logging
from datetime import timedelta, timezone
from typing import Any

import sqlalchemy as sa

from tuner.entities import Job, JobStatus
from tuner.errors import Conflict
from tuner.store.base import StoreBase, rowcount
from tuner.store.convert import job_entity
from tuner.store.orm import VALID_RUN_SEC_LIMIT, JobRow, TuningRecordRow, utcnow

log = logging.getLogger(__name__)


class QueueQueries(StoreBase):
    """Claiming and supervising jobs."""

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
            return job_entity(self._job_row(s, job_id, fresh=True))

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
            if rowcount(result) == 0:
                return None
            return job_entity(self._job_row(s, job_id, fresh=True))

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
            if rowcount(queued) == 0:
                s.execute(
                    base.where(JobRow.id == job_id, JobRow.status == JobStatus.RUNNING.value).values(
                        cancel_requested=True
                    )
                )
            row = self._job_row(s, job_id, fresh=True)
            if row.status != JobStatus.RUNNING.value and rowcount(queued) == 0:
                raise Conflict(f"job '{job_id}' already finished ({row.status})")
            return job_entity(row)

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
            return rowcount(result) > 0

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
                changed.append(job_entity(row))
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
