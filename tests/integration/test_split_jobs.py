"""A job split over two workers, for real (SQLite and PostgreSQL): each worker tunes its own group of the
job's tasks in its own tuning process, the job's worker compiles once, and a helper killed mid-group costs
only its unfinished batch.

The MLP has two tasks (fc1 + ReLU, fc2), so a job with ``workers=2`` has one task per group.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest

from tests.artifacts import onnxruntime_output, run_artifact_in_fresh_process
from tests.model_builders import build_mlp
from tests.worker_processes import wait_for, worker_process
from tuner.entities import Job, JobSpec, JobStatus, TaskGroup, TaskGroupStatus
from tuner.jobs.submission import submit_job
from tuner.jobs.worker import Worker
from tuner.metaschedule.cost_model import scope_key
from tuner.model_registry import register_model
from tuner.settings import Settings
from tuner.store import Store

pytestmark = pytest.mark.slow

TRIALS = 48  # 24 per group: three rounds of 8, so that a helper can be killed with rounds to go


@pytest.fixture
def split_job(store: Store, fault_settings: Settings, tmp_path: Path) -> Callable[[int], Job]:
    path = tmp_path / "mlp.onnx"
    onnx.save(build_mlp(seed=9), str(path))
    model, _ = register_model(store, fault_settings, path)

    def submit(seed: int) -> Job:
        spec = JobSpec(model_id=model.id, target="host", trials=TRIALS, seed=seed, workers=2)  # type: ignore[arg-type]
        return submit_job(store, spec)

    return submit


def _records_per_task(store: Store, job_id: str) -> dict[int, int]:
    counts = store.job_trial_counts(job_id)
    return {task.id: counts.get(task.workload_id, 0) for task in store.list_tasks(job_id)}


def _group_records(store: Store, job_id: str, group: TaskGroup) -> int:
    tasks = store.list_tasks(job_id)
    per_task = _records_per_task(store, job_id)
    return sum(per_task[tasks[i].id] for i in group.task_indices)


def _check_artifact(store: Store, job: Job, tmp_path: Path) -> None:
    x = np.random.default_rng(9).standard_normal((1, 256)).astype(np.float32)
    got = run_artifact_in_fresh_process(Path(store.get_artifact(job.id).path), x, tmp_path)
    np.testing.assert_allclose(got, onnxruntime_output(tmp_path / "mlp.onnx", x), rtol=1e-4, atol=1e-5)


def test_a_job_split_over_two_workers_tunes_each_task_once_and_compiles_once(
    store: Store,
    fault_settings: Settings,
    split_job: Callable[[int], Job],
    in_thread: Callable[[Worker], threading.Thread],
    tmp_path: Path,
) -> None:
    job = split_job(11)
    owner = Worker(fault_settings, "owner", store)
    owner_thread = in_thread(owner)
    wait_for(lambda: store.task_groups(job.id), "the job's worker to split it")
    helper = Worker(fault_settings, "helper", store)
    helped = wait_for(helper.run_once, "the helper to tune a group")
    assert helped.id == job.id  # type: ignore[attr-defined]
    owner_thread.join(timeout=600)
    assert not owner_thread.is_alive()

    done = store.get_job(job.id)
    assert done.status is JobStatus.SUCCEEDED, done.error
    assert done.worker == "owner" and done.attempts == 1  # the job's worker compiled it
    groups = store.task_groups(job.id)
    tasks = store.list_tasks(job.id)
    assert [g.status for g in groups] == [TaskGroupStatus.DONE, TaskGroupStatus.DONE]
    assert {g.worker for g in groups} == {"owner", "helper"}  # one group each
    assert sorted(i for g in groups for i in g.task_indices) == list(range(len(tasks))) == [0, 1]
    assert all(g.attempts == 1 for g in groups)
    # Each task was tuned once, by its group: its records are its trials, within its group's share (a
    # search in rounds of 8 may leave the last few of a share unspent, as an unsplit job's does).
    per_task = _records_per_task(store, job.id)
    assert [per_task[t.id] for t in tasks] == [t.trials for t in tasks]
    assert all(0 < per_task[tasks[g.index].id] <= g.trials == TRIALS // 2 for g in groups)
    assert sum(per_task.values()) == done.trials_done
    assert all(t.best_latency_us is not None and t.schedule_source == "tuned" for t in tasks)
    # The cost model kept for the next job learnt every group's records, not one group's: each group keeps
    # the model it searched with, taught what the other stored meanwhile, and the newest keep wins.
    records = store.list_records(job_id=job.id)
    kept = store.get_cost_model(done.target_key, scope_key(fault_settings.record_scope(done.owner)))
    assert kept is not None
    assert kept.last_record_id == max(r.id for r in records)
    valid = [r for r in records if r.mean_latency_us is not None]
    assert kept.samples >= len(valid), (kept.samples, len(valid), len(records))
    _check_artifact(store, done, tmp_path)


def test_a_helper_killed_mid_group_loses_only_its_batch_and_the_job_finishes(
    store: Store,
    fault_settings: Settings,
    split_job: Callable[[int], Job],
    in_thread: Callable[[Worker], threading.Thread],
    processes: list,
    tmp_path: Path,
) -> None:
    job = split_job(12)
    # The helper is a process of its own, started first so that it claims the job's second group while
    # the job's worker tunes the first; then it is killed with SIGKILL.
    owner = Worker(fault_settings, "owner", store)
    owner_thread = in_thread(owner)
    wait_for(lambda: store.task_groups(job.id), "the job's worker to split it")
    helper = worker_process(fault_settings, "doomed")
    processes.append(helper)

    def helper_measured() -> bool:
        groups = [g for g in store.task_groups(job.id) if g.worker == "doomed"]
        if not groups or groups[0].status is not TaskGroupStatus.RUNNING:
            return False
        return _group_records(store, job.id, groups[0]) >= 1

    wait_for(helper_measured, "the helper to measure a batch of its group")
    (taken,) = [g for g in store.task_groups(job.id) if g.worker == "doomed"]
    before = {r.id for r in store.list_records(job_id=job.id)}
    killed_at = _group_records(store, job.id, taken)
    assert killed_at < taken.trials  # killed with its group unfinished
    descendants = psutil.Process(helper.pid).children(recursive=True)
    helper.send_signal(signal.SIGKILL)
    helper.wait()
    _, alive = psutil.wait_procs(descendants, timeout=30)
    assert not alive, [(p.pid, p.name()) for p in alive]

    owner_thread.join(timeout=600)
    assert not owner_thread.is_alive()
    done = store.get_job(job.id)
    assert done.status is JobStatus.SUCCEEDED, done.error
    assert done.attempts == 1  # the job itself never stopped
    groups = {g.id: g for g in store.task_groups(job.id)}
    again = groups[taken.id]
    # The job's worker took the lost group back once it went stale, and finished it from its records.
    assert again.status is TaskGroupStatus.DONE and again.worker == "owner" and again.attempts == 2
    assert "worker doomed stopped heartbeating" in (again.error or "")
    after = {r.id for r in store.list_records(job_id=job.id)}
    assert before < after  # everything the helper measured is still the job's
    # Resumed, not restarted: over both attempts the group measured more, and no more than its share.
    assert killed_at < _group_records(store, job.id, again) <= again.trials
    assert sum(_records_per_task(store, job.id).values()) == done.trials_done <= TRIALS
    _check_artifact(store, done, tmp_path)


def test_a_helper_s_group_is_held_to_the_job_s_memory_limit_and_the_job_s_worker_finishes_it(
    store: Store,
    fault_settings: Settings,
    split_job: Callable[[int], Job],
    in_thread: Callable[[Worker], threading.Thread],
    database_url: str,
    tmp_path: Path,
) -> None:
    """A helper's tuning process is watched like the job's own: over the memory limit (the helper's is set
    below what a tuning process needs), it is stopped, its group goes back to the queue with the limit's
    reason, and the job's worker tunes it."""
    if not database_url.startswith("sqlite"):
        pytest.skip(
            "the watch does not depend on the database; SQLite covers it (and both backends the queue)"
        )
    job = split_job(13)
    owner = Worker(fault_settings, "owner", store)
    owner_thread = in_thread(owner)
    wait_for(lambda: store.task_groups(job.id), "the job's worker to split it")
    starved = Worker(fault_settings.model_copy(update={"job_memory_mb": 256}), "starved", store)
    helped = starved.run_once()
    owner_thread.join(timeout=600)
    assert not owner_thread.is_alive()

    done = store.get_job(job.id)
    assert done.status is JobStatus.SUCCEEDED, done.error
    groups = store.task_groups(job.id)
    assert [g.status for g in groups] == [TaskGroupStatus.DONE, TaskGroupStatus.DONE]
    if helped is None:
        pytest.fail("the job's worker tuned both groups before the helper could claim one")
    (taken,) = [g for g in groups if g.attempts == 2]
    assert taken.worker == "owner"
    assert "needed more than 256 MiB" in (taken.error or ""), taken.error
    (index,) = taken.task_indices
    assert _records_per_task(store, job.id)[store.list_tasks(job.id)[index].id] > 0
    _check_artifact(store, done, tmp_path)
