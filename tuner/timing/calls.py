"""How Kiln times one callable: a ``perf_counter`` loop around the call after warm-up, the median of up to
``MAX_CALLS`` calls within ``BUDGET_S`` seconds (at least ``MIN_CALLS``). The processes of
:mod:`tuner.timing.side_by_side` and :mod:`tuner.timing.profile_runs` time models and kernels with it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

MAX_CALLS = 200
MIN_CALLS = 5
BUDGET_S = 3.0
#: MIN_CALLS give way to calls that would end past this many budgets (an untuned large model's call takes
#: seconds: five of them per round made a job wait minutes for its baseline).
SLOW_CALLS_FACTOR = 5


def median_call_ms(call: Callable[[], Any], budget_s: float = BUDGET_S) -> tuple[float, int]:
    """Median wall time of ``call`` in ms, and how many timed calls it took: calls until the budget is
    spent, at most ``MAX_CALLS``; at least ``MIN_CALLS`` while the next one (as long as the last) ends
    within ``SLOW_CALLS_FACTOR`` budgets; one at the least."""
    start = time.perf_counter()
    call()
    first = time.perf_counter() - start
    # A call of seconds (an untuned large model) is timed from its first run: what that run adds (loading,
    # first touches of the weights) is small beside it, and a second warm-up run would double the wait.
    times: list[float] = [first] if first > budget_s else []
    for _ in range(0 if first > 0.05 else 10):
        call()
    began = start if times else time.perf_counter()  # the budget counts the first run when it is timed
    deadline, slow_deadline = began + budget_s, began + SLOW_CALLS_FACTOR * budget_s
    while (
        not times
        or (len(times) < MIN_CALLS and time.perf_counter() + times[-1] <= slow_deadline)
        or (len(times) < MAX_CALLS and time.perf_counter() < deadline)
    ):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3, len(times)
