"""Fixtures of the integration tests."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tuner.jobs.worker import Worker
from tuner.settings import Settings
from tuner.store import Store


@pytest.fixture
def sqlite_store(settings: Settings) -> Store:
    """The ``settings`` fixture's own SQLite store, for tests that run jobs with those settings (the
    store's behaviour on PostgreSQL is tested by the tests that take ``store``)."""
    store = Store.from_settings(settings)
    store.ensure_schema()
    return store


@pytest.fixture
def fault_settings(tmp_path: Path, database_url: str) -> Settings:
    """Settings of tests that run workers: fast heartbeats, a worker lost after 3 s, small rounds."""
    return Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        heartbeat_s=0.5,
        stale_after_s=3.0,
        num_trials_per_iter=8,
        cancel_grace_s=2.0,
        poll_interval_s=0.2,
    )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts (append them): killed at its end if still running."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def in_thread() -> Iterator[Callable[[Worker], threading.Thread]]:
    """Runs ``worker.run_once`` on a daemon thread; a test that fails while it runs still stops it,
    so neither its tuning process nor the thread outlives the test (a live thread would stall exit)."""
    started: list[tuple[Worker, threading.Thread]] = []

    def start(worker: Worker) -> threading.Thread:
        thread = threading.Thread(target=worker.run_once, name=f"worker-{worker.name}", daemon=True)
        thread.start()
        started.append((worker, thread))
        return thread

    yield start
    for worker, thread in started:
        worker.stop()  # hands the job back and kills its tuning process group
        thread.join(timeout=30)
