"""Jobs held to their limits at every stage, for real: models that take gigabytes or minutes after their
upload was accepted fail their job with the limit's reason, within a bound, and the next job runs.

The job's process tree (the tuning process, its builders, runners and timing children) is measured here,
independently of the watch under test, through psutil's proportional set sizes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import onnx
import psutil
import pytest

from tests.hostile_models import nested_if_onnx, outer_product_onnx
from tests.model_builders import build_mlp
from tuner.entities import Job, JobSpec, JobStatus, ModelInfo
from tuner.errors import ImportTimeout
from tuner.isolation.sandbox import ModelSandbox
from tuner.jobs.submission import submit_job
from tuner.jobs.worker import Worker
from tuner.model_registry import register_model
from tuner.settings import Settings
from tuner.store import Store
from tuner.views.inspection import plan_model

# Serial: the limits are of wall-clock time and memory, and the tests wait on a job's stages with deadlines.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

# The job limits these tests set, small enough to reach quickly, large enough for a normal small job.
JOB_MEMORY_MB = 1536
PLANNING_S = 10.0
# How far past its limit a stopped job's processes may get before the watch (4 checks a second) stops
# them, and how long after its limit a job may take to be failed (the poll, the kill, the record).
MEMORY_SLACK_MB = 768
STOP_SLACK_S = 45.0


def _pss_tree_bytes(pid: int) -> int:
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            total += process.memory_full_info().pss
    return total


class _TreeSampler:
    """The peak memory of a worker's tuning process tree, sampled on a thread."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            pid = self.worker.child_pid
            if pid is not None:
                self.peak_bytes = max(self.peak_bytes, _pss_tree_bytes(pid))
            time.sleep(0.05)

    def __enter__(self) -> _TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def limited(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=None,
        job_memory_mb=JOB_MEMORY_MB,
        num_trials_per_iter=8,
        poll_interval_s=0.2,
        heartbeat_s=0.5,
        profile_budget_s=0.5,
    )


@pytest.fixture
def limited_store(limited: Settings) -> Iterator[Store]:
    store = Store.from_settings(limited)
    store.upgrade()
    yield store
    store.dispose()


def _register(store: Store, settings: Settings, model: onnx.ModelProto, name: str) -> ModelInfo:
    path = settings.data_dir.parent / f"{name}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    info, _ = register_model(store, settings, path)
    return info


def _queue(store: Store, model: ModelInfo, settings: Settings | None = None) -> Job:
    spec = JobSpec(model_id=model.id, target="host", trials=0)  # type: ignore[arg-type]
    return submit_job(store, spec, settings=settings)


def _run_bounded(worker: Worker, store: Store, job: Job) -> tuple[Job, float, int]:
    """Run ``job`` on ``worker``: the job after, the seconds it took, its process tree's peak memory."""
    started = time.monotonic()
    with _TreeSampler(worker) as sampler:
        ran = worker.run_once()
    assert ran is not None and ran.id == job.id
    return store.get_job(job.id), time.monotonic() - started, sampler.peak_bytes


def _next_job_succeeds(worker: Worker, store: Store, settings: Settings) -> None:
    mlp = _register(store, settings, build_mlp(seed=3), "mlp")
    job = _queue(store, mlp)
    done = worker.run_once()
    assert done is not None and done.id == job.id
    assert done.status is JobStatus.SUCCEEDED, done.error


def test_an_outer_product_job_fails_at_the_memory_limit_and_the_worker_runs_the_next(
    limited_store: Store, limited: Settings
) -> None:
    # 64 KB of model whose one output is 16384 x 16384 floats (1 GiB): unbounded, checking it took 8 GB.
    model = _register(limited_store, limited, outer_product_onnx(16384), "outer")
    job = _queue(limited_store, model)
    worker = Worker(limited, "bounded", limited_store)

    failed, took_s, peak = _run_bounded(worker, limited_store, job)

    assert failed.status is JobStatus.FAILED
    assert "KILN_JOB_MEMORY_MB" in (failed.error or "") and f"{JOB_MEMORY_MB} MiB" in (failed.error or "")
    assert peak <= (JOB_MEMORY_MB + MEMORY_SLACK_MB) << 20, f"peak {peak >> 20} MiB"
    assert peak >= (JOB_MEMORY_MB // 2) << 20  # the sampler saw the job grow: the bound held it
    assert took_s < limited.import_timeout_s + limited.job_stage_timeout_s
    assert "/" not in (failed.error or "")  # no server path in what the user reads
    _next_job_succeeds(worker, limited_store, limited)


def test_a_nested_if_model_is_held_to_the_preview_limit_in_its_job_and_refused_at_submit(
    limited_store: Store, limited: Settings
) -> None:
    # The upload is imported under the default limits; previews and jobs under a short planning limit.
    model = _register(limited_store, limited, nested_if_onnx(14), "nested")
    short = limited.model_copy(update={"import_timeout_s": PLANNING_S})

    with ModelSandbox(short, warm_processes=0) as sandbox, pytest.raises(ImportTimeout) as preview:
        plan_model(limited_store, short, sandbox, model, "host")
    assert not preview.value.machine_busy

    # A job asked for after the preview was refused is refused with the preview's reason...
    with pytest.raises(ImportTimeout) as refused:
        _queue(limited_store, model, short)
    assert preview.value.message in refused.value.message

    # ...and one queued without that check (before the preview) fails with it, within the bound.
    job = _queue(limited_store, model)
    worker = Worker(short, "bounded", limited_store)
    failed, took_s, peak = _run_bounded(worker, limited_store, job)

    assert failed.status is JobStatus.FAILED
    assert failed.error == preview.value.message
    assert took_s < PLANNING_S + STOP_SLACK_S
    assert peak <= (JOB_MEMORY_MB + MEMORY_SLACK_MB) << 20
    _next_job_succeeds(worker, limited_store, short)


# ---- kiln tune, in its own process ----------------------------------------------------------------------


def _kiln_tune(data_dir: Path, model: Path, **env: str) -> subprocess.Popen[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    environ.update({"KILN_DATA_DIR": str(data_dir), **env})
    return subprocess.Popen(
        [sys.executable, "-m", "cli", "tune", str(model), "--trials", "0"],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _only_job(data_dir: Path) -> Job:
    store = Store(f"sqlite:///{data_dir / 'kiln.db'}")
    try:
        jobs = store.list_jobs()
        assert len(jobs) == 1
        return jobs[0]
    finally:
        store.dispose()


def _wait_for_stage(data_dir: Path, stage: str, timeout_s: float = 120) -> Job:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (data_dir / "kiln.db").is_file():
            with contextlib.suppress(Exception):
                job = _only_job(data_dir)
                if job.stage == stage:
                    return job
        time.sleep(0.2)
    raise AssertionError(f"the job did not reach '{stage}' within {timeout_s:.0f} s")


@pytest.fixture
def nested_file(tmp_path: Path) -> Path:
    path = tmp_path / "nested.onnx"
    onnx.save(nested_if_onnx(14), str(path))
    return path


def test_kiln_tune_is_held_to_the_planning_limit(tmp_path: Path, nested_file: Path) -> None:
    data_dir = tmp_path / "limit"
    proc = _kiln_tune(data_dir, nested_file, KILN_IMPORT_TIMEOUT_S=str(PLANNING_S))
    _wait_for_stage(data_dir, "extracting tasks")
    started = time.monotonic()
    out, _ = proc.communicate(timeout=PLANNING_S + STOP_SLACK_S)
    assert proc.returncode == 1, out
    assert time.monotonic() - started < PLANNING_S + STOP_SLACK_S
    assert "KILN_IMPORT_TIMEOUT_S" in out
    job = _only_job(data_dir)
    assert job.status is JobStatus.FAILED and "KILN_IMPORT_TIMEOUT_S" in (job.error or "")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_kiln_tune_leaves_no_job_running(
    tmp_path: Path, nested_file: Path, signum: signal.Signals
) -> None:
    # Interrupted while the main thread is deep inside a TVM pass (minutes long), where Python's own
    # signal handling would wait for the pass to return.
    data_dir = tmp_path / "interrupted"
    proc = _kiln_tune(data_dir, nested_file)
    _wait_for_stage(data_dir, "extracting tasks")
    time.sleep(1)
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=STOP_SLACK_S)
    assert proc.returncode == 128 + signum, out
    job = _only_job(data_dir)
    assert job.status is JobStatus.CANCELLED, job
    assert signum.name in (job.error or "")


def test_a_sigkilled_kiln_tune_job_is_ended_by_the_next_kiln_command(
    tmp_path: Path, nested_file: Path
) -> None:
    data_dir = tmp_path / "killed"
    proc = _kiln_tune(data_dir, nested_file)
    running = _wait_for_stage(data_dir, "extracting tasks")
    proc.kill()
    proc.communicate(timeout=30)
    assert _only_job(data_dir).status is JobStatus.RUNNING  # nobody could record anything

    environ = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    listed = subprocess.run(
        [sys.executable, "-m", "cli", "jobs"],
        env={**environ, "KILN_DATA_DIR": str(data_dir)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert f"job {running.id} cancelled" in listed.stderr
    job = _only_job(data_dir)
    assert job.status is JobStatus.CANCELLED and f"pid {proc.pid}" in (job.error or "")
