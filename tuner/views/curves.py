"""A job's tuning over time, read from its records: each task's trials with the best so far, the model's
estimated latency after every trial, and each task's share of the model's time. Plain store reads, no
TVM: the CLI's ``kiln status`` draws them without loading the compiler."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from tuner.entities import Job, Task
from tuner.store.sql import Store


@dataclass(frozen=True)
class TaskCurvePoint:
    """One trial of a task: its latency (None when the candidate failed) and the task's best so far."""

    index: int  # 1-based trial number within the task
    record_id: int
    latency_us: float | None
    best_us: float | None
    at: datetime
    elapsed_s: float  # since the job was submitted


@dataclass(frozen=True)
class JobCurvePoint:
    """One trial of a job, with the estimated end-to-end latency after it."""

    index: int  # 1-based trial number within the job
    task_id: int
    record_id: int
    latency_us: float | None
    task_best_us: float | None
    estimate_us: float | None  # sum over tasks of weight x best so far; None until every task has one
    at: datetime
    elapsed_s: float


@dataclass(frozen=True)
class JobCurve:
    """Every trial of a job in order, and the bests it started from."""

    points: list[JobCurvePoint]
    warm_start_us: dict[int, float]  # task id -> best latency stored before the job measured anything


def task_curve(store: Store, job: Job, task: Task) -> list[TaskCurvePoint]:
    """Every trial the job measured for ``task``, with the best so far."""
    points, best = [], None
    for index, entry in enumerate(store.job_timeline(job.id, task.workload_id), start=1):
        if entry.latency_us is not None and (best is None or entry.latency_us < best):
            best = entry.latency_us
        points.append(
            TaskCurvePoint(index, entry.record_id, entry.latency_us, best, entry.at, _elapsed(job, entry.at))
        )
    return points


def job_curve(store: Store, job: Job, scope: str | None) -> JobCurve:
    """Every trial of the job with the estimated end-to-end latency after it; warm starts come from the
    records of ``scope`` (see :meth:`Settings.record_scope`) stored before the job's first trial."""
    tasks = store.list_tasks(job.id)
    task_of = {t.workload_id: t for t in tasks}
    timeline = store.job_timeline(job.id)
    warm: dict[int, float] = {}
    if timeline:
        for t in tasks:
            best = store.best_latency_before(t.workload_id, job.target_key, timeline[0].record_id, scope)
            if best is not None:
                warm[t.id] = best
    bests: dict[int, float] = dict(warm)
    points = []
    for index, entry in enumerate(timeline, start=1):
        task = task_of.get(entry.workload_id)
        if task is None:
            continue
        latency_us = entry.latency_us
        if latency_us is not None and (task.id not in bests or latency_us < bests[task.id]):
            bests[task.id] = latency_us
        complete = all(t.id in bests for t in tasks)
        estimate = sum(t.weight * bests[t.id] for t in tasks) if complete else None
        points.append(
            JobCurvePoint(
                index,
                task.id,
                entry.record_id,
                latency_us,
                bests.get(task.id),
                estimate,
                entry.at,
                _elapsed(job, entry.at),
            )
        )
    return JobCurve(points=points, warm_start_us=warm)


def time_shares(tasks: list[Task]) -> list[float | None]:
    """Per task, the fraction of the model's estimated time spent in it (None until every task has a best)."""
    times = [t.weight * t.best_latency_us if t.best_latency_us else None for t in tasks]
    total = sum(x for x in times if x) if all(times) and times else None
    return [(x / total) if total and x else None for x in times]


def _elapsed(job: Job, at: datetime) -> float:
    return max(0.0, (at - job.created_at).total_seconds())


#: Minutes of measuring ``kiln status`` reads the estimate at (those a job's curve reaches).
CHECKPOINTS_S = (0.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


def estimates_at(
    curve: JobCurve, checkpoints: tuple[float, ...] = CHECKPOINTS_S
) -> list[tuple[float, float | None]]:
    """The estimated end-to-end latency (µs) after each checkpoint's seconds of measuring, counted from the
    job's first trial, for the checkpoints the job reached, then after its last trial: ``(seconds,
    estimate)``, None while some task had no measured schedule yet."""
    if not curve.points:
        return []
    first = curve.points[0].at
    span = (curve.points[-1].at - first).total_seconds()
    rows: list[tuple[float, float | None]] = []
    for mark in [c for c in checkpoints if c < span] + [span]:
        before = [p for p in curve.points if (p.at - first).total_seconds() <= mark]
        rows.append((mark, before[-1].estimate_us if before else None))
    return rows


__all__ = [
    "CHECKPOINTS_S",
    "JobCurve",
    "JobCurvePoint",
    "TaskCurvePoint",
    "estimates_at",
    "job_curve",
    "task_curve",
    "time_shares",
]
