"""ORM rows -> entities: the store hands out these, never rows."""

from __future__ import annotations

import json

from tuner.entities import (
    AccuracyReport,
    Artifact,
    Job,
    JobSpec,
    JobStatus,
    LatencyReport,
    ModelFormat,
    ModelInfo,
    ModelSignature,
    Record,
    Task,
    record_latency_s,
)
from tuner.store.orm import (
    FAILED_RUN_SEC,
    VALID_RUN_SEC_LIMIT,
    ArtifactRow,
    JobRow,
    ModelRow,
    TaskRow,
    TuningRecordRow,
)


def mean_run_sec(run_secs: list[float]) -> float:
    """Mean run time of a candidate (:func:`~tuner.entities.record_latency_s`); failed or unmeasured
    candidates get MetaSchedule's 1e10."""
    latency = record_latency_s(run_secs)
    return FAILED_RUN_SEC if latency is None else latency


def is_valid(mean_run_sec: float) -> bool:
    """Whether a mean run time is a measured one (not a failed candidate's)."""
    return mean_run_sec < VALID_RUN_SEC_LIMIT


def model_entity(row: ModelRow) -> ModelInfo:
    """The ModelInfo of a row."""
    return ModelInfo(
        id=row.id,
        name=row.name,
        format=ModelFormat(row.format),
        sha256=row.sha256,
        size_bytes=row.size_bytes,
        signature=ModelSignature.from_dict(json.loads(row.signature_json)),
        created_at=row.created_at,
        owner=row.owner,
    )


def job_entity(row: JobRow) -> Job:
    """The Job of a row."""
    return Job(
        id=row.id,
        spec=JobSpec.from_dict(json.loads(row.spec_json)),
        target_key=row.target_key,
        status=JobStatus(row.status),
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        error=row.error,
        baseline_latency_ms=row.baseline_latency_ms,
        tuned_latency_ms=row.tuned_latency_ms,
        worker=row.worker,
        attempts=row.attempts,
        owner=row.owner,
        heartbeat_at=row.heartbeat_at,
        cancel_requested=bool(row.cancel_requested),
        stage=row.stage,
        trials_done=row.trials_done,
        trials_total=row.trials_total,
        reference_latency_ms=json.loads(row.reference_latency_json) if row.reference_latency_json else {},
        latency_report=(
            LatencyReport.from_dict(json.loads(row.latency_report_json)) if row.latency_report_json else None
        ),
        accuracy=AccuracyReport.from_dict(json.loads(row.accuracy_json)) if row.accuracy_json else None,
        tuning_s=float(row.tuning_s or 0.0),
        tuning_since=row.tuning_since,
    )


def task_entity(row: TaskRow, shash: str) -> Task:
    """The Task of a row."""
    return Task(
        id=row.id,
        job_id=row.job_id,
        workload_id=row.workload_id,
        name=row.name,
        weight=row.weight,
        flops=row.flops,
        workload_hash=shash,
        trials=row.trials,
        best_latency_us=row.best_latency_us,
        search_stats=json.loads(row.search_stats_json) if row.search_stats_json else None,
        schedule_source=row.schedule_source,
    )


def record_entity(row: TuningRecordRow) -> Record:
    """The Record of a row."""
    return Record(
        id=row.id,
        workload_id=row.workload_id,
        job_id=row.job_id,
        target_key=row.target_key,
        run_secs=tuple(float(x) for x in json.loads(row.run_secs_json)),
        mean_latency_us=row.mean_run_sec * 1e6 if is_valid(row.mean_run_sec) else None,
        trace=json.loads(row.trace_json),
        created_at=row.created_at,
        error=row.error,
    )


def artifact_entity(row: ArtifactRow) -> Artifact:
    """The Artifact of a row."""
    return Artifact(
        id=row.id,
        job_id=row.job_id,
        path=row.path,
        sha256=row.sha256,
        size_bytes=row.size_bytes,
        created_at=row.created_at,
    )
