"""Workers under faults, for real: a SIGKILLed worker, a segfaulting tuning process, SIGTERM, cancel.

Each test runs real tuning in real child processes; budgets are tiny (an MLP, 8 candidates per round).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest

from tests.artifacts import onnxruntime_output, run_artifact_in_fresh_process
from tests.model_builders import build_mlp
from tests.worker_processes import wait_for, worker_process
from tuner.entities import Job, JobSpec, JobStatus
from tuner.jobs.failures import crash_report_path
from tuner.jobs.submission import submit_job
from tuner.jobs.worker import Worker
from tuner.model_registry import register_model
from tuner.settings import Settings
from tuner.store import Store

pytestmark = pytest.mark.slow


@pytest.fixture
def queue(store: Store, fault_settings: Settings, tmp_path: Path) -> Callable[..., Job]:
    path = tmp_path / "mlp.onnx"
    onnx.save(build_mlp(seed=4), str(path))
    model, _ = register_model(store, fault_settings, path)

    def submit(trials: int, seed: int = 0) -> Job:
        return submit_job(store, JobSpec(model_id=model.id, target="host", trials=trials, seed=seed))  # type: ignore[arg-type]

    return submit


def test_job_of_a_sigkilled_worker_is_finished_by_another_keeping_its_records(
    store: Store, fault_settings: Settings, queue: Callable[..., Job], processes: list, tmp_path: Path
) -> None:
    job = queue(trials=40, seed=5)
    first = worker_process(fault_settings, "doomed")
    processes.append(first)
    wait_for(lambda: store.count_records(job_id=job.id) >= 8, "the first worker to measure a round")
    descendants = psutil.Process(first.pid).children(recursive=True)
    assert descendants, "the worker tunes in processes of its own"
    first.send_signal(signal.SIGKILL)
    first.wait()

    # Its tuning processes die with it (PR_SET_PDEATHSIG), every one of them by pid; then no record
    # arrives any more.
    _, alive = psutil.wait_procs(descendants, timeout=30)
    assert not alive, [(p.pid, p.name()) for p in alive]
    before = {r.id for r in store.list_records(job_id=job.id)}
    assert store.get_job(job.id).status is JobStatus.RUNNING  # nobody knows yet

    rescuer = Worker(fault_settings, "rescuer", store)
    wait_for(lambda: rescuer.run_once(), "the second worker to requeue and run the job")

    done = store.get_job(job.id)
    assert done.status is JobStatus.SUCCEEDED, done.error
    assert done.worker == "rescuer" and done.attempts == 2
    after = {r.id for r in store.list_records(job_id=job.id)}
    assert before < after  # every record measured before the kill is still the job's
    assert len(after) <= 40  # the resumed job spent only what was left of the budget
    assert store.job_progress(job.id)["trials_done"] == sum(t.trials for t in store.list_tasks(job.id))
    # The artifact, built from records of both workers, computes what onnxruntime computes.
    x = np.random.default_rng(5).standard_normal((1, 256)).astype(np.float32)
    got = run_artifact_in_fresh_process(Path(store.get_artifact(job.id).path), x, tmp_path)
    np.testing.assert_allclose(got, onnxruntime_output(tmp_path / "mlp.onnx", x), rtol=1e-4, atol=1e-5)


def test_segfaulting_tuning_process_fails_the_job_and_the_worker_keeps_serving(
    store: Store,
    fault_settings: Settings,
    queue: Callable[..., Job],
    database_url: str,
    in_thread: Callable[[Worker], threading.Thread],
) -> None:
    if not database_url.startswith("sqlite"):
        pytest.skip("process isolation does not depend on the database; SQLite covers it")
    job = queue(trials=200, seed=6)
    worker = Worker(fault_settings, "survivor", store)
    thread = in_thread(worker)
    wait_for(lambda: store.count_records(job_id=job.id) >= 1, "the job to measure")
    pid = worker.child_pid
    assert pid is not None
    os.kill(pid, signal.SIGSEGV)
    thread.join(timeout=60)
    assert not thread.is_alive()

    failed = store.get_job(job.id)
    assert failed.status is JobStatus.FAILED
    assert "killed by SIGSEGV (segmentation fault) while tuning" in failed.error
    # It died at once (not in TVM's own handler, which can deadlock) and left its threads' stacks.
    # The user is told where the stacks are, not the worker's path.
    report = crash_report_path(fault_settings.jobs_dir, job.id)
    assert "crash.txt in the job's directory on the worker" in failed.error
    assert str(fault_settings.jobs_dir) not in failed.error
    assert "Segmentation fault" in report.read_text()
    assert store.count_records(job_id=job.id) >= 1  # kept

    # The same worker takes the next job and finishes it (0 trials: compile from the stored records).
    nxt = queue(trials=0, seed=7)
    assert worker.run_once().id == nxt.id
    assert store.get_job(nxt.id).status is JobStatus.SUCCEEDED


def test_sigterm_hands_the_job_back_and_cancel_stops_a_running_job(
    store: Store,
    fault_settings: Settings,
    queue: Callable[..., Job],
    processes: list,
    database_url: str,
    in_thread: Callable[[Worker], threading.Thread],
) -> None:
    if not database_url.startswith("sqlite"):
        pytest.skip("covered on SQLite; the queue operations themselves are tested on both backends")
    job = queue(trials=400, seed=8)
    proc = worker_process(fault_settings, "polite")
    processes.append(proc)
    wait_for(lambda: store.count_records(job_id=job.id) >= 1, "the job to measure")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    handed_back = store.get_job(job.id)
    assert handed_back.status is JobStatus.QUEUED and handed_back.attempts == 0
    measured = store.count_records(job_id=job.id)
    assert measured >= 1

    worker = Worker(fault_settings, "second", store)
    thread = in_thread(worker)
    wait_for(lambda: store.count_records(job_id=job.id) > measured, "the job to resume")
    store.request_cancel(job.id)
    asked_at = time.monotonic()
    thread.join(timeout=60)
    stopped_after = time.monotonic() - asked_at
    cancelled = store.get_job(job.id)
    assert cancelled.status is JobStatus.CANCELLED, cancelled.error
    assert "records" in cancelled.error
    assert stopped_after < 30  # "within seconds": the grace period is 2 s here
    assert store.count_records(job_id=job.id) > measured
