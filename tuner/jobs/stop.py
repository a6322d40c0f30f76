"""Why a running job's tuning stops before its budget, decided in one place.

A job's tuning process stops when its user cancelled it, when the job ended meanwhile (another process
recorded its outcome), or when another worker took it over (its worker stopped heartbeating and the job
was requeued, perhaps claimed again). The first two end the job; a takeover must end nothing: the new
owner resumes the job and its split job's groups from the store, so the process that lost the job leaves
them as they are (:func:`tuner.jobs.task_groups.tune_split`, :func:`tuner.jobs.pipeline.execute_job`).
"""

from __future__ import annotations

import enum
import time

from tuner.entities import Job, JobStatus
from tuner.store.sql import Store


class StopReason(enum.Enum):
    """Why a job's tuning stops early."""

    CANCELLED = "cancelled"  # the user asked: the job ends cancelled, its groups closed
    ENDED = "ended"  # the job's outcome was recorded elsewhere: nothing more to do
    TAKEN_OVER = "taken over"  # another worker resumes it: nothing is closed or recorded

    @property
    def ends_job(self) -> bool:
        """Whether the job (and a split job's unfinished groups) end with this stop."""
        return self is not StopReason.TAKEN_OVER


def stop_reason(job: Job, worker: str | None) -> StopReason | None:
    """Why ``worker``'s tuning of ``job`` (as the store has it now) must stop; None: it goes on. Without a
    ``worker`` (a split job's group, which any worker may tune), only the job's cancellation or end, or
    its return to the queue, stop it."""
    if job.status.finished:
        return StopReason.ENDED
    if job.cancel_requested:
        return StopReason.CANCELLED
    if job.status is not JobStatus.RUNNING or (worker is not None and job.worker != worker):
        return StopReason.TAKEN_OVER
    return None


class JobStopCheck:
    """``should_stop`` of a job's tuning process: true once :func:`stop_reason` gives a reason (read from
    the store at most every ``every_s`` seconds; a database error is no reason). :attr:`reason` says
    which."""

    def __init__(self, store: Store, job_id: str, worker: str | None, every_s: float = 1.0) -> None:
        self.store, self.job_id, self.worker, self.every_s = store, job_id, worker, every_s
        self._checked_at = 0.0
        self.reason: StopReason | None = None

    def __call__(self) -> bool:
        now = time.monotonic()
        if self.reason is None and now - self._checked_at >= self.every_s:
            self._checked_at = now
            try:
                job = self.store.get_job(self.job_id)
            except Exception:
                return False
            self.reason = stop_reason(job, self.worker)
        return self.reason is not None


def current_stop_reason(store: Store, job_id: str, worker: str | None) -> StopReason:
    """Why a stop check that fired stopped ``worker``'s tuning of the job, read again from the store (the
    check may be any callable); a check that fired for a reason the store does not show counts as the
    user's cancellation, as before there were reasons."""
    return stop_reason(store.get_job(job_id), worker) or StopReason.CANCELLED
