"""A job run in the caller's own process (``kiln tune``), held to the limits a worker holds its jobs to.

A worker supervises a job's tuning process from outside (:mod:`tuner.jobs.worker`). A job run in-process has
no outside, so :class:`InProcessGuard` keeps a thread beside it that checks the same
:class:`~tuner.jobs.limits.JobWatch` over this process and everything it started, and watches for SIGINT
and SIGTERM through a wakeup file descriptor: the C-level signal handler writes it at once, even while
the main thread is stuck in a long TVM pass that Python's own handlers would wait for. At a limit or a
signal the thread records the job's outcome, kills the processes this one started and ends the process:
no job is left "running" behind an interrupted ``kiln tune``.

:func:`sweep_dead_local_jobs` covers the one way out no handler sees (SIGKILL): a ``kiln`` command finds
this host's jobs still "running" under a ``kiln tune`` process that is gone, and ends them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import threading
from collections.abc import Callable
from types import TracebackType

import psutil

from tuner.entities import Job, JobStatus
from tuner.errors import Conflict
from tuner.jobs.limits import JobLimits, JobWatch
from tuner.settings import Settings
from tuner.store.sql import Store

log = logging.getLogger(__name__)

_CHECK_S = 0.25
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# The separator of an in-process job's worker name: ``host:cli:pid``.
_CLI = ":cli:"


def cli_worker_name() -> str:
    """The worker name of a job run by this process (``host:cli:pid``): where to look for it."""
    return f"{socket.gethostname()}{_CLI}{os.getpid()}"


class InProcessGuard:
    """Holds the job run in this process to its limits and ends it on SIGINT/SIGTERM (a context manager).

    ``stage()`` says the job's current stage; ``on_abort(message)`` is told why the process is about to
    end (to print it), from the guard's thread. Signals are watched only when entered on the main thread.
    """

    def __init__(
        self,
        store: Store,
        settings: Settings,
        job: Job,
        stage: Callable[[], str | None],
        on_abort: Callable[[str], None] | None = None,
    ) -> None:
        self.store, self.job_id = store, job.id
        self._stage = stage
        self._on_abort = on_abort or (lambda message: None)
        self.watch = JobWatch(JobLimits.from_settings(settings), os.getpid(), job.spec.time_budget_s)
        self._stopped = threading.Event()
        self._wakeup: tuple[socket.socket, socket.socket] | None = None
        self._saved: dict[int, object] = {}
        self._saved_fd = -1
        self._thread = threading.Thread(target=self._run, name="kiln-job-guard", daemon=True)

    def __enter__(self) -> InProcessGuard:
        if threading.current_thread() is threading.main_thread():
            reader, writer = socket.socketpair()
            reader.setblocking(False)
            writer.setblocking(False)
            self._wakeup = (reader, writer)
            self._saved_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
            for signum in _SIGNALS:
                # Python's part does nothing: the guard's thread, woken through the fd, does it all.
                self._saved[signum] = signal.signal(signum, lambda *_: None)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stopped.set()
        self._thread.join()
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._saved_fd)
            for signum, handler in self._saved.items():
                signal.signal(signum, handler)  # type: ignore[arg-type]
            for sock in self._wakeup:
                sock.close()

    def _run(self) -> None:
        reader = self._wakeup[0] if self._wakeup is not None else None
        while not self._stopped.is_set():
            if reader is None:
                self._stopped.wait(_CHECK_S)
            elif select.select([reader], [], [], _CHECK_S)[0]:
                signum = _signal_received(reader)
                if signum is not None and not self._stopped.is_set():
                    reason = (
                        f"interrupted ({signal.Signals(signum).name}); the records measured so far were kept"
                    )
                    self._abort(JobStatus.CANCELLED, reason, 128 + signum)
            if self._stopped.is_set():
                return
            reason = self.watch.check(self._stage())
            if reason is not None:
                self._abort(JobStatus.FAILED, reason, 1)

    def _abort(self, status: JobStatus, reason: str, exit_code: int) -> None:
        """Record the job's outcome, stop everything this process started, and end it."""
        try:
            with contextlib.suppress(Conflict):
                self.store.finish_job(self.job_id, status, error=reason)
        except Exception:
            log.exception("job %s: could not record its outcome", self.job_id)
        kill_descendants()
        with contextlib.suppress(Exception):
            self._on_abort(reason)
        os._exit(exit_code)


def _signal_received(reader: socket.socket) -> int | None:
    """The first of the watched signals among those the wakeup fd reported, if any."""
    try:
        received = reader.recv(64)
    except BlockingIOError:
        return None
    watched = {int(s) for s in _SIGNALS}
    return next((s for s in received if s in watched), None)


def kill_descendants() -> None:
    """SIGKILL every process this one started (builders, runners, timing children), and theirs."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()


def sweep_dead_local_jobs(store: Store) -> list[Job]:
    """End this host's jobs left "running" by a ``kiln tune`` process that no longer exists (killed with
    SIGKILL, or its machine restarted): cancelled, their measured records kept. Returns them."""
    prefix = f"{socket.gethostname()}{_CLI}"
    swept = []
    for job in store.list_jobs(status=JobStatus.RUNNING, limit=1000):
        if not (job.worker or "").startswith(prefix):
            continue
        pid_text = job.worker[len(prefix) :]  # type: ignore[index]
        if not pid_text.isdigit() or _alive(int(pid_text), job):
            continue
        reason = (
            f"the kiln tune process that ran it (pid {pid_text}) ended without recording an outcome; "
            "the records measured before were kept"
        )
        with contextlib.suppress(Conflict):
            swept.append(store.finish_job(job.id, JobStatus.CANCELLED, error=reason))
    return swept


def _alive(pid: int, job: Job) -> bool:
    """Whether ``pid`` is still the process that started running ``job`` (not a later one given its pid)."""
    try:
        created = psutil.Process(pid).create_time()
    except psutil.Error:
        return False
    started = job.started_at.timestamp() if job.started_at is not None else None
    return started is None or created <= started + 1


__all__ = ["InProcessGuard", "cli_worker_name", "kill_descendants", "sweep_dead_local_jobs"]
