"""Kiln's task scheduler: MetaSchedule's gradient-based choice of the next task, with every batch committed
as soon as it is measured, and a stop before a batch that would overrun the time budget.

MetaSchedule's ``GradientBased`` scheduler first sends one batch of every task and joins none of them
until all are sent: its records are written, and its callbacks run, only after that first round. On a
model with 46 tasks that is many minutes in which the job shows no progress and a killed worker loses all
it measured. Kiln's runner measures each batch before returning (see :mod:`tuner.metaschedule.runner`),
so nothing is gained by waiting: this scheduler joins every finished batch before it picks the next task.
The choice follows MetaSchedule's (``src/s_tir/meta_schedule/task_scheduler/gradient_based.cc``): the
task with the largest weighted gradient of its best latency, the latency it may still shed per trial
estimated from its recent progress and from its **headroom**, how far its best is above its roofline
(the least time its FLOPs take at this machine's measured peak, and its bytes at the measured memory
bandwidth when they outgrow the last-level cache: :func:`tuner.tune.roofline_floors_ms`; 0 when unknown,
which is MetaSchedule's own formula). Trials so go where they can take the most off the model's latency:
a heavy call far above its roofline before a light one or one already near it. Where MetaSchedule visits
every task once in turn before choosing, this scheduler starts from the best latency each task already
has (its seeds, default schedules, an earlier job's records) and only visits, in turn, tasks that have
none.

A task stops being searched when its best is within :data:`ROOFLINE_STOP` of its roofline (nothing left
to find), or when its default schedule (measured before the search, :mod:`tuner.metaschedule.measured_seeds`)
is at least as fast as the best of its first searched batch (the rule serves it).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from kiln_tvm import derived_object, ms
from tuner.entities import record_latency_s

NO_TASK = -1  # what next_task_id returns to end the search
FAILED_MS = 1e9  # MetaSchedule's latency for a candidate that failed to build or run
#: A task whose best latency reaches this share of its roofline's speed is done (within ~5 % of it).
ROOFLINE_STOP = 0.95

StopCheck = Callable[[], bool]
TimeLeft = Callable[[], float | None]  # seconds left of a time budget; None: no time limit


@derived_object
class KilnTaskScheduler(ms.task_scheduler.PyTaskScheduler):
    """Gain-driven task selection that commits each batch at once and stops when told, or before a
    batch that would not fit in the time left (estimated from the batches so far).

    ``default_ms``: each task's default schedule's latency; ``known_ms``: the best latency each task has
    before the search; ``floor_ms``: each task's roofline latency (see the module docstring).
    """

    def __init__(
        self,
        *,
        should_stop: StopCheck | None = None,
        time_left_s: TimeLeft | None = None,
        alpha: float = 0.2,
        window_size: int = 3,
        seed: int = 0,
        default_ms: dict[int, float] | None = None,
        known_ms: dict[int, float] | None = None,
        floor_ms: dict[int, float] | None = None,
    ) -> None:
        super().__init__()
        self.default_ms = dict(default_ms or {})
        self.floor_ms = {i: f for i, f in (floor_ms or {}).items() if f > 0}
        self.searched: dict[int, int] = {}  # batches of the search joined, per task
        self.should_stop = should_stop
        self.time_left_s = time_left_s
        self.alpha = alpha
        self.window_size = window_size
        self.rng = random.Random(seed)
        self.best_history: dict[int, list[float]] = {
            i: [best] for i, best in (known_ms or {}).items() if best < FAILED_MS
        }
        self.stopped_at_roofline: set[int] = set()
        self.batch_s: list[float] = []  # how long each batch took (search + build + measure)
        self.picked_at: float | None = None

    # -- the scheduler proper ---------------------------------------------------------------------------

    def next_task_id(self) -> int:
        scheduler = self._outer()  # type: ignore[attr-defined]  # the TVM object this instance backs
        self._time_last_batch()
        self._join_finished(scheduler)
        if self._must_stop():
            return NO_TASK
        tasks = scheduler.tasks_
        for task_id, task in enumerate(tasks):
            if not task.is_terminated and self.within_roofline(task_id):
                self._stop_at_roofline(scheduler, task_id)
        alive = [i for i, task in enumerate(tasks) if not task.is_terminated]
        if not alive:
            return NO_TASK
        unvisited = [i for i in alive if i not in self.best_history]
        if unvisited:
            task_id = unvisited[0]
        else:
            task_id = self._steepest(alive, [float(tasks[i].task_weight) for i in alive])
            if tasks[task_id].runner_futures is not None:
                self._join(scheduler, task_id)
        self.picked_at = time.monotonic()
        return task_id

    def expected_gain(self, task_id: int, weight: float) -> float | None:
        """The model latency (ms, x ``weight`` calls) a task's next batch may take off: MetaSchedule's
        gradient with its best latency replaced by its headroom over the roofline; None: nothing valid
        measured."""
        history = self.best_history.get(task_id, [])
        n = len(history)
        if n == 0 or history[-1] >= FAILED_MS:
            return None
        best = history[-1]
        w = self.window_size
        backward = (history[n - 1 - w] - best) / w if n >= 1 + w else 0.0
        headroom = max(0.0, best - self.floor_ms.get(task_id, 0.0))
        return (self.alpha * backward + (1 - self.alpha) * headroom / n) * weight

    def within_roofline(self, task_id: int) -> bool:
        """Whether a task's best latency is within :data:`ROOFLINE_STOP` of its roofline (nothing left to
        find); False without a roofline."""
        floor = self.floor_ms.get(task_id)
        history = self.best_history.get(task_id)
        return floor is not None and bool(history) and floor >= ROOFLINE_STOP * history[-1]

    def _stop_at_roofline(self, scheduler: Any, task_id: int) -> None:
        self.stopped_at_roofline.add(task_id)
        scheduler.terminate_task(task_id)

    def _steepest(self, alive: list[int], weights: list[float]) -> int:
        """The task whose weighted best latency promises to fall most (:meth:`expected_gain`)."""
        grads = []
        for task_id, weight in zip(alive, weights, strict=True):
            gain = self.expected_gain(task_id, weight)
            grads.append(-1e9 if gain is None else gain)  # nothing valid measured: MetaSchedule skips it
        if max(grads) == min(grads):
            return self.rng.choice(alive)
        return alive[grads.index(max(grads))]

    # -- committing measured batches ----------------------------------------------------------------------

    def _join_finished(self, scheduler: Any) -> None:
        for task_id, task in enumerate(scheduler.tasks_):
            futures = task.runner_futures
            if not task.is_terminated and futures is not None and all(f.done() for f in futures):
                self._join(scheduler, task_id)

    def _join(self, scheduler: Any, task_id: int) -> None:
        """Commit a task's measured batch (records, cost model, callbacks) and note its best latency."""
        results = scheduler.join_running_task(task_id)
        batch_best = min((_latency_ms(r) for r in results), default=FAILED_MS)
        history = self.best_history.setdefault(task_id, [])
        default = self.default_ms.get(task_id, FAILED_MS)
        history.append(min(batch_best, history[-1] if history else default))
        self.searched[task_id] = self.searched.get(task_id, 0) + 1
        if self.within_roofline(task_id):
            self._stop_at_roofline(scheduler, task_id)
        elif self.searched[task_id] == 1 and default < FAILED_MS and batch_best >= default:
            scheduler.terminate_task(task_id)  # the default schedule serves it

    # -- stopping -----------------------------------------------------------------------------------------

    def _time_last_batch(self) -> None:
        if self.picked_at is not None:
            self.batch_s.append(time.monotonic() - self.picked_at)
            self.picked_at = None

    def _must_stop(self) -> bool:
        if self.should_stop is not None and self.should_stop():
            return True
        if self.time_left_s is None:
            return False
        left = self.time_left_s()
        if left is None:
            return False
        # A batch that would not end within the budget is not started (its estimate: the median batch).
        return left <= (statistics.median(self.batch_s) if self.batch_s else 0.0)


def _latency_ms(result: Any) -> float:
    if result.error_msg is not None:
        return FAILED_MS
    latency = record_latency_s(result.run_secs)
    return FAILED_MS if latency is None else latency * 1e3
