"""TVM's pool workers (``PopenWorker``: MetaSchedule's builders and runners) forked from a fork server.

Stock ``PopenWorker`` starts ``python -m tvm.exec.popen_worker``, a fresh interpreter that loads TVM and
PyTorch (5-10 s of CPU) before building or measuring its first candidate; a tuning job starts three or
more of them (builders, a runner, their replacements after a timeout). :func:`install` makes every
``PopenWorker`` in this process fork from one fork server (:mod:`forkserver`) that loaded them
once. The server stays in this process's group, so killing a job's group still stops its workers; each
worker gets the environment of this process at its start, as a ``Popen`` child does. If the fork server
cannot be started, workers start as TVM starts them.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from typing import Any

from forkserver import ForkServer, ForkServerUnavailable, shared_fork_server

log = logging.getLogger(__name__)

_lock = threading.Lock()
_unavailable = False


def _fork_server() -> ForkServer | None:
    with _lock:
        return None if _unavailable else shared_fork_server("kiln_tvm.popen_workers", new_session=False)


def _std_fd(stream: Any, default: int) -> tuple[int, bool]:
    """The descriptor a ``Popen`` ``stdout=``/``stderr=`` argument names, and whether it is ours to close."""
    if stream is None:
        return default, False
    if stream == subprocess.DEVNULL:
        return os.open(os.devnull, os.O_WRONLY), True
    if isinstance(stream, int):
        return stream, False
    return stream.fileno(), False


def _start(self: Any, _stock: Any = None) -> None:
    """``PopenWorker._start``, forking from the fork server."""
    global _unavailable
    if self._proc is not None:
        return
    server = _fork_server()
    if server is None:
        _stock(self)
        return
    main_read, worker_write = os.pipe()
    worker_read, main_write = os.pipe()
    stdin = os.open(os.devnull, os.O_RDONLY)
    stdout, close_stdout = _std_fd(self._stdout, 1)
    stderr, close_stderr = _std_fd(self._stderr, 2)
    try:
        proc = server.spawn([stdin, stdout, stderr, worker_read, worker_write], dict(os.environ))
    except ForkServerUnavailable as exc:
        log.warning("%s; TVM's pool workers start as fresh interpreters", exc)
        with _lock:
            _unavailable = True
        for fd in (main_read, main_write):
            os.close(fd)
        proc = None
    finally:
        for fd in (stdin, worker_read, worker_write):
            os.close(fd)
        if close_stdout:
            os.close(stdout)
        if close_stderr:
            os.close(stderr)
    if proc is None:
        _stock(self)
        return
    self._proc = proc
    self._reader = os.fdopen(main_read, "rb")
    self._writer = os.fdopen(main_write, "wb")


def install() -> None:
    """Make ``PopenWorker`` fork its processes from this process's fork server (once per process)."""
    from tvm.support import popen_pool

    stock = popen_pool.PopenWorker._start
    if getattr(stock, "_kiln_forked", False):
        return

    def start(self: Any) -> None:
        _start(self, stock)

    start._kiln_forked = True  # type: ignore[attr-defined]
    popen_pool.PopenWorker._start = start


def warm_up() -> None:
    import cloudpickle  # noqa: F401
    import tvm.driver  # noqa: F401
    import tvm.exec.popen_worker  # noqa: F401

    # TVM, MetaSchedule, Kiln's intrinsics and build function are loaded already: ``python -m
    # kiln_tvm.popen_workers`` imports the package before this module runs.
    import kiln_tvm.host_cpu  # noqa: F401


def serve_one() -> None:
    from tvm.exec import popen_worker

    sys.argv = ["popen_worker", "3", "4"]  # the pipes to the parent, as descriptors 3 and 4
    popen_worker.main()
    os._exit(0)


def main() -> None:
    """``python -m kiln_tvm.popen_workers --fork-server FD``."""
    from forkserver import serve_main

    serve_main("kiln_tvm.popen_workers", warm_up, serve_one, new_session=False)


if __name__ == "__main__":
    main()
