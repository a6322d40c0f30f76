"""Measurement that does not share the CPU with the search.

MetaSchedule's task scheduler sends a batch to the runner and, while it is being measured, goes on
searching the next task with every core. On a machine with few cores the measured kernels then
compete with the search threads, and their latencies are inflated by a varying amount, which misleads
the cost model and the choice of the best schedule. :class:`ExclusiveRunner` waits for each batch's
measurements before handing back control, so candidates are timed on an otherwise idle CPU.
"""

from __future__ import annotations

from typing import Any

from kiln_tvm import derived_object, ms


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
