"""A job's tasks split over several workers (``JobSpec.workers`` > 1).

The job's own worker plans the job as usual, then splits its tasks into groups (:func:`split_tasks`), each
with its share of the trial budget and the job's deadline, and stores them queued. Any worker with nothing
else to do claims a group of a running job (:meth:`~tuner.jobs.worker.Worker.run_once`) and tunes it in a
tuning process of its own (:func:`tune_claimed_group`); the job's worker claims groups too
(:func:`tune_split`), then waits for the others' groups, taking back any whose worker stopped
heartbeating, and compiles once every group is done. Everything goes through the shared store: the groups'
records, their tasks' trials and bests, the job's progress. Each task's IRModule is read back from its
stored workload, so a helper never imports the model.

A worker killed mid-group loses only its unfinished batch: its group goes back to the queue and resumes from
the records its tasks already have, which count against the group's trials (recounted from the store as a
resumed job's are, :func:`~tuner.jobs.recorder.recount_tasks`). Every group keeps the cost model it searched
with, taught the records the other groups stored meanwhile (:func:`~tuner.jobs.search_run.search_tasks`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from kiln_tvm import ms
from tuner.entities import Budget, Job, Task, TaskGroup, TaskGroupStatus
from tuner.errors import KilnError
from tuner.jobs.heartbeat import Heartbeat
from tuner.jobs.recorder import add_batch, device_key, recount_tasks
from tuner.jobs.search_run import search_tasks
from tuner.jobs.stop import current_stop_reason
from tuner.metaschedule.callback import TrialBatch
from tuner.metaschedule.database import KilnDatabase
from tuner.metaschedule.scheduler import StopCheck
from tuner.settings import Settings
from tuner.store.orm import utcnow
from tuner.store.sql import Store
from tuner.targets import to_tvm_target

log = logging.getLogger(__name__)

#: Called after each measured batch of a group with the task (updated) and the job's trials done.
OnMeasured = Callable[[Task, int], None]

#: How long past the job's deadline its worker waits for another worker's group before giving up on it
#: (a group's tuning stops at the deadline, after its batch in flight).
DEADLINE_GRACE_S = 120.0


def split_tasks(tasks: Sequence[Task], groups: int) -> list[list[int]]:
    """The task indices of each of (at most) ``groups`` groups: the tasks dealt out in turn, the most work
    (flops x weight) first, so that the groups hold as many tasks each (the trials follow the tasks) and
    similar work."""
    count = max(1, min(groups, len(tasks)))
    order = sorted(range(len(tasks)), key=lambda i: (-tasks[i].flops * tasks[i].weight, i))
    dealt: list[list[int]] = [[] for _ in range(count)]
    for rank, index in enumerate(order):
        dealt[rank % count].append(index)
    return sorted(sorted(group) for group in dealt)


def group_trials(trials: int | None, groups: Sequence[Sequence[int]]) -> list[int | None]:
    """Each group's share of the job's ``trials``, in proportion to its tasks (summing to ``trials``)."""
    if trials is None:
        return [None] * len(groups)
    total = sum(len(group) for group in groups)
    shares = [trials * len(group) // total for group in groups]
    for index in range(trials - sum(shares)):
        shares[index % len(shares)] += 1
    return list(shares)


def tune_split(
    store: Store,
    settings: Settings,
    job: Job,
    tasks: Sequence[Task],
    *,
    worker: str,
    should_stop: StopCheck | None,
    time_left_s: Callable[[], float | None],
    on_measured: OnMeasured | None = None,
) -> list[TaskGroup]:
    """The job's worker's part of a split job: split it (or take up its groups again), tune groups until
    none is queued, then wait for the other workers' groups, requeueing (and tuning) those whose worker was
    lost. Returns the groups as they ended."""
    remaining = time_left_s()
    deadline = None if remaining is None else utcnow() + timedelta(seconds=max(0.0, remaining))
    indices = split_tasks(tasks, job.spec.workers)
    groups = store.split_job(
        job.id, list(zip(indices, group_trials(job.spec.trials, indices), strict=True)), deadline
    )
    log.info("job %s: %d tasks in %d groups", job.id, len(tasks), len(groups))
    while not (should_stop is not None and should_stop()):
        group = store.claim_task_group(worker, job_id=job.id)
        if group is not None:
            tune_claimed_group(
                store, settings, job, group, worker=worker, should_stop=should_stop, on_measured=on_measured
            )
            continue
        if all(g.status.finished for g in store.task_groups(job.id)):
            break
        store.requeue_stale_task_groups(settings.stale_after_s, settings.max_attempts, job_id=job.id)
        if deadline is not None and utcnow() > deadline + timedelta(seconds=DEADLINE_GRACE_S):
            closed = store.close_task_groups(job.id, "the job's time budget ended before its worker finished")
            log.warning("job %s: gave up waiting for %d task groups past its time budget", job.id, closed)
            break
        time.sleep(settings.poll_interval_s)
    else:
        reason = current_stop_reason(store, job.id, worker)
        if reason.ends_job:
            store.close_task_groups(job.id, f"the job was {reason.value}")
        else:  # the new owner takes the groups up again: the one this worker held was released
            log.warning("job %s was taken from %s: its task groups are left to the new owner", job.id, worker)
    return store.task_groups(job.id)


def tune_claimed_group(
    store: Store,
    settings: Settings,
    job: Job,
    group: TaskGroup,
    *,
    worker: str,
    should_stop: StopCheck | None,
    on_measured: OnMeasured | None = None,
) -> None:
    """Tune a group ``worker`` has claimed, heartbeating it, and mark it done; on an error it goes back to
    the queue (or fails, out of attempts) with the reason. Returns quietly when the group was taken from
    ``worker`` meanwhile."""
    beating = Heartbeat(
        lambda: store.heartbeat_task_group(group.id, worker) is not None,
        settings.heartbeat_s,
        f"heartbeat of task group {group.id}",
        immediately=True,
    )
    with beating as beat:

        def stop() -> bool:
            return beat.lost or (should_stop is not None and should_stop())

        try:
            tune_group(store, settings, job, group, should_stop=stop, on_measured=on_measured)
        except Exception as exc:
            reason = exc.message if isinstance(exc, KilnError) else f"{type(exc).__name__}: {exc}"
            log.exception("job %s: task group %d failed", job.id, group.index)
            store.release_task_group(group.id, worker, f"tuning failed: {reason}", settings.max_attempts)
            return
    if beat.lost:
        return
    if should_stop is not None and should_stop():  # the job was cancelled or ended: not this group's fault
        store.release_task_group(group.id, worker, "its job stopped it", settings.max_attempts, counted=False)
    else:
        store.finish_task_group(group.id, worker, TaskGroupStatus.DONE)


def tune_group(
    store: Store,
    settings: Settings,
    job: Job,
    group: TaskGroup,
    *,
    should_stop: StopCheck | None,
    on_measured: OnMeasured | None = None,
) -> None:
    """MetaSchedule over one group's tasks, within what is left of the group's trials (after the records
    its tasks already have) and of the job's time; every record goes to the store as the job's."""
    spec = job.spec
    scope = settings.record_scope(job.owner)
    tasks = store.list_tasks(job.id)
    mine = recount_tasks(store, job.id, [tasks[i] for i in group.task_indices], job.target_key, scope)
    done = sum(task.trials for task in mine)
    trials_left = None if group.trials is None else max(0, group.trials - done)

    def time_left_s() -> float | None:
        return None if group.deadline_at is None else (group.deadline_at - utcnow()).total_seconds()

    remaining = time_left_s()
    if trials_left == 0 or (remaining is not None and remaining <= 0):
        return
    target = to_tvm_target(spec.target)
    database = KilnDatabase(store, job.target_key, job_id=job.id, owner=scope)
    progress = GroupProgress(store, job, mine, on_measured)
    search_tasks(
        store,
        settings,
        job,
        tasks=mine,
        extracted=[_extracted(database, task, target) for task in mine],
        database=database,
        target=target,
        budget=Budget(trials_left, spec.max_trials_per_task, spec.seed + group.index, remaining),
        work_dir=settings.jobs_dir / job.id / "metaschedule" / f"group-{group.index}",
        on_batch=progress.on_batch,
        should_stop=should_stop,
        time_left_s=time_left_s,
    )


def _extracted(database: KilnDatabase, task: Task, target: Any) -> Any:
    """The task as MetaSchedule extracted it when the job was planned, from its stored workload."""
    mod = database.stored_workload(task.workload_id).mod
    return ms.ExtractedTask(task_name=task.name, mod=mod, target=target, dispatched=[mod], weight=task.weight)


class GroupProgress:
    """A group's measured batches: its tasks' trials and bests, the servers they used, the job's progress
    (summed over the tasks, which several workers update)."""

    def __init__(self, store: Store, job: Job, tasks: list[Task], on_measured: OnMeasured | None) -> None:
        self.store, self.job, self.tasks, self.on_measured = store, job, tasks, on_measured

    def on_batch(self, batch: TrialBatch) -> None:
        task = add_batch(self.store, self.tasks[batch.task_index], batch, device_key(self.job))
        self.tasks[batch.task_index] = task
        done = self.store.refresh_job_progress(self.job.id)
        if self.on_measured is not None:
            self.on_measured(task, done)
