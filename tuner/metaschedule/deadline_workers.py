"""Worker processes whose calls end by a deadline the parent keeps.

TVM's ``PopenPoolExecutor`` bounds a call by a timer inside the worker. A worker that never starts the
timer (stuck loading the call's modules) or never gets to run it leaves the parent waiting on its pipe
for good, and a runner waiting on it holds its job, and a test, forever. Here the parent waits each call
at most its timeout plus :data:`GRACE_S`, then kills the worker (replaced at the next call) and reports
the call as timed out.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import psutil

from kiln_tvm import PopenWorker

#: How long past a call's timeout the parent waits for the worker's own answer before killing it.
GRACE_S = 10.0
#: How long a worker may take to start (forked from the fork server, which may first have to start).
START_TIMEOUT_S = 120.0


class DeadlineWorkers:
    """``count`` worker processes, each running one call at a time within ``timeout_s``."""

    def __init__(self, count: int, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._workers = [PopenWorker() for _ in range(count)]
        self._threads = ThreadPoolExecutor(max_workers=count, thread_name_prefix="kiln-deadline-worker")

    @property
    def count(self) -> int:
        """How many calls run at once."""
        return len(self._workers)

    def run(self, func: Callable[..., Any], calls: Sequence[tuple[Any, ...]]) -> list[Any]:
        """``func(*args)`` for each ``args`` of ``calls`` (at most :attr:`count`), each in a worker of its
        own, all at once: each call's value, or the exception it raised (``TimeoutError`` for a call
        that overstayed, whose worker was killed)."""
        if len(calls) > self.count:
            raise ValueError(f"{len(calls)} calls for {self.count} workers")
        sent = [_Sent() for _ in calls]
        futures = [
            self._threads.submit(_call, worker, func, args, self.timeout_s, at)
            for worker, args, at in zip(self._workers, calls, sent, strict=False)
        ]
        return [
            self._outcome(future, worker, at)
            for future, worker, at in zip(futures, self._workers, sent, strict=False)
        ]

    def _outcome(self, future: Future, worker: Any, sent: _Sent) -> Any:
        try:
            # A worker's start (the fork server's first, loading TVM) is not the call's time.
            if not sent.done.wait(START_TIMEOUT_S):
                raise FutureTimeout
            deadline = sent.at + self.timeout_s + GRACE_S
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            _kill_process_tree(worker)
            # The thread's read of the pipe ends with the worker; the call is reported as timed out
            # whatever it says then.
            with contextlib.suppress(Exception):
                future.result(timeout=GRACE_S)
            return TimeoutError(f"the call did not end within {self.timeout_s + GRACE_S:g} s")
        except Exception as exc:  # noqa: BLE001 - the call's own failure is its outcome
            return exc

    def shutdown(self) -> None:
        """Stop the worker processes."""
        for worker in self._workers:
            worker.kill()
        self._threads.shutdown(wait=False)


class _Sent:
    """When a call reached its worker."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.at = 0.0


def _call(worker: Any, func: Callable[..., Any], args: tuple[Any, ...], timeout_s: float, sent: _Sent) -> Any:
    try:
        worker.send(func, args, None, timeout_s)
    finally:
        sent.at = time.monotonic()
        sent.done.set()
    return worker.recv()


def _kill_process_tree(worker: Any) -> None:
    """Kill a worker and its children by signal only: closing its pipes here would wait on the lock
    of the thread that reads them."""
    proc = getattr(worker, "_proc", None)
    if proc is None:
        return
    try:
        process = psutil.Process(proc.pid)
        for child in process.children(recursive=True):
            child.kill()
        process.kill()
    except psutil.NoSuchProcess:
        pass
