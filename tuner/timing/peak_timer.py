"""Timing a peak kernel: the iterations calibrated to a repeat's length, the best rate of a few repeats
(a limit is what the machine can do; a repeat disturbed by another process only ever lowers it). Shared by
the FMA peak (:mod:`tuner.timing.roofline`) and the dot products' (:mod:`tuner.timing.dot_peaks`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: Timed repeats of a peak kernel (the best is kept).
REPEATS = 5
# One repeat of a kernel runs about this long (its iteration count is calibrated to it).
_REPEAT_S = 0.05


def rate_timer(func: Any, args: list[Any], work_per_iteration: float, repeats: int) -> Callable[[], float]:
    """A timer of a peak kernel ``func(*args, iterations)``: each call calibrates the iterations to
    :data:`_REPEAT_S` a repeat and returns the best rate of ``repeats`` repeats, in G work per second."""

    def rate() -> float:
        iterations = 10_000
        seconds = best_seconds(func, [*args, iterations], 1)
        iterations = max(iterations, int(iterations * _REPEAT_S / max(seconds, 1e-6)))
        seconds = best_seconds(func, [*args, iterations], repeats)
        return work_per_iteration * iterations / seconds / 1e9

    return rate


def best_seconds(func: Any, args: list[Any], repeats: int) -> float:
    """The fastest of ``repeats`` timed calls (after one untimed)."""
    func(*args)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        func(*args)
        best = min(best, time.perf_counter() - start)
    return best
