"""What a running job writes: its stage, its tasks' trials and bests, its progress, its heartbeat and its
end, each passed on to a listener as it is stored.

One :class:`JobRecorder` per run holds all of it, so the stages of :mod:`tuner.jobs.pipeline` say what
happened and never how it is kept: they write nothing to the store themselves.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from tuner.entities import (
    AccuracyReport,
    Artifact,
    FusionSummary,
    IrLevel,
    Job,
    JobStatus,
    ModelProfile,
    Task,
    TaskGroup,
    TaskGroupStatus,
    TaskInfo,
)
from tuner.errors import Conflict
from tuner.jobs.heartbeat import Heartbeat
from tuner.store.orm import utcnow

if TYPE_CHECKING:
    from tuner.metaschedule.callback import TrialBatch
    from tuner.store.sql import Store
    from tuner.timing.verify import Latencies

log = logging.getLogger(__name__)


class JobListener(Protocol):
    """Receives a job's progress (the CLI draws it; the service streams it from the store)."""

    def stage(self, name: str) -> None: ...

    def planned(self, tasks: list[Task], fusion: FusionSummary, trials_total: int) -> None: ...

    def tuning(self, clock: TuningClock) -> None:
        """Tuning begins; ``clock`` says how long it has run and how much of its time budget is left."""
        ...

    def measured(self, task: Task, trials_done: int, trials_total: int) -> None: ...


class _LogListener:
    def stage(self, name: str) -> None:
        log.info("job stage: %s", name)

    def planned(self, tasks: list[Task], fusion: FusionSummary, trials_total: int) -> None:
        pass

    def tuning(self, clock: TuningClock) -> None:
        if clock.budget_s is not None:
            log.info("time budget: %.0f s, %.0f s left", clock.budget_s, clock.remaining_s())

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
        self.clock: TuningClock | None = None
        self.current_stage: str | None = None
        self._device_key: str | None = None

    def stage(self, name: str) -> None:
        """The job moved on to ``name`` (importing, tuning, compiling...)."""
        self.current_stage = name
        self.store.set_job_stage(self.job_id, name)
        self.listener.stage(name)

    def planned(self, tasks: list[Task], fusion: FusionSummary, trials_total: int) -> None:
        """The job's tasks are known; trials they already have (a resumed job) count as done."""
        self.tasks = list(tasks)
        self.trials_total = trials_total
        self.trials_done = sum(t.trials for t in tasks)
        self.store.update_job_progress(self.job_id, self.trials_done, trials_total)
        self.listener.planned(list(tasks), fusion, trials_total)

    def levels(self, levels: list[IrLevel]) -> None:
        """The program after each graph pass (what ``kiln ir`` and the dashboard's lowering show)."""
        self.store.set_ir_levels(self.job_id, levels)

    def new_tasks(
        self, infos: list[TaskInfo], workload_ids: list[int], target_key: str, scope: str | None
    ) -> list[Task]:
        """The job's tasks, one per planned kernel; a workload tuned by an earlier job on this target
        starts from its best record."""
        rows = [
            {"name": info.name, "weight": info.weight, "flops": info.flops, "workload_id": workload}
            for info, workload in zip(infos, workload_ids, strict=True)
        ]
        warm = []
        for task in self.store.add_tasks(self.job_id, rows):
            best = self.store.best_latency_us(task.workload_id, target_key, scope)
            warm.append(
                task if best is None else self.store.update_task(task.id, trials=0, best_latency_us=best)
            )
        return warm

    def resumed_tasks(self, target_key: str, scope: str | None) -> list[Task]:
        """A rerun job's tasks, their trials recounted from the records the earlier attempts committed."""
        resumed = recount_tasks(
            self.store, self.job_id, self.store.list_tasks(self.job_id), target_key, scope
        )
        log.info(
            "job %s resumes with %d trials already measured", self.job_id, sum(t.trials for t in resumed)
        )
        return resumed

    def schedule_sources(self, sources: list[str]) -> None:
        """Where each task's compiled schedule came from (a record, a rule, the model...), in task order."""
        self.store.set_schedule_sources(
            {task.id: source for task, source in zip(self.tasks, sources, strict=True)}
        )

    def assembly(self, kernels: dict[int, tuple[str, dict[str, Any]]]) -> None:
        """Each task's kernel as compiled into the model, with its instruction mix (by task id)."""
        for task_id, (text, mix) in kernels.items():
            self.store.set_task_assembly(task_id, text, mix)

    def profile(self, profile: ModelProfile) -> None:
        """The tuned model's profile, kernel by kernel."""
        self.store.set_job_profile(self.job_id, profile)

    def on_batch(self, batch: TrialBatch) -> None:
        """A measured batch of one task: its trial count and best latency, and the job's progress."""
        if self._device_key is None:
            self._device_key = device_key(self.store.get_job(self.job_id))
        task = add_batch(self.store, self.tasks[batch.task_index], batch, self._device_key)
        self.tasks[batch.task_index] = task
        self.trials_done += len(batch.latencies_us)
        self.store.update_job_progress(self.job_id, self.trials_done, self.trials_total)
        if self.clock is not None:
            self.store.set_tuning_time(self.job_id, self.clock.elapsed_s(), utcnow())
        self.listener.measured(task, self.trials_done, self.trials_total)

    def measured_elsewhere(self, task: Task, trials_done: int) -> None:
        """A batch of a split job's group was measured (and stored) by :mod:`tuner.jobs.task_groups`: the
        job's trials done so far, over every worker."""
        self.tasks = [task if t.id == task.id else t for t in self.tasks]
        self.trials_done = trials_done
        if self.clock is not None:
            self.store.set_tuning_time(self.job_id, self.clock.elapsed_s(), utcnow())
        self.listener.measured(task, trials_done, self.trials_total)

    def split_tuned(self, groups: list[TaskGroup]) -> None:
        """Every group of a split job ended: its tasks as the workers left them."""
        self.tasks = self.store.list_tasks(self.job_id)
        self.trials_done = self.store.refresh_job_progress(self.job_id)
        for group in groups:
            if group.status is not TaskGroupStatus.DONE:
                log.warning(
                    "job %s: task group %d (tasks %s) did not finish: %s",
                    self.job_id,
                    group.index,
                    list(group.task_indices),
                    group.error,
                )

    @contextlib.contextmanager
    def tuning(self, budget_s: float | None, spent_before_s: float) -> Iterator[TuningClock]:
        """The tuning stage: its clock runs (and is kept in the store with every batch) inside the block."""
        self.stage("tuning")
        clock = TuningClock(budget_s, spent_before_s)
        self.clock = clock
        self.store.set_tuning_time(self.job_id, clock.elapsed_s(), utcnow())
        self.listener.tuning(clock)
        try:
            yield clock
        finally:
            clock.stop()
            self.clock = None
            self.store.set_tuning_time(self.job_id, clock.elapsed_s(), None)

    def artifact(self, path: str, sha256: str, size_bytes: int) -> Artifact:
        """The packed artifact of the job."""
        return self.store.add_artifact(self.job_id, path, sha256, size_bytes)

    def succeeded(self, latency: Latencies, accuracy: AccuracyReport | None = None) -> None:
        """The job ended well, with the end-to-end latencies it measured (if any) and, for a quantized
        model, its accuracy against onnxruntime."""
        self.store.finish_job(
            self.job_id,
            JobStatus.SUCCEEDED,
            baseline_latency_ms=latency.untuned_ms,
            tuned_latency_ms=latency.tuned_ms,
            reference_latency_ms=latency.references_ms,
            latency_report=latency.report,
            accuracy=accuracy,
        )

    def ended(self, status: JobStatus, reason: str) -> None:
        """The job failed or was cancelled, for ``reason``; an outcome already recorded elsewhere (its
        worker cancelled it) is kept."""
        with contextlib.suppress(Conflict):
            self.store.finish_job(self.job_id, status, error=reason)

    def heartbeat(self, worker: str, interval_s: float) -> Heartbeat:
        """Keeps the job's heartbeat fresh while it runs in this process: ``with recorder.heartbeat(...)``."""
        return Heartbeat(
            lambda: self.store.heartbeat(self.job_id, worker) is not None,
            interval_s,
            f"heartbeat of job {self.job_id[:8]}",
        )


class TuningClock:
    """Seconds a job has spent tuning: ``spent_before_s`` (earlier attempts) plus this run's, against an
    optional budget."""

    def __init__(self, budget_s: float | None, spent_before_s: float = 0.0) -> None:
        self.budget_s = budget_s
        self.spent_before_s = spent_before_s
        self.started = time.monotonic()
        self.stopped: float | None = None

    def stop(self) -> None:
        """Tuning ended: the clock stands still from now on."""
        if self.stopped is None:
            self.stopped = time.monotonic()

    def elapsed_s(self) -> float:
        end = self.stopped if self.stopped is not None else time.monotonic()
        return self.spent_before_s + end - self.started

    def remaining_s(self) -> float | None:
        """Seconds left of the budget (can be negative), or None without a time budget."""
        return None if self.budget_s is None else self.budget_s - self.elapsed_s()


def device_key(job: Job) -> str:
    """The key of the RPC devices a job measures on, as the devices page names them ("?": none given)."""
    return job.spec.runner.key or "?"


def add_batch(store: Store, task: Task, batch: TrialBatch, device: str) -> Task:
    """``task`` with a measured batch of it added (its trials, and its best latency if the batch beat it),
    as stored; the RPC servers of ``device`` that measured it are noted (the devices page's "in use by")."""
    valid = [lat for lat in batch.latencies_us if lat is not None]
    best = min([*valid, task.best_latency_us] if task.best_latency_us else valid, default=None)
    updated = store.update_task(task.id, trials=task.trials + len(batch.latencies_us), best_latency_us=best)
    if batch.measured_on:
        store.note_server_use(task.job_id, device, batch.measured_on)
    return updated


def recount_tasks(
    store: Store, job_id: str, tasks: list[Task], target_key: str, scope: str | None
) -> list[Task]:
    """``tasks`` with their trials recounted from the job's records in the store and their bests read from
    it, for a job or a split job's group taken up again after its worker was lost.

    MetaSchedule commits each record in its own transaction and the batch is counted after: a worker killed
    between the two leaves its tasks' trials short of what they measured (and their bests short of what it
    found). A count is only ever raised: what the store holds was measured, and a task's count never runs
    ahead of its records. The job's progress (the sum of its tasks' trials) follows."""
    measured = store.job_trial_counts(job_id)
    counted = []
    for task in tasks:
        trials = max(task.trials, measured.get(task.workload_id, 0))
        best = store.best_latency_us(task.workload_id, target_key, scope)
        if (trials, best) != (task.trials, task.best_latency_us):
            task = store.update_task(task.id, trials=trials, best_latency_us=best)
        counted.append(task)
    if counted != tasks:
        store.refresh_job_progress(job_id)
    return counted
