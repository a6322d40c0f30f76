"""Worker processes whose calls end by a deadline the parent keeps.

TVM's ``PopenPoolExecutor`` bounds a call by a timer inside the worker. A worker that never starts the
timer (stuck loading the call's modules) or never gets to run it leaves the parent waiting on its pipe
for good, and a builder or runner waiting on it holds its job, and a test, forever. Here the parent
watches every call: one still running :data:`GRACE_S` past its timeout (or a worker not started within
:data:`START_TIMEOUT_S`) has its worker killed (replaced at the next call) and is reported as timed out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import psutil

from kiln_tvm import PopenWorker

#: How long past a call's timeout the parent waits for the worker's own answer before killing it.
GRACE_S = 10.0
#: How long a worker may take to start (forked from the fork server, which may first have to start).
START_TIMEOUT_S = 120.0
#: How often the parent looks for calls past their deadline.
WATCH_PERIOD_S = 0.25


class DeadlineWorkers:
    """``count`` worker processes, each running one call at a time within ``timeout_s``."""

    def __init__(self, count: int, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._slots = [_Slot() for _ in range(count)]
        self._threads = ThreadPoolExecutor(max_workers=count, thread_name_prefix="kiln-deadline-worker")

    @property
    def count(self) -> int:
        """How many calls run at once."""
        return len(self._slots)

    def run(self, func: Callable[..., Any], calls: Sequence[tuple[Any, ...]]) -> list[Any]:
        """``func(*args)`` for each ``args`` of ``calls``, up to :attr:`count` at once, each worker taking
        the next call when it is done: each call's value, or the exception it raised (``TimeoutError``
        for a call that overstayed, whose worker was killed). Calls up to :attr:`count` all start at
        once, each in a worker of its own."""
        outcomes: list[Any] = [None] * len(calls)
        queue = iter(range(len(calls)))
        taking = threading.Lock()

        def serve(slot: _Slot) -> None:
            while True:
                with taking:
                    index = next(queue, None)
                if index is None:
                    return
                outcomes[index] = slot.call(index, func, calls[index], self.timeout_s)

        busy = self._slots[: len(calls)]
        pending = {self._threads.submit(serve, slot) for slot in busy}
        while pending:
            _, pending = wait(pending, timeout=WATCH_PERIOD_S)
            for slot in busy:
                slot.kill_if_overdue(self.timeout_s + GRACE_S)
        return outcomes

    def shutdown(self) -> None:
        """Stop the worker processes."""
        for slot in self._slots:
            slot.worker.kill()
        self._threads.shutdown(wait=False)


class _Slot:
    """One worker process and the call it runs, which the parent may end."""

    def __init__(self) -> None:
        self.worker = PopenWorker()
        self._lock = threading.Lock()
        self._index: int | None = None  # the call in flight
        self._since = 0.0  # when it was handed to the worker, or began to wait for the worker's start
        self._sent = False
        self._killed: int | None = None  # the call whose worker the parent killed

    def call(self, index: int, func: Callable[..., Any], args: tuple[Any, ...], timeout_s: float) -> Any:
        with self._lock:
            self._index, self._since, self._sent = index, time.monotonic(), False
        try:
            self.worker.send(func, args, None, timeout_s)
            with self._lock:
                self._since, self._sent = time.monotonic(), True
            outcome = self.worker.recv()
        except Exception as exc:  # noqa: BLE001 - the call's own failure is its outcome
            outcome = exc
        with self._lock:
            self._index = None
            if self._killed == index:
                self._killed = None
                return TimeoutError(f"the call did not end within {timeout_s + GRACE_S:g} s")
        return outcome

    def kill_if_overdue(self, limit_s: float) -> None:
        """Kill the worker if its call has run past ``limit_s`` (or its start past the start timeout)."""
        with self._lock:
            if self._index is None or self._killed == self._index:
                return
            if time.monotonic() - self._since <= (limit_s if self._sent else START_TIMEOUT_S):
                return
            self._killed = self._index
            # By signal only: closing the worker's pipes here would wait on the lock of the thread that
            # reads them. The read then ends, and the worker is started again at the next call.
            proc = getattr(self.worker, "_proc", None)
            if proc is not None:
                _kill_process_tree(proc.pid)


def _kill_process_tree(pid: int) -> None:
    try:
        process = psutil.Process(pid)
        for child in process.children(recursive=True):
            child.kill()
        process.kill()
    except psutil.NoSuchProcess:
        pass
