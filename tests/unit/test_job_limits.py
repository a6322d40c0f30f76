"""A job's limits (memory of its process tree, time per stage) and the end of jobs whose ``kiln tune``
process is gone."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.store_rows import add_job
from tuner.entities import JobStatus
from tuner.jobs.in_process import cli_worker_name, sweep_dead_local_jobs
from tuner.jobs.limits import JobLimits, JobWatch, tree_memory_bytes
from tuner.settings import Settings
from tuner.store import Store


def _limits(**overrides: float) -> JobLimits:
    values = {"job_memory_mb": 1024, "import_timeout_s": 30.0, "job_stage_timeout_s": 60.0}
    return JobLimits.from_settings(Settings(database_url=None, **{**values, **overrides}))


def test_planning_is_held_to_the_preview_limit_with_the_preview_reason() -> None:
    limits = _limits()
    for stage in ("importing", "extracting tasks"):
        seconds, reason = limits.stage_limit(stage, None)
        assert seconds == 30.0
        assert reason == "import took longer than 30 s (KILN_IMPORT_TIMEOUT_S, KILN_IMPORT_CPU_S)"


def test_tuning_may_run_a_stage_limit_past_its_budget_or_the_tuning_limit_without_one() -> None:
    limits = _limits(job_tuning_timeout_s=3600.0)
    assert limits.stage_limit("tuning", 120.0)[0] == 180.0
    assert "time budget of 120 s" in limits.stage_limit("tuning", 120.0)[1]
    seconds, reason = limits.stage_limit("tuning", None)
    assert seconds == 3600.0 and "KILN_JOB_TUNING_TIMEOUT_S" in reason
    seconds, reason = limits.stage_limit("verifying", 120.0)
    assert seconds == 60.0 and reason == "the job spent longer than 60 s verifying (KILN_JOB_STAGE_TIMEOUT_S)"


@pytest.fixture
def allocator() -> Iterator[subprocess.Popen[str]]:
    """A small process whose child holds 400 MiB of touched memory once told to (on the parent's stdin):
    a watch that counted only the root process would see a small interpreter."""
    holder = (
        "import sys\n"
        "sys.stdin.readline()\n"
        "held = bytearray(400 << 20)\n"
        "held[::4096] = b'x' * len(held[::4096])\n"
        "print('holding', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    code = (
        "import subprocess, sys\n"
        f"child = subprocess.Popen([sys.executable, '-c', {holder!r}], stdin=subprocess.PIPE,"
        " stdout=subprocess.PIPE, text=True)\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "child.stdin.write('go\\n')\n"
        "child.stdin.flush()\n"
        "print(child.stdout.readline().strip(), flush=True)\n"
        "sys.stdin.readline()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc
    import psutil

    for child in psutil.Process(proc.pid).children(recursive=True):
        child.kill()
    proc.kill()
    proc.wait()


def test_the_watch_counts_the_whole_process_tree_against_the_memory_limit(
    allocator: subprocess.Popen[str],
) -> None:
    before = tree_memory_bytes(allocator.pid)
    watch = JobWatch(_limits(job_memory_mb=256), allocator.pid, None)
    assert 0 < before < 200 << 20  # two small interpreters
    assert watch.check("verifying") is None

    assert allocator.stdin is not None and allocator.stdout is not None
    allocator.stdin.write("go\n")
    allocator.stdin.flush()
    assert allocator.stdout.readline().strip() == "holding"

    reason = watch.check("verifying")
    assert reason is not None
    assert "more than 256 MiB" in reason and "while verifying" in reason and "KILN_JOB_MEMORY_MB" in reason
    assert watch.peak_bytes >= 400 << 20
    import psutil

    assert psutil.Process(allocator.pid).memory_info().rss < 100 << 20  # the child holds it


def test_the_watch_times_planning_as_one_stage_and_restarts_the_clock_at_the_next() -> None:
    watch = JobWatch(_limits(import_timeout_s=0.3, job_memory_mb=1 << 20), 1 << 30, None)  # no such pid
    assert watch.check("importing") is None
    time.sleep(0.2)
    assert watch.check("extracting tasks") is None  # the same clock as importing
    time.sleep(0.2)
    assert "KILN_IMPORT_TIMEOUT_S" in (watch.check("extracting tasks") or "")
    assert watch.check("tuning") is None  # a new stage, a new clock


def test_jobs_of_a_dead_kiln_tune_process_on_this_host_are_cancelled(store: Store) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead_pid = int(gone.stdout)
    orphan, alive, elsewhere = add_job(store), add_job(store), add_job(store)
    host_prefix = cli_worker_name().rsplit(":", 1)[0]
    store.mark_job_running(orphan, f"{host_prefix}:{dead_pid}")
    store.mark_job_running(alive, cli_worker_name())  # this process: alive
    store.mark_job_running(elsewhere, f"another-host:cli:{dead_pid}")  # not ours to judge

    swept = sweep_dead_local_jobs(store)

    assert [job.id for job in swept] == [orphan]
    ended = store.get_job(orphan)
    assert ended.status is JobStatus.CANCELLED and f"pid {dead_pid}" in (ended.error or "")
    assert store.get_job(alive).status is JobStatus.RUNNING
    assert store.get_job(elsewhere).status is JobStatus.RUNNING
