"""Measurement that does not share the CPU with the search.

MetaSchedule's task scheduler sends a batch to the runner and, while it is being measured, goes on
searching the next task with every core. On a machine with few cores the measured kernels then
compete with the search threads, and their latencies are inflated by a varying amount, which misleads
the cost model and the choice of the best schedule. :class:`ExclusiveRunner` waits for each batch's
measurements before handing back control, so candidates are timed on an otherwise idle CPU.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kiln_tvm import derived_object, ms, tvm


@derived_object
class DoneFuture(ms.runner.PyRunnerFuture):
    """A runner future whose result is already known."""

    def __init__(self, result: Any) -> None:
        super().__init__()
        self._result = result

    def done(self) -> bool:
        return True

    def result(self) -> Any:
        return self._result


@derived_object
class ExclusiveRunner(ms.runner.PyRunner):
    """Wraps a runner (local or RPC) and measures each batch to completion before returning."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner

    def run(self, runner_inputs: list[Any]) -> list[Any]:
        futures = self.inner.run(runner_inputs)
        return [DoneFuture(future.result()) for future in futures]


def measure_filler(random_fill: Any) -> Any:
    """A function filling one measurement argument: floats with ``random_fill`` (MetaSchedule's filler,
    local or on an RPC session), integers with zeros.

    MetaSchedule fills every argument with random bits; an integer argument is then an out-of-range
    index (an embedding's token ids, a gather's indices), and the candidate reads far outside its table
    and crashes, so the task is never measured. Zero is a valid index of any gather; no kernel's speed
    depends on which row it reads.
    """

    def fill(arr: Any) -> None:
        if str(arr.dtype).startswith(("int", "uint", "bool")) or random_fill is None:
            arr.copyfrom(np.zeros([int(d) for d in arr.shape], dtype=str(arr.dtype)))
        else:
            random_fill(arr)

    return fill


def alloc_measure_arguments(device: Any, args_info: list[Any], alloc_repeat: int) -> list[list[Any]]:
    """A candidate's arguments for measurement on this machine (see :func:`measure_filler`). Runs in the
    runner's worker process."""
    random_fill = tvm.get_global_func("tvm.contrib.random.random_fill_for_measure", allow_missing=True)
    return ms.runner.utils.alloc_argument_common(measure_filler(random_fill), device, args_info, alloc_repeat)


# How long the calibration of a candidate's runs per repeat lasts (at least), in ms.
CALIBRATION_MS = 2


def run_calibrated_evaluator(
    rt_mod: Any, device: Any, evaluator_config: Any, repeated_args: list[list[Any]]
) -> list[float]:
    """Time a candidate: ``repeat`` repeats of ``min_repeat_ms`` each, the runs per repeat calibrated first.

    TVM's time evaluator finds the number of runs by trial: it times ``number`` runs, and while they
    last less than ``min_repeat_ms`` it scales ``number`` up and times them all again, by at least
    1.618x. The first estimate (from 3 runs) is usually a little short, so the second try falls just
    under the minimum and a third runs 1.6x as long: a candidate measured for 50 ms costs 125 ms. Here a
    short calibration (``CALIBRATION_MS``) gives the time of one run, then every repeat runs the number of
    runs that fills ``min_repeat_ms`` (plus 10 %) in one go. Runs in the runner's worker process.
    """
    costs: list[float] = []
    target_s = evaluator_config.min_repeat_ms / 1e3
    for args in repeated_args:
        device.sync()
        calibration = rt_mod.time_evaluator(
            rt_mod.entry_name, device, number=1, repeat=1, min_repeat_ms=CALIBRATION_MS
        )
        per_run_s = float(calibration(*args).mean)
        number = evaluator_config.number
        if per_run_s > 0:
            number = max(number, math.ceil(1.1 * target_s / per_run_s))
        evaluator = rt_mod.time_evaluator(
            rt_mod.entry_name, device, number=number, repeat=evaluator_config.repeat, min_repeat_ms=0
        )
        costs.extend(float(c) for c in evaluator(*args).results)
    return costs
