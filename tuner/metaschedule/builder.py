"""A MetaSchedule builder whose worker processes live across batches.

TVM's ``LocalBuilder`` starts a new process pool for every batch (to contain a slow memory leak in
long-lived workers). Each new worker imports TVM (1-5 s here, more with torch installed), which for small
kernels costs far more than building them. This builder keeps its pool and recycles it every
``recycle_after`` batches instead; a worker that times out or crashes is replaced at its next build, and
one stuck past its timeout (its own timer never started) is killed by this process
(:class:`~tuner.metaschedule.deadline_workers.DeadlineWorkers`).

A candidate's build may take at most ``timeout_sec``, and, under a time budget, no more than the time left
(in steps of :data:`BUILD_TIMEOUT_STEP_S`, at least that): some candidates compile for minutes (a long
epilogue inside a loop nest unrolled 512 times), and a batch of them at the full timeout overran a
2-minute budget by two minutes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kiln_tvm import (
    build_candidate,
    build_worker_func,
    derived_object,
    ms,
    serialize_build_params,
)
from tuner.metaschedule.deadline_workers import DeadlineWorkers

log = logging.getLogger(__name__)

#: Under a time budget, build timeouts are whole multiples of this, and never shorter.
BUILD_TIMEOUT_STEP_S = 10.0


def build_timeout(timeout_sec: float, time_left_s: float | None) -> float:
    """A candidate's build timeout: ``timeout_sec``, or the time left if shorter (rounded down to
    :data:`BUILD_TIMEOUT_STEP_S`, at least one step)."""
    if time_left_s is None or time_left_s >= timeout_sec:
        return timeout_sec
    steps = max(1, int(time_left_s // BUILD_TIMEOUT_STEP_S))
    return min(timeout_sec, steps * BUILD_TIMEOUT_STEP_S)


def _build_one(args: tuple[Any, ...]) -> str:
    return build_worker_func(*args)


@derived_object
class PooledBuilder(ms.builder.PyBuilder):
    """Builds candidates in a persistent pool of worker processes."""

    def __init__(
        self,
        max_workers: int,
        timeout_sec: float = 60.0,
        recycle_after: int = 25,
        time_left_s: Callable[[], float | None] | None = None,
    ) -> None:
        super().__init__()
        self.max_workers = max_workers
        self.timeout_sec = timeout_sec
        self.recycle_after = recycle_after
        self.time_left_s = time_left_s
        self._pool: DeadlineWorkers | None = None
        self._pool_timeout = timeout_sec
        self._batches = 0

    def current_timeout(self) -> float:
        """The build timeout of the next batch."""
        return build_timeout(self.timeout_sec, self.time_left_s() if self.time_left_s is not None else None)

    def _ensure_pool(self) -> DeadlineWorkers:
        timeout = self.current_timeout()
        if self._pool is not None and (self._batches >= self.recycle_after or timeout != self._pool_timeout):
            self.shutdown()
        if self._pool is None:
            self._pool = DeadlineWorkers(self.max_workers, timeout_s=timeout)
            self._pool_timeout = timeout
            self._batches = 0
        self._batches += 1
        return self._pool

    def build(self, build_inputs: list[Any]) -> list[Any]:
        pool = self._ensure_pool()
        jobs = [
            (build_candidate, None, item.mod, item.target, serialize_build_params(item.params))
            for item in build_inputs
        ]
        results = []
        for outcome in pool.run(_build_one, [(job,) for job in jobs]):
            if isinstance(outcome, TimeoutError):
                results.append(
                    ms.builder.BuilderResult(None, f"build timed out after {self._pool_timeout:g} s")
                )
            elif isinstance(outcome, BaseException):
                results.append(ms.builder.BuilderResult(None, f"build failed: {outcome}"))
            else:
                results.append(ms.builder.BuilderResult(outcome, None))
        return results

    def shutdown(self) -> None:
        """Stop the worker processes."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
