"""A job's tuning process: forked from ``python -m tuner.jobs.worker_child --fork-server FD`` (which has
loaded TVM, the importers and the tuner once, and run nothing), it reads its job (or a split job's task
group) and the settings on stdin and runs the job (:func:`tuner.jobs.pipeline.execute_job`) or tunes the
group (:func:`tuner.jobs.task_groups.tune_claimed_group`); the worker that started it
(:mod:`tuner.jobs.worker`) supervises it.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys

from tuner.errors import KilnError
from tuner.jobs.failures import crash_report_path
from tuner.jobs.stop import JobStopCheck
from tuner.settings import Settings
from tuner.store import Store

log = logging.getLogger(__name__)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # If the worker is killed (even with SIGKILL), the kernel kills this process too.
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def warm_up() -> None:
    import tuner.isolation.fatal_signals  # noqa: F401
    import tuner.jobs.pipeline  # noqa: F401 - TVM, the importers, the tuner: loaded once, before any fork


def serve_one() -> None:
    """A job's tuning process (forked by the job fork server; the job and settings on stdin)."""
    request = json.loads(sys.stdin.read())
    worker, group_id = request["worker"], request.get("group_id")
    _die_with_parent()  # the fork server, which exits with the worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the worker, which decides
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from tuner.isolation.fatal_signals import report_fatal_signals
    from tuner.jobs.pipeline import execute_job
    from tuner.jobs.task_groups import tune_claimed_group

    settings = Settings.model_validate_json(request["settings"])
    store = Store.from_settings(settings)
    group = store.get_task_group(group_id) if group_id is not None else None
    job_id = group.job_id if group is not None else request["job_id"]
    crash_report = crash_report_path(settings.jobs_dir, job_id)
    crash_report.parent.mkdir(parents=True, exist_ok=True)
    report_fatal_signals(crash_report.open("a"))  # open for the life of the process
    try:
        job = store.get_job(job_id)
        if group is not None:
            tune_claimed_group(
                store, settings, job, group, worker=worker, should_stop=JobStopCheck(store, job_id, None)
            )
        else:
            execute_job(store, settings, job, should_stop=JobStopCheck(store, job_id, worker))
    except KilnError as exc:
        log.info("job %s ended: %s", job_id, exc.message)  # already recorded on the job
    finally:
        store.dispose()
    os._exit(0)


def main() -> None:
    """``python -m tuner.jobs.worker_child --fork-server FD``: the job fork server."""
    from forkserver import serve_main

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve_main("tuner.jobs.worker_child", warm_up, serve_one)


if __name__ == "__main__":
    main()
