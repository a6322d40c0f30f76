"""Task groups of split jobs (:class:`~tuner.entities.TaskGroup`): split, claim, heartbeat, finish, release
and requeue, as the job queue (:mod:`tuner.store.queue`) does for whole jobs.

A group is claimed only while its job runs. PostgreSQL lets workers race with ``FOR UPDATE SKIP LOCKED``;
SQLite serializes them with BEGIN IMMEDIATE.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

import sqlalchemy as sa

from tuner.entities import JobStatus, TaskGroup, TaskGroupStatus
from tuner.store.base import StoreBase, rowcount
from tuner.store.orm import JobRow, TaskGroupRow, TaskRow, utcnow

log = logging.getLogger(__name__)

_RUNNING, _QUEUED = TaskGroupStatus.RUNNING.value, TaskGroupStatus.QUEUED.value
_UNFINISHED = (_QUEUED, _RUNNING)


def _group(row: TaskGroupRow) -> TaskGroup:
    return TaskGroup(
        id=row.id,
        job_id=row.job_id,
        index=row.index,
        task_indices=tuple(json.loads(row.task_indices_json)),
        trials=row.trials,
        status=TaskGroupStatus(row.status),
        worker=row.worker,
        attempts=row.attempts,
        heartbeat_at=row.heartbeat_at,
        deadline_at=row.deadline_at,
        finished_at=row.finished_at,
        error=row.error,
    )


class GroupQueries(StoreBase):
    """Splitting a job's tasks over workers."""

    def split_job(
        self, job_id: str, groups: Sequence[tuple[Sequence[int], int | None]], deadline_at: datetime | None
    ) -> list[TaskGroup]:
        """The job's task groups: ``groups`` (task indices, trials) stored queued the first time; a job
        split before (a resumed one) keeps its groups, its unfinished ones given the new deadline."""
        with self.session_scope() as s:
            self._job_row(s, job_id)
            rows = list(s.scalars(sa.select(TaskGroupRow).where(TaskGroupRow.job_id == job_id)))
            if rows:
                for row in rows:
                    if row.status in _UNFINISHED:
                        row.deadline_at = deadline_at
            else:
                rows = [
                    TaskGroupRow(
                        job_id=job_id,
                        index=index,
                        task_indices_json=json.dumps([int(i) for i in indices]),
                        trials=trials,
                        status=_QUEUED,
                        deadline_at=deadline_at,
                    )
                    for index, (indices, trials) in enumerate(groups)
                ]
                s.add_all(rows)
            s.flush()
            return [_group(row) for row in sorted(rows, key=lambda r: r.index)]

    def task_groups(self, job_id: str) -> list[TaskGroup]:
        """A job's task groups in order (none for a job that was not split)."""
        query = sa.select(TaskGroupRow).where(TaskGroupRow.job_id == job_id).order_by(TaskGroupRow.index)
        with self.session_scope(write=False) as s:
            return [_group(row) for row in s.scalars(query)]

    def get_task_group(self, group_id: int) -> TaskGroup | None:
        """One task group, or None when it (or its job) was deleted."""
        with self.session_scope(write=False) as s:
            row = s.get(TaskGroupRow, group_id)
            return None if row is None else _group(row)

    def claim_task_group(self, worker: str, job_id: str | None = None) -> TaskGroup | None:
        """Atomically move the oldest queued group of a running job (of ``job_id`` only, if given) to
        running on ``worker``, counting the attempt. None when there is none."""
        running_jobs = sa.select(JobRow.id).where(
            JobRow.status == JobStatus.RUNNING.value, JobRow.cancel_requested.is_(False)
        )
        oldest = (
            sa.select(TaskGroupRow.id)
            .where(TaskGroupRow.status == _QUEUED, TaskGroupRow.job_id.in_(running_jobs))
            .order_by(TaskGroupRow.created_at, TaskGroupRow.job_id, TaskGroupRow.index)
            .limit(1)
        )
        if job_id is not None:
            oldest = oldest.where(TaskGroupRow.job_id == job_id)
        if self.backend == "postgresql":
            oldest = oldest.with_for_update(skip_locked=True, of=TaskGroupRow)
        now = utcnow()
        with self.session_scope() as s:
            group_id = s.execute(
                sa.update(TaskGroupRow)
                .where(TaskGroupRow.id == oldest.scalar_subquery(), TaskGroupRow.status == _QUEUED)
                .values(status=_RUNNING, worker=worker, heartbeat_at=now, attempts=TaskGroupRow.attempts + 1)
                .returning(TaskGroupRow.id)
                .execution_options(synchronize_session=False)
            ).scalar_one_or_none()
            if group_id is None:
                return None
            return _group(s.get(TaskGroupRow, group_id, populate_existing=True))  # type: ignore[arg-type]

    def heartbeat_task_group(self, group_id: int, worker: str) -> TaskGroup | None:
        """Mark ``worker`` alive on its group; None when the group is no longer running on it."""
        with self.session_scope() as s:
            result = s.execute(self._ours(group_id, worker).values(heartbeat_at=utcnow()))
            if rowcount(result) == 0:
                return None
            return _group(s.get(TaskGroupRow, group_id, populate_existing=True))  # type: ignore[arg-type]

    def finish_task_group(
        self, group_id: int, worker: str, status: TaskGroupStatus, error: str | None = None
    ) -> bool:
        """``worker`` ended its group (done, or failed for ``error``); False when it was no longer its."""
        with self.session_scope() as s:
            ended = {"status": status.value, "finished_at": utcnow()}
            if error is not None:  # a group done after a requeue keeps why it was requeued
                ended["error"] = error
            result = s.execute(self._ours(group_id, worker).values(**ended))
            return rowcount(result) > 0

    def release_task_group(
        self, group_id: int, worker: str, reason: str, max_attempts: int, *, counted: bool = True
    ) -> TaskGroup | None:
        """``worker`` could not finish its group, for ``reason``: it goes back to the queue (its records
        stay), or fails once it has had ``max_attempts``; ``counted=False`` (a worker shutting down) does
        not count the attempt. None when it was no longer ``worker``'s."""
        with self.session_scope() as s:
            row = s.get(TaskGroupRow, group_id, populate_existing=True)
            if row is None or row.status != _RUNNING or row.worker != worker:
                return None
            if not counted:
                row.attempts = max(0, row.attempts - 1)
            self._requeue(row, reason, max_attempts)
            s.flush()
            return _group(row)

    def requeue_stale_task_groups(
        self, stale_after_s: float, max_attempts: int, job_id: str | None = None
    ) -> list[TaskGroup]:
        """Requeue running groups whose worker stopped heartbeating (failing those out of attempts), of
        ``job_id`` or of every job. Returns the groups changed."""
        cutoff = utcnow() - timedelta(seconds=stale_after_s)
        query = sa.select(TaskGroupRow).where(
            TaskGroupRow.status == _RUNNING,
            sa.or_(TaskGroupRow.heartbeat_at.is_(None), TaskGroupRow.heartbeat_at < cutoff),
        )
        if job_id is not None:
            query = query.where(TaskGroupRow.job_id == job_id)
        if self.backend == "postgresql":
            query = query.with_for_update(skip_locked=True)
        changed = []
        with self.session_scope() as s:
            for row in s.scalars(query):
                last = row.heartbeat_at.isoformat(timespec="seconds") if row.heartbeat_at else "never"
                self._requeue(
                    row, f"worker {row.worker} stopped heartbeating (last heartbeat {last})", max_attempts
                )
                s.flush()
                changed.append(_group(row))
        return changed

    def close_task_groups(self, job_id: str, reason: str) -> int:
        """Fail a job's unfinished groups for ``reason`` (the job stops waiting for them); how many."""
        with self.session_scope() as s:
            result = s.execute(
                sa.update(TaskGroupRow)
                .where(TaskGroupRow.job_id == job_id, TaskGroupRow.status.in_(_UNFINISHED))
                .values(status=TaskGroupStatus.FAILED.value, finished_at=utcnow(), error=reason)
                .execution_options(synchronize_session=False)
            )
            return rowcount(result)

    def refresh_job_progress(self, job_id: str) -> int:
        """Set the job's trials done to its tasks' trials (several workers add to them); returns it."""
        with self.session_scope() as s:
            done = int(
                s.scalar(
                    sa.select(sa.func.coalesce(sa.func.sum(TaskRow.trials), 0)).where(
                        TaskRow.job_id == job_id
                    )
                )
                or 0
            )
            s.execute(
                sa.update(JobRow)
                .where(JobRow.id == job_id)
                .values(trials_done=done)
                .execution_options(synchronize_session=False)
            )
            return done

    @staticmethod
    def _ours(group_id: int, worker: str) -> sa.Update:
        return (
            sa.update(TaskGroupRow)
            .where(
                TaskGroupRow.id == group_id, TaskGroupRow.status == _RUNNING, TaskGroupRow.worker == worker
            )
            .execution_options(synchronize_session=False)
        )

    @staticmethod
    def _requeue(row: TaskGroupRow, reason: str, max_attempts: int) -> None:
        if row.attempts >= max_attempts:
            row.status, row.finished_at = TaskGroupStatus.FAILED.value, utcnow()
            row.error = f"{reason}; gave up after {row.attempts} attempts"
        else:
            log.warning("requeueing task group %d of job %s: %s", row.index, row.job_id, reason)
            row.status, row.worker, row.heartbeat_at, row.error = _QUEUED, None, None, reason
