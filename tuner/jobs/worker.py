"""Workers: claim queued jobs, run each in a child process, heartbeat, record the outcome.

One worker runs one job at a time. The job's tuning runs in a child process (spawned, in its own process
group, killed with its parent), so a kernel that crashes or hangs takes down only that child: the worker
records a readable error and takes the next job. A worker that dies stops heartbeating; any other worker
then requeues its job, which resumes from the records already in the database.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from forkserver import ForkedProcess, shared_fork_server
from tuner.entities import Job, JobStatus, TaskGroup, TaskGroupStatus
from tuner.errors import Conflict
from tuner.jobs.failures import CRASH_REPORT, crash_report_path
from tuner.jobs.heartbeat import Heartbeat
from tuner.jobs.limits import TUNING_STAGE, JobLimits, JobWatch
from tuner.settings import Settings
from tuner.store.sql import Store

log = logging.getLogger(__name__)

# The longest a supervising worker goes without looking at its job (cancel requests, lost ownership).
_SUPERVISE_POLL_S = 1.0
# How long a tuning process that recorded its job's outcome may take to exit before it is killed.
_FINISHED_EXIT_S = 30.0

_SIGNAL_HINTS = {
    signal.SIGSEGV: "segmentation fault",
    signal.SIGBUS: "bus error",
    signal.SIGILL: "illegal instruction",
    signal.SIGFPE: "arithmetic fault",
    signal.SIGABRT: "aborted",
    signal.SIGKILL: "killed; out of memory?",
}


def default_worker_name(suffix: str = "") -> str:
    """``host:pid`` (plus a suffix for several workers in one process): where to look for a job's worker."""
    return f"{socket.gethostname()}:{os.getpid()}{suffix}"


def describe_exit(exitcode: int | None, stage: str | None, crash_report: Path | None = None) -> str:
    """A readable reason for a tuning process that ended without recording its job's outcome."""
    during = f" while {stage}" if stage else ""
    if exitcode is not None and exitcode < 0:
        sig = signal.Signals(-exitcode)
        hint = _SIGNAL_HINTS.get(sig)
        what = f"{sig.name} ({hint})" if hint else sig.name
        stacks = ""
        if crash_report is not None and crash_report.is_file() and crash_report.stat().st_size > 0:
            stacks = (
                f" (the stacks of its threads are in {CRASH_REPORT} in the job's directory on the worker)"
            )
        return (
            f"the tuning process was killed by {what}{during}{stacks}; the worker is unaffected and the "
            "records measured before were kept"
        )
    return f"the tuning process exited with code {exitcode}{during} without recording an outcome"


class Worker:
    """Takes jobs from the queue one at a time until :meth:`stop` is called."""

    def __init__(self, settings: Settings, name: str | None = None, store: Store | None = None) -> None:
        self.settings = settings
        self.name = name or default_worker_name()
        self.store = store or Store.from_settings(settings)
        self._stop = threading.Event()
        self.child_pid: int | None = None  # the running job's tuning process, if any

    @property
    def _beat_s(self) -> float:
        return min(_SUPERVISE_POLL_S, self.settings.heartbeat_s)

    def stop(self) -> None:
        """Ask the worker to stop; a job it is running goes back to the queue."""
        self._stop.set()

    def run_forever(self) -> None:
        """Serve jobs until stopped; database errors are logged and retried, never fatal."""
        log.info("worker %s serving jobs", self.name)
        while not self._stop.is_set():
            try:
                job = self.run_once()
            except Exception:
                log.exception("worker %s: unexpected error; retrying", self.name)
                job = None
            if job is None:
                self._stop.wait(self.settings.poll_interval_s)
        log.info("worker %s stopped", self.name)

    def run_once(self) -> Job | None:
        """Requeue abandoned jobs, then claim one and run it to its end; with no job queued, tune a queued
        task group of a running split job instead. Returns the job it ran or helped, or None if idle."""
        for job in self.store.requeue_stale(self.settings.stale_after_s, self.settings.max_attempts):
            log.warning("job %s whose worker was lost is now %s", job.id, job.status.value)
        job = self.store.claim_job(self.name)
        if job is None:
            return self._help_once()
        log.info("worker %s runs job %s (attempt %d)", self.name, job.id, job.attempts)
        try:
            self._supervise(job)
        finally:
            self.child_pid = None
        return self.store.get_job(job.id)

    def _help_once(self) -> Job | None:
        """Claim a queued task group of a running split job (requeueing abandoned ones first) and tune it
        in a tuning process; the job it belongs to, or None when there is none."""
        for group in self.store.requeue_stale_task_groups(
            self.settings.stale_after_s, self.settings.max_attempts
        ):
            log.warning(
                "task group %d of job %s whose worker was lost is now %s",
                group.index,
                group.job_id,
                group.status.value,
            )
        group = self.store.claim_task_group(self.name)
        if group is None:
            return None
        log.info(
            "worker %s tunes task group %d of job %s (attempt %d)",
            self.name,
            group.index,
            group.job_id,
            group.attempts,
        )
        try:
            self._supervise_group(group)
        finally:
            self.child_pid = None
        return self.store.get_job(group.job_id)

    def _supervise_group(self, group: TaskGroup) -> None:
        # The group's tuning process heartbeats the group itself; the supervision watches that the group
        # stays ours (its job may give up on it, or requeue it), and is held to the job's limits like the
        # job's own tuning process: its memory (the process tree's) and its time at tuning.
        with Heartbeat(
            lambda: self.store.heartbeat_task_group(group.id, self.name) is not None,
            self._beat_s,
            f"{self.name} starting",
        ):
            child = _start_tuning_process(self.name, self.settings, group_id=group.id)
        self.child_pid = child.pid
        job = self.store.get_job(group.job_id)
        watch = JobWatch(JobLimits.from_settings(self.settings), child.pid, job.spec.time_budget_s)
        outcome, limit_reason = self._supervise_process(
            child, watch, _GroupTenure(self.store, group.id, self.name)
        )
        if outcome is Outcome.RELEASED:
            reason = f"worker {self.name} stopped"
            self.store.release_task_group(
                group.id, self.name, reason, self.settings.max_attempts, counted=False
            )
            return
        if outcome is Outcome.LOST:
            return  # taken back, or given up by its job
        reason = limit_reason or describe_exit(child.returncode, f"tuning task group {group.index}")
        if self.store.release_task_group(group.id, self.name, reason, self.settings.max_attempts) is not None:
            log.warning("task group %d of job %s: %s", group.index, group.job_id, reason)

    def _supervise(self, job: Job) -> None:
        # Forked from the job fork server (not from this process: it may be a threaded web server, and
        # TVM is not fork-safe once it has run anything), in its own session so that killing its group
        # also stops its builders and runners.
        # Starting it can take seconds (the first one starts the fork server, which loads TVM): beat meanwhile,
        # or another worker would take the job for abandoned.
        with Heartbeat(
            lambda: self.store.heartbeat(job.id, self.name) is not None, self._beat_s, f"{self.name} starting"
        ):
            child = _start_tuning_process(self.name, self.settings, job_id=job.id)
        self.child_pid = child.pid
        watch = JobWatch(JobLimits.from_settings(self.settings), child.pid, job.spec.time_budget_s)
        tenure = _JobTenure(self.store, job.id, self.name, stage=job.stage)
        outcome, limit_reason = self._supervise_process(child, watch, tenure)
        if limit_reason is not None:
            log.warning("job %s stopped at a limit: %s", job.id, limit_reason)
        self._record_outcome(job, child.returncode, outcome, limit_reason)

    def _supervise_process(
        self, child: ForkedProcess, watch: JobWatch, tenure: _Tenure
    ) -> tuple[Outcome, str | None]:
        """Watch a tuning process until it ends, the worker is stopped, its work is no longer this
        worker's, it passes a limit, or a cancelled job's process outlives its grace period; then kill its
        process group. Returns how it ended, and the limit's reason."""
        cancel_deadline: float | None = None
        next_beat = 0.0
        try:
            while True:
                try:
                    child.wait(timeout=_SUPERVISE_POLL_S / 4)
                    return Outcome.EXITED, None
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                if self._stop.is_set():
                    return Outcome.RELEASED, None
                if now >= next_beat:
                    next_beat = now + self._beat_s
                    ours = tenure.beat()
                    if ours is False:
                        if tenure.finished:
                            with contextlib.suppress(subprocess.TimeoutExpired):
                                child.wait(timeout=_FINISHED_EXIT_S)  # its outcome is recorded; let it exit
                            return Outcome.EXITED, None
                        return Outcome.LOST, None
                    if ours and tenure.cancel_requested and cancel_deadline is None:
                        log.info("%s: cancel requested; stopping its tuning process", tenure.what)
                        cancel_deadline = now + self.settings.cancel_grace_s
                limit_reason = watch.check(tenure.stage)
                if limit_reason is not None:
                    return Outcome.LIMIT, limit_reason
                if cancel_deadline is not None and now >= cancel_deadline:
                    return Outcome.CANCELLED, None
        finally:
            _kill_process_group(child)

    def _record_outcome(
        self, job: Job, exitcode: int | None, outcome: Outcome, limit_reason: str | None = None
    ) -> None:
        if outcome is Outcome.LOST:
            log.warning("job %s was taken from worker %s; its tuning process was stopped", job.id, self.name)
            return
        if outcome is Outcome.RELEASED and self.store.release_job(job.id, self.name):
            log.info("worker %s handed job %s back to the queue", self.name, job.id)
            return
        current = self.store.get_job(job.id)
        if current.status is not JobStatus.RUNNING:
            return  # the tuning process recorded the outcome itself
        if current.worker != self.name:  # taken over while its process ended: the new owner's now
            log.warning("job %s was taken from worker %s as its tuning process ended", job.id, self.name)
            return
        trials = self.store.count_records(job_id=job.id)
        if limit_reason is not None:
            status, error = JobStatus.FAILED, limit_reason
        elif outcome is Outcome.CANCELLED or current.cancel_requested:
            status = JobStatus.CANCELLED
            error = f"cancelled by the user; the {trials} records measured so far were kept"
        else:
            status = JobStatus.FAILED
            error = describe_exit(exitcode, current.stage, crash_report_path(self.settings.jobs_dir, job.id))
        with contextlib.suppress(Conflict):
            self.store.finish_job(job.id, status, error=error)


class Outcome(enum.Enum):
    """How a supervised tuning process ended, as its worker saw it."""

    EXITED = "exited"  # by itself: its outcome recorded, or a crash
    RELEASED = "released"  # the worker was asked to stop: the work goes back to the queue, uncounted
    LOST = "lost"  # the work is no longer this worker's (requeued, taken over, given up by its job)
    LIMIT = "limit"  # stopped at a memory or time limit
    CANCELLED = "cancelled"  # its job was cancelled and it outlived the grace period


class _Tenure(Protocol):
    """What a supervised tuning process holds for its worker, a job or a split job's task group: whether
    it still does (:meth:`beat`), at which stage, and whether its user asked it to stop."""

    what: str
    stage: str | None
    cancel_requested: bool
    finished: bool  # no longer held because it ended (its outcome recorded), not because it was taken

    def beat(self) -> bool | None:
        """True while it is still this worker's; False once not; None on a database error (asked again)."""
        ...


@dataclass
class _JobTenure:
    """A job: the supervisor heartbeats it, and reads its stage and cancel request on the way."""

    store: Store
    job_id: str
    worker: str
    stage: str | None = None
    cancel_requested: bool = False
    finished: bool = False

    @property
    def what(self) -> str:
        return f"job {self.job_id}"

    def beat(self) -> bool | None:
        try:
            current = self.store.heartbeat(self.job_id, self.worker)
            if current is None:
                self.finished = self.store.get_job(self.job_id).status.finished
                return False
        except Exception:
            log.exception("heartbeat of job %s failed; retrying", self.job_id)
            return None
        self.stage, self.cancel_requested = current.stage, current.cancel_requested
        return True


@dataclass
class _GroupTenure:
    """A split job's task group: its tuning process heartbeats it; the supervisor checks it is still this
    worker's (a cancelled job's groups are closed by the job's worker)."""

    store: Store
    group_id: int
    worker: str
    stage: str | None = TUNING_STAGE
    cancel_requested: bool = False
    finished: bool = False

    @property
    def what(self) -> str:
        return f"task group {self.group_id}"

    def beat(self) -> bool | None:
        try:
            current = self.store.get_task_group(self.group_id)
        except Exception:
            log.exception("reading task group %d failed; retrying", self.group_id)
            return None
        return (
            current is not None
            and current.status is TaskGroupStatus.RUNNING
            and current.worker == self.worker
        )


class WorkerPool:
    """The workers embedded in a server process, each on its own thread."""

    def __init__(self, settings: Settings, count: int, store: Store | None = None) -> None:
        self.workers = [Worker(settings, default_worker_name(f"-{i}"), store) for i in range(count)]
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start every worker thread."""
        for worker in self.workers:
            thread = threading.Thread(target=worker.run_forever, name=f"kiln-{worker.name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop every worker; their running jobs go back to the queue."""
        for worker in self.workers:
            worker.stop()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


def stop_on_signals(stop: Callable[[], None]) -> None:
    """Call ``stop`` on SIGTERM and SIGINT (a standalone worker hands its job back, then exits)."""

    def handler(signum: int, _frame: Any) -> None:
        log.warning("received %s: handing the current job back and stopping", signal.Signals(signum).name)
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _kill_process_group(child: ForkedProcess) -> None:
    """Kill a tuning process and everything it started (builders, runners)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


# ---- the tuning process ------------------------------------------------------------------------------


def _start_tuning_process(
    worker: str, settings: Settings, *, job_id: str | None = None, group_id: int | None = None
) -> ForkedProcess:
    """A tuning process for a job or for one task group of a split job, forked from this process's job fork
    server (:mod:`tuner.jobs.worker_child`); what to run is sent on stdin."""
    stdin_r, stdin_w = os.pipe()
    try:
        child = shared_fork_server("tuner.jobs.worker_child").spawn([stdin_r, 1, 2], dict(os.environ))
    finally:
        os.close(stdin_r)
    with os.fdopen(stdin_w, "wb") as stdin:
        request = {
            "job_id": job_id,
            "group_id": group_id,
            "worker": worker,
            "settings": settings.model_dump_json(),
        }
        stdin.write(json.dumps(request).encode())
    return child
