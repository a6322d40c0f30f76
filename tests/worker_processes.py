"""Workers as the fault and split-job tests run them: a ``kiln worker`` process, and waiting on the store."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable

from tuner.settings import Settings


def wait_for(condition: Callable[[], object], what: str, timeout_s: float = 300) -> object:
    """Poll ``condition`` until it is truthy (returned), failing after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def worker_process(settings: Settings, name: str) -> subprocess.Popen[bytes]:
    """`kiln worker --name NAME` on ``settings``' data directory and database, as its own process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env.update(
        {
            "KILN_DATA_DIR": str(settings.data_dir),
            "KILN_DATABASE_URL": settings.resolved_database_url,
            "KILN_HEARTBEAT_S": str(settings.heartbeat_s),
            "KILN_NUM_TRIALS_PER_ITER": str(settings.num_trials_per_iter),
            "KILN_POLL_INTERVAL_S": "0.2",
        }
    )
    return subprocess.Popen([sys.executable, "-m", "cli", "worker", "--name", name], env=env)
