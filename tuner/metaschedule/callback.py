"""Kiln's measure callback: reports each measured batch of a task."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kiln_tvm import derived_object, ms
from tuner.entities import record_latency_s


@dataclass
class TrialBatch:
    """What one measured batch of a task did; passed to progress listeners."""

    task_index: int
    latencies_us: list[float | None]  # None: the candidate failed to build or run
    errors: list[str | None]
    measured_on: dict[str, int] = field(default_factory=dict)  # RPC server (host:port) -> candidates


BatchListener = Callable[[TrialBatch], None]


def _last_line(message: Any) -> str:
    return str(message).strip().splitlines()[-1][:500]


def build_failure(built: Any) -> str | None:
    """Why a builder result failed (its message's last line), or None when it built."""
    return "build failed: " + _last_line(built.error_msg) if built.error_msg else None


def latency_us(result: Any) -> tuple[float | None, str | None]:
    """A runner result's mean latency (µs), or None and why not."""
    if result.error_msg:
        return None, _last_line(result.error_msg)
    latency = record_latency_s(result.run_secs)
    if latency is None:
        return None, "no valid measurement"
    return latency * 1e6, None


@derived_object
class ProgressCallback(ms.measure_callback.PyMeasureCallback):
    """Reports each measured batch (stopping is the task scheduler's: :mod:`tuner.metaschedule.scheduler`)."""

    def __init__(self, on_batch: BatchListener | None) -> None:
        super().__init__()
        self.on_batch = on_batch

    def apply(
        self,
        task_scheduler: Any,
        task_id: int,
        measure_candidates: list[Any],
        builder_results: list[Any],
        runner_results: list[Any],
    ) -> None:
        latencies: list[float | None] = []
        errors: list[str | None] = []
        for built, ran in zip(builder_results, runner_results, strict=False):
            failure = build_failure(built)
            if failure is not None:
                latencies.append(None)
                errors.append(failure)
                continue
            lat, err = latency_us(ran)
            latencies.append(lat)
            errors.append(err)
        if self.on_batch is not None:
            self.on_batch(TrialBatch(task_index=int(task_id), latencies_us=latencies, errors=errors))
