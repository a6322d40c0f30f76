"""Kiln's domain objects, plain frozen dataclasses and enums shared by every layer; one module per
concern, all of them importable from here."""

from __future__ import annotations

from tuner.entities.access import ApiToken
from tuner.entities.budget import Budget
from tuner.entities.job import (
    DEFAULT_TRIALS,
    MAX_JOB_WORKERS,
    Artifact,
    Job,
    JobSpec,
    JobStatus,
    RunnerSpec,
    ServerUse,
    Task,
    TaskGroup,
    TaskGroupStatus,
    trial_budget,
    trials_shortfall,
)
from tuner.entities.model import BoundInput, Dim, ModelFormat, ModelInfo, ModelSignature, TensorSpec
from tuner.entities.outcome import AccuracyReport, LatencyReport, OutputAccuracy, Timing
from tuner.entities.plan import (
    FusionSummary,
    IrLevel,
    KeptFloat,
    ModelPlan,
    PlanError,
    PlanningOptions,
    TaskInfo,
)
from tuner.entities.profile import KernelAssembly, KernelProfile, MachineLimits, ModelProfile, OnnxruntimeNode
from tuner.entities.quantization import AccuracyBudget, CoreSpeed, QuantizationMetric, QuantizationReport
from tuner.entities.record import (
    FAILED_RUN_TIME_S,
    BestRecord,
    NewRecord,
    Record,
    StoredCostModel,
    StoredRecord,
    StoredWorkload,
    TimelineEntry,
    record_latency_s,
)

__all__ = [
    "CoreSpeed",
    "QuantizationMetric",
    "QuantizationReport",
    "FAILED_RUN_TIME_S",
    "record_latency_s",
    "AccuracyBudget",
    "AccuracyReport",
    "ApiToken",
    "Artifact",
    "Budget",
    "BestRecord",
    "BoundInput",
    "DEFAULT_TRIALS",
    "MAX_JOB_WORKERS",
    "Dim",
    "FusionSummary",
    "IrLevel",
    "Job",
    "JobSpec",
    "JobStatus",
    "KeptFloat",
    "KernelAssembly",
    "KernelProfile",
    "LatencyReport",
    "MachineLimits",
    "ModelFormat",
    "ModelInfo",
    "ModelPlan",
    "ModelProfile",
    "ModelSignature",
    "NewRecord",
    "OnnxruntimeNode",
    "OutputAccuracy",
    "PlanError",
    "PlanningOptions",
    "Record",
    "RunnerSpec",
    "ServerUse",
    "StoredCostModel",
    "StoredRecord",
    "StoredWorkload",
    "Task",
    "TaskGroup",
    "TaskGroupStatus",
    "TaskInfo",
    "TensorSpec",
    "TimelineEntry",
    "Timing",
    "trial_budget",
    "trials_shortfall",
]
