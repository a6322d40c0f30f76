"""What a running job writes: its stage, its tasks' trials and bests, its progress, its heartbeat and its
end, each passed on to a listener as it is stored.

One :class:`JobRecorder` per run holds all of it, so the pipeline in :mod:`tuner.job` says what happened
and never how it is kept.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import TYPE_CHECKING, Protocol

from tuner.entities import Artifact, FusionSummary, JobStatus, Task
from tuner.errors import Conflict

if TYPE_CHECKING:
    from tuner.metaschedule.callback import TrialBatch
    from tuner.store.sql import Store
    from tuner.verify import Latencies

log = logging.getLogger(__name__)


class JobListener(Protocol):
    """Receives a job's progress (the CLI draws it; the service streams it from the store)."""

    def stage(self, name: str) -> None: ...

    def planned(self, tasks: list[Task], fusion: FusionSummary, trials_total: int) -> None: ...

    def measured(self, task: Task, trials_done: int, trials_total: int) -> None: ...


class _LogListener:
    def stage(self, name: str) -> None:
        log.info("job stage: %s", name)

    def planned(self, tasks: list[Task], fusion: FusionSummary, trials_total: int) -> None:
        pass

    def measured(self, task: Task, trials_done: int, trials_total: int) -> None:
        pass


class JobRecorder:
    """Records one run of a job in the store and tells its listener."""

    def __init__(self, store: Store, job_id: str, listener: JobListener | None = None) -> None:
        self.store = store
        self.job_id = job_id
        self.listener: JobListener = listener or _LogListener()
        self.tasks: list[Task] = []
        self.trials_total = 0
        self.trials_done = 0

    def stage(self, name: str) -> None:
        """The job moved on to ``name`` (importing, tuning, compiling...)."""
        self.store.set_job_stage(self.job_id, name)
        self.listener.stage(name)

    def planned(self, tasks: list[Task], fusion: FusionSummary, trials_total: int) -> None:
        """The job's tasks are known; trials they already have (a resumed job) count as done."""
        self.tasks = list(tasks)
        self.trials_total = trials_total
        self.trials_done = sum(t.trials for t in tasks)
        self.store.update_job_progress(self.job_id, self.trials_done, trials_total)
        self.listener.planned(list(tasks), fusion, trials_total)

    def on_batch(self, batch: TrialBatch) -> None:
        """A measured batch of one task: its trial count and best latency, and the job's progress."""
        task = self.tasks[batch.task_index]
        valid = [lat for lat in batch.latencies_us if lat is not None]
        best = min([*valid, task.best_latency_us] if task.best_latency_us else valid, default=None)
        task = self.store.update_task(
            task.id, trials=task.trials + len(batch.latencies_us), best_latency_us=best
        )
        self.tasks[batch.task_index] = task
        self.trials_done += len(batch.latencies_us)
        self.store.update_job_progress(self.job_id, self.trials_done, self.trials_total)
        self.listener.measured(task, self.trials_done, self.trials_total)

    def artifact(self, path: str, sha256: str, size_bytes: int) -> Artifact:
        """The packed artifact of the job."""
        return self.store.add_artifact(self.job_id, path, sha256, size_bytes)

    def succeeded(self, latency: Latencies) -> None:
        """The job ended well, with the end-to-end latencies it measured (if any)."""
        self.store.finish_job(
            self.job_id,
            JobStatus.SUCCEEDED,
            baseline_latency_ms=latency.untuned_ms,
            tuned_latency_ms=latency.tuned_ms,
            reference_latency_ms=latency.references_ms,
            latency_report=latency.report,
        )

    def ended(self, status: JobStatus, reason: str) -> None:
        """The job failed or was cancelled, for ``reason``; an outcome already recorded elsewhere (its
        worker cancelled it) is kept."""
        with contextlib.suppress(Conflict):
            self.store.finish_job(self.job_id, status, error=reason)

    def heartbeat(self, worker: str, interval_s: float) -> Heartbeat:
        """Keeps the job's heartbeat fresh while it runs in this process: ``with recorder.heartbeat(...)``."""
        return Heartbeat(self.store, self.job_id, worker, interval_s)


class Heartbeat:
    """Keeps a running job's heartbeat fresh from a background thread (``with Heartbeat(...):``).

    Without it, a worker elsewhere would take the job for abandoned and requeue it.
    """

    def __init__(self, store: Store, job_id: str, worker: str, interval_s: float) -> None:
        self.store, self.job_id, self.worker, self.interval_s = store, job_id, worker, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{job_id[:8]}", daemon=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if self.store.heartbeat(self.job_id, self.worker) is None:
                    return
            except Exception:  # a database hiccup must not kill the job; the next beat retries
                log.exception("heartbeat of job %s failed", self.job_id)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
