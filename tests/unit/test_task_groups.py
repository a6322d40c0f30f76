"""Split jobs' task groups: how tasks are dealt out, and the store's claim, heartbeat, release and requeue
(SQLite and PostgreSQL)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import timedelta

import pytest

from tests.store_rows import TARGET, add_job, add_record
from tuner.entities import Job, JobSpec, JobStatus, Task, TaskGroupStatus
from tuner.errors import InvalidSpec
from tuner.jobs.recorder import recount_tasks
from tuner.jobs.stop import JobStopCheck, StopReason, stop_reason
from tuner.jobs.task_groups import group_trials, split_tasks, tune_split
from tuner.jobs.worker import Outcome, Worker
from tuner.settings import Settings
from tuner.store import Store
from tuner.store.orm import utcnow


def _task(index: int, flops: float, weight: int = 1) -> Task:
    return Task(
        id=index,
        job_id="j",
        workload_id=index,
        name=f"t{index}",
        weight=weight,
        flops=flops,
        workload_hash="",
    )


def test_tasks_are_dealt_out_evenly_the_most_work_first() -> None:
    tasks = [_task(0, 10), _task(1, 1000), _task(2, 100, weight=20), _task(3, 5), _task(4, 1)]
    # work: t1 1000, t2 2000, t0 10, t3 5, t4 1 -> dealt t2, t1, t0, t3, t4 over two groups
    assert split_tasks(tasks, 2) == [[0, 2, 4], [1, 3]]
    assert split_tasks(tasks, 9) == [[0], [1], [2], [3], [4]]  # never an empty group
    assert split_tasks(tasks, 1) == [[0, 1, 2, 3, 4]]
    assert sorted(i for g in split_tasks(tasks, 3) for i in g) == [0, 1, 2, 3, 4]


def test_trials_follow_the_tasks_and_add_up() -> None:
    assert group_trials(10, [[0, 2, 4], [1, 3]]) == [6, 4]
    assert group_trials(7, [[0], [1], [2]]) == [3, 2, 2]
    assert sum(group_trials(101, [[0, 1], [2], [3, 4, 5]])) == 101
    assert group_trials(None, [[0], [1]]) == [None, None]


def test_workers_of_a_spec_are_checked_and_kept() -> None:
    spec = JobSpec(model_id="m", target={"kind": "llvm"}, trials=8, workers=3)
    assert JobSpec.from_dict(spec.to_dict()).workers == 3
    assert JobSpec.from_dict({k: v for k, v in spec.to_dict().items() if k != "workers"}).workers == 1
    for bad in (0, 65, 2.0, "2"):
        with pytest.raises(InvalidSpec, match="workers"):
            JobSpec(model_id="m", target={"kind": "llvm"}, trials=8, workers=bad)  # type: ignore[arg-type]


def test_groups_are_claimed_once_each_and_only_of_running_jobs(store: Store) -> None:
    job_id = add_job(store)
    deadline = utcnow() + timedelta(seconds=60)
    groups = store.split_job(job_id, [([0, 2], 6), ([1], 3)], deadline)
    assert [(g.index, g.task_indices, g.trials, g.status) for g in groups] == [
        (0, (0, 2), 6, TaskGroupStatus.QUEUED),
        (1, (1,), 3, TaskGroupStatus.QUEUED),
    ]
    assert store.claim_task_group("helper") is None  # the job is queued, not running
    store.mark_job_running(job_id, "owner")

    first = store.claim_task_group("helper")
    assert first is not None and first.index == 0 and first.worker == "helper" and first.attempts == 1
    assert first.deadline_at is not None and abs((first.deadline_at - deadline).total_seconds()) < 1
    second = store.claim_task_group("owner", job_id=job_id)
    assert second is not None and second.index == 1
    assert store.claim_task_group("third") is None

    # A job split before keeps its groups (a resumed job); the unfinished take the new deadline.
    later = deadline + timedelta(seconds=30)
    again = store.split_job(job_id, [([0], 9)], later)
    assert [(g.task_indices, g.trials) for g in again] == [((0, 2), 6), ((1,), 3)]
    assert all(abs((g.deadline_at - later).total_seconds()) < 1 for g in again if g.deadline_at)

    assert store.heartbeat_task_group(first.id, "owner") is None  # not its group
    assert store.heartbeat_task_group(first.id, "helper") is not None
    assert not store.finish_task_group(first.id, "owner", TaskGroupStatus.DONE)
    assert store.finish_task_group(first.id, "helper", TaskGroupStatus.DONE)
    assert store.heartbeat_task_group(first.id, "helper") is None  # done: no longer running
    assert [g.status for g in store.task_groups(job_id)] == [TaskGroupStatus.DONE, TaskGroupStatus.RUNNING]


def test_a_cancelled_jobs_groups_are_not_claimed_and_can_be_closed(store: Store) -> None:
    job_id = add_job(store)
    store.split_job(job_id, [([0], 1), ([1], 1)], None)
    store.mark_job_running(job_id, "owner")
    claimed = store.claim_task_group("helper")
    store.request_cancel(job_id)
    assert store.claim_task_group("other") is None
    assert store.close_task_groups(job_id, "the job was cancelled") == 2
    assert store.heartbeat_task_group(claimed.id, "helper") is None
    ended = store.task_groups(job_id)
    assert all(g.status is TaskGroupStatus.FAILED and g.error == "the job was cancelled" for g in ended)


def test_a_lost_workers_group_is_requeued_then_failed_out_of_attempts(store: Store) -> None:
    job_id = add_job(store)
    store.split_job(job_id, [([0], 4)], None)
    store.mark_job_running(job_id, "owner")
    group = store.claim_task_group("doomed")
    assert store.requeue_stale_task_groups(stale_after_s=60, max_attempts=2) == []  # fresh heartbeat
    time.sleep(1.1)
    (requeued,) = store.requeue_stale_task_groups(stale_after_s=1, max_attempts=2, job_id=job_id)
    assert requeued.status is TaskGroupStatus.QUEUED and requeued.worker is None
    assert "worker doomed stopped heartbeating" in (requeued.error or "")

    again = store.claim_task_group("rescuer")
    assert again is not None and again.id == group.id and again.attempts == 2
    # A shutdown hands it back without counting the attempt; a crash counts it, and at the limit it fails.
    back = store.release_task_group(again.id, "rescuer", "worker rescuer stopped", 2, counted=False)
    assert back is not None and back.status is TaskGroupStatus.QUEUED and back.attempts == 1
    again = store.claim_task_group("rescuer")
    assert store.release_task_group(again.id, "someone-else", "crashed", 2) is None
    failed = store.release_task_group(again.id, "rescuer", "the tuning process was killed by SIGSEGV", 2)
    assert failed is not None and failed.status is TaskGroupStatus.FAILED
    assert failed.error == "the tuning process was killed by SIGSEGV; gave up after 2 attempts"
    assert store.claim_task_group("rescuer") is None


def test_racing_workers_never_claim_the_same_group(store: Store) -> None:
    job_id = add_job(store)
    store.split_job(job_id, [([i], 1) for i in range(12)], None)
    store.mark_job_running(job_id, "owner")
    claimed: dict[str, list[int]] = {f"w{i}": [] for i in range(4)}

    def claim_all(worker: str) -> None:
        while (group := store.claim_task_group(worker)) is not None:
            claimed[worker].append(group.index)

    threads = [threading.Thread(target=claim_all, args=(w,)) for w in claimed]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = sorted(i for indices in claimed.values() for i in indices)
    assert every == list(range(12))


def test_job_progress_is_the_sum_of_its_tasks_trials(store: Store) -> None:
    job_id = add_job(store)
    workload = store.add_workload("h", "[]", "script", None, "")
    tasks = store.add_tasks(
        job_id, [{"name": f"t{i}", "weight": 1, "flops": 1.0, "workload_id": workload} for i in range(3)]
    )
    store.update_task(tasks[0].id, trials=5, best_latency_us=1.0)
    store.update_task(tasks[2].id, trials=4, best_latency_us=None)
    assert store.refresh_job_progress(job_id) == 9
    assert store.get_job(job_id).trials_done == 9
    assert store.get_job(job_id).status is JobStatus.QUEUED


def test_a_group_taken_back_counts_the_records_its_lost_worker_stored_but_did_not_count(store: Store) -> None:
    job_id = add_job(store)
    workloads = [store.add_workload(f"h{i}", "[]", "script", None, "") for i in range(3)]
    tasks = store.add_tasks(
        job_id,
        [{"name": f"t{i}", "weight": 1, "flops": 1.0, "workload_id": w} for i, w in enumerate(workloads)],
    )
    # t0: two batches of 2 counted, then a third stored (records committed) before its worker was killed:
    # the lost batch found t0's best, 5 us.
    for run_sec in (1e-5, 1e-5, 1e-5, 1e-5, 5e-6):
        add_record(store, workloads[0], [run_sec], job_id=job_id)
    store.update_task(tasks[0].id, trials=4, best_latency_us=10.0)
    # t1: all it stored was counted, a failed candidate among them; t2: nothing measured yet.
    add_record(store, workloads[1], [2e-5], job_id=job_id)
    add_record(store, workloads[1], [], job_id=job_id, error="build failed")
    store.update_task(tasks[1].id, trials=2, best_latency_us=20.0)
    store.refresh_job_progress(job_id)
    counted = recount_tasks(store, job_id, store.list_tasks(job_id), TARGET, None)
    assert [t.trials for t in counted] == [5, 2, 0]
    assert [t.best_latency_us for t in counted] == [pytest.approx(5.0), 20.0, None]
    assert [t.trials for t in store.list_tasks(job_id)] == [5, 2, 0]
    assert store.get_job(job_id).trials_done == 7
    assert recount_tasks(store, job_id, counted, TARGET, None) == counted  # counted once


def _split_job_with_tasks(store: Store) -> tuple[Job, list[Task]]:
    """A running job of three tasks, split by its worker "old" into two groups, as :func:`tune_split` split
    it before; a helper tunes the second group."""
    job_id = add_job(store)
    workloads = [store.add_workload(f"h{i}", "[]", "script", None, "") for i in range(3)]
    tasks = store.add_tasks(
        job_id,
        [{"name": f"t{i}", "weight": 1, "flops": 1.0, "workload_id": w} for i, w in enumerate(workloads)],
    )
    job = store.mark_job_running(job_id, "old")
    store.split_job(job_id, [([0, 2], 6), ([1], 3)], None)
    assert store.claim_task_group("helper", job_id=job_id).index == 0
    return replace(job, spec=replace(job.spec, workers=2)), tasks


def test_a_job_taken_over_keeps_its_groups_for_the_new_owner(store: Store, settings: Settings) -> None:
    job, tasks = _split_job_with_tasks(store)
    # "old" stopped heartbeating: the job went back to the queue, and "new" claimed it.
    assert [j.id for j in store.requeue_stale(stale_after_s=0, max_attempts=3)] == [job.id]
    assert store.claim_job("new").id == job.id
    stop = JobStopCheck(store, job.id, "old", every_s=0)
    groups = tune_split(store, settings, job, tasks, worker="old", should_stop=stop, time_left_s=lambda: None)
    assert stop.reason is StopReason.TAKEN_OVER
    # Nothing closed: the helper's group is still its own, the other waits for the new owner, who resumes.
    assert [(g.status, g.worker, g.error) for g in groups] == [
        (TaskGroupStatus.RUNNING, "helper", None),
        (TaskGroupStatus.QUEUED, None, None),
    ]
    assert store.claim_task_group("new", job_id=job.id).index == 1
    assert store.get_job(job.id).status is JobStatus.RUNNING


def test_a_cancelled_split_job_closes_its_groups(store: Store, settings: Settings) -> None:
    job, tasks = _split_job_with_tasks(store)
    store.request_cancel(job.id)
    stop = JobStopCheck(store, job.id, "old", every_s=0)
    groups = tune_split(store, settings, job, tasks, worker="old", should_stop=stop, time_left_s=lambda: None)
    assert stop.reason is StopReason.CANCELLED
    assert all(g.status is TaskGroupStatus.FAILED and g.error == "the job was cancelled" for g in groups)


def test_why_a_job_s_tuning_stops(store: Store) -> None:
    job = store.mark_job_running(add_job(store), "owner")
    assert stop_reason(job, "owner") is None and stop_reason(job, None) is None
    assert stop_reason(job, "someone-else") is StopReason.TAKEN_OVER
    assert stop_reason(replace(job, status=JobStatus.QUEUED), None) is StopReason.TAKEN_OVER
    assert stop_reason(replace(job, cancel_requested=True), "owner") is StopReason.CANCELLED
    assert stop_reason(replace(job, status=JobStatus.FAILED), "owner") is StopReason.ENDED
    assert [r.ends_job for r in StopReason] == [True, True, False]


def test_a_tuning_process_that_ends_after_its_job_was_taken_over_records_nothing(
    store: Store, settings: Settings
) -> None:
    """The supervisor of a process that exited once the job was no longer its own (it stopped on seeing
    the takeover) leaves the job to its new owner, rather than failing it for the exit."""
    job = store.mark_job_running(add_job(store), "old")
    store.requeue_stale(stale_after_s=0, max_attempts=3)
    assert store.claim_job("new").id == job.id
    Worker(settings, "old", store)._record_outcome(job, 0, Outcome.EXITED)
    now = store.get_job(job.id)
    assert (now.status, now.worker, now.error) == (JobStatus.RUNNING, "new", None)
