"""Fixtures of the end-to-end tests: a real `kiln serve` process on a free loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Starts `kiln serve` (one embedded worker, SQLite) with extra KILN_* variables; returns its URL.

    Every server started is stopped with SIGTERM at teardown and must shut down gracefully.
    """
    started: list[tuple[subprocess.Popen[bytes], Path]] = []
    processes: dict[str, subprocess.Popen[bytes]] = {}
    data_dirs: dict[str, str] = {}

    def start(**env_vars: str) -> str:
        port = _free_port()
        name = f"server-{len(started)}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
        env.update({"KILN_DATA_DIR": str(tmp_path / name), "KILN_NUM_TRIALS_PER_ITER": "4", **env_vars})
        log_path = tmp_path / f"{name}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "cli", "serve", "--port", str(port)],
                env=env,
                stdout=log,
                stderr=log,
            )
        started.append((proc, log_path))
        url = f"http://127.0.0.1:{port}"
        processes[url] = proc
        data_dirs[url] = env["KILN_DATA_DIR"]
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    return url
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("server did not start:\n" + log_path.read_text())
            time.sleep(0.3)

    start.processes = processes  # type: ignore[attr-defined]  # url -> the server's process
    start.data_dirs = data_dirs  # type: ignore[attr-defined]  # url -> its KILN_DATA_DIR
    yield start
    for proc, log_path in started:
        proc.terminate()
        try:
            # uvicorn shuts down gracefully, then re-raises SIGTERM so that the exit status tells why.
            assert proc.wait(timeout=30) in (0, -15)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert "Application shutdown complete" in log_path.read_text()


@pytest.fixture
def server(start_server: Callable[..., str]) -> str:
    """The URL of a `kiln serve` with default settings."""
    return start_server()
