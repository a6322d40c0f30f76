"""Tuning records and what the store keeps beside them (workloads, cost models, timelines)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

#: Run times from this many seconds up are MetaSchedule's marks of a failed candidate (it stores 1e10).
FAILED_RUN_TIME_S = 1e9


def record_latency_s(run_secs: Iterable[float] | None) -> float | None:
    """A measured candidate's latency (s): the mean of its run times, as MetaSchedule ranks records and the
    store orders them; None for a candidate that failed or was never measured. The one statistic every
    reader of a record's, a batch's or a task's best latency uses."""
    secs = [float(s) for s in run_secs or []]
    if not secs or not all(math.isfinite(s) and 0 <= s < FAILED_RUN_TIME_S for s in secs):
        return None
    return sum(secs) / len(secs)


@dataclass(frozen=True)
class Record:
    """One measured candidate schedule."""

    id: int
    workload_id: int
    job_id: str | None
    target_key: str
    run_secs: tuple[float, ...]
    mean_latency_us: float | None  # None when the candidate failed to build or run
    trace: Any  # MetaSchedule trace JSON
    created_at: datetime
    error: str | None = None


class StoredWorkload(NamedTuple):
    """A stored workload (a task's TIR) as MetaSchedule JSON."""

    id: int
    workload_json: str


class StoredRecord(NamedTuple):
    """A tuning record with its workload, both as MetaSchedule JSON (what a JSON database holds)."""

    workload_id: int
    workload_json: str
    record_json: str


@dataclass(frozen=True)
class StoredCostModel:
    """A cost model kept in the store: trained on ``samples`` measured schedules of ``target_key`` (of the
    ``scope`` owner's jobs; "" the shared pool), the newest of them record ``last_record_id``."""

    target_key: str
    scope: str
    samples: int
    last_record_id: int
    model_tar: bytes
    trained_at: datetime | None = None


class NewRecord(NamedTuple):
    """A valid tuning record stored after some other, with its workload (MetaSchedule JSON)."""

    id: int
    job_id: str | None
    workload_id: int
    workload_json: str
    record_json: str


class BestRecord(NamedTuple):
    """A workload's fastest valid record."""

    workload_json: str
    record_json: str
    mean_run_sec: float


class TimelineEntry(NamedTuple):
    """One record of a job, in commit order: its latency (None when the candidate failed)."""

    record_id: int
    workload_id: int
    latency_us: float | None
    at: datetime
