"""Jobs: what a client submits, and a job's state, progress, results and tasks."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, field_validator

from service.schemas.common import MAX_INPUTS, MAX_RANK, MAX_TARGET_KEYS, MAX_TIME_BUDGET_S, EntityOut
from tuner.entities import (
    DEFAULT_TRIALS,
    MAX_JOB_WORKERS,
    AccuracyReport,
    Job,
    JobStatus,
    LatencyReport,
    QuantizationReport,
    Task,
    TaskGroupStatus,
)
from tuner.entities.quantization import DEFAULT_MAX_RELATIVE_ERROR, DEFAULT_MAX_TOP1_CHANGED
from tuner.views.curves import time_shares


class LocalRunner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["local"] = "local"


class RPCRunner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["rpc"]
    tracker: str | None = Field(
        default=None,
        max_length=255,
        description="host:port of one of the server's configured RPC trackers; default: its first",
        examples=["127.0.0.1:9190"],
    )
    key: str = Field(min_length=1, max_length=128, description="Device key the RPC servers registered")


Runner = Annotated[LocalRunner | RPCRunner, Field(discriminator="kind")]


class AccuracyBudgetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_top1_changed: StrictFloat | StrictInt = Field(
        default=DEFAULT_MAX_TOP1_CHANGED,
        ge=0,
        le=1,
        description="Share of the validation samples whose top-1 class (over steps: any step's) may change on class scores",
    )
    max_relative_error: StrictFloat | StrictInt = Field(
        default=DEFAULT_MAX_RELATIVE_ERROR,
        gt=0,
        le=1e6,
        description="Norm-wise relative error ||q - f|| / ||f|| allowed on every other output",
    )


class JobIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_id: str = Field(max_length=64)
    target: str | dict[str, Any] = Field(
        default="host", description="'host' (the workers' CPU) or a TVM target as a JSON object"
    )
    trials: StrictInt | None = Field(
        default=None,
        ge=0,
        le=100_000,
        description=f"Measured trials over all tasks; default {DEFAULT_TRIALS}, or no limit when a "
        "time_budget_s is given",
    )
    time_budget_s: StrictFloat | StrictInt | None = Field(
        default=None,
        gt=0,
        le=MAX_TIME_BUDGET_S,
        description="Seconds of tuning (search, build, measurement), after which the job compiles and "
        "verifies what it found; alone or with trials (whichever ends first)",
    )
    max_trials_per_task: StrictInt | None = Field(default=None, ge=1, le=100_000)
    runner: Runner = Field(default_factory=LocalRunner)
    cost_model: Literal["xgb", "random"] = "xgb"
    space: str | None = Field(
        default=None,
        max_length=64,
        description="Schedule space: 'cpu' (MetaSchedule's rules) or 'cpu-poly' (shaped by the polyhedral "
        "analysis) for CPU targets, 'gpu' for CUDA; default: the target's default",
    )
    precision: Literal["as-is", "auto", "bf16", "fp16", "int8"] = Field(
        default="auto",
        description="Float models: 'bf16' or 'fp16' computes matmuls and convolutions on low-precision "
        "operands with fp32 accumulation (weights stored in the low precision, sensitive operators kept in "
        "fp32), verified by norm-wise relative error against the float32 model; 'auto' is bf16 on a CPU "
        "with bf16 instructions (AMX-BF16, AVX512-BF16) when the outputs stay within the bf16 tolerance, "
        "else as-is (the plan's fusion.precision_choice says which and why); 'int8' quantizes a float ONNX "
        "model (static, per-channel weights, activations calibrated on calibration_id's samples or on "
        "seeded synthetic ones) within accuracy_budget, returning the operators that hurt it most to "
        "float32; 'as-is' keeps the model's. The default, 'auto', is int8 when calibration_id is given "
        "(an ONNX model), else bf16 or as-is as above",
    )
    calibration_id: str | None = Field(
        default=None,
        max_length=64,
        description="precision int8: a calibration file uploaded to /api/v1/calibrations, split into "
        "calibration and held-back validation samples; default: seeded synthetic inputs",
    )
    calibration_method: Literal["minmax", "percentile", "entropy"] = Field(
        default="minmax", description="precision int8: how the activations' ranges are calibrated"
    )
    accuracy_budget: AccuracyBudgetIn | None = Field(
        default=None,
        description="precision int8: how far the quantized model may stray from the float model on the "
        "validation samples (default: top-1 changed on at most 1 % of the samples on class scores, "
        "a norm-wise relative error of at most 0.05 on any other)",
    )
    float_model_id: str | None = Field(
        default=None,
        max_length=64,
        description="A stored float model this quantized or reduced-precision one came from: the job's "
        "accuracy report adds the share of rows whose arg-max (top-1) agrees with it",
    )
    seed: StrictInt = Field(default=0, ge=0, le=2**31 - 1)
    workers: StrictInt = Field(
        default=1,
        ge=1,
        le=MAX_JOB_WORKERS,
        description="How many workers may tune the job's tasks at once: its tasks are split in that many "
        "groups, which idle workers claim (each measuring on its own device); its own worker then compiles",
    )
    input_shapes: (
        dict[
            Annotated[str, Field(max_length=256)],
            Annotated[list[Annotated[StrictInt, Field(ge=1, le=1 << 20)]], Field(max_length=MAX_RANK)],
        ]
        | None
    ) = Field(
        default=None,
        max_length=MAX_INPUTS,
        description="Shapes for inputs with dynamic dimensions, e.g. {'x': [1, 3, 224, 224]}",
    )

    @field_validator("target")
    @classmethod
    def _bounded_target(cls, target: str | dict[str, Any]) -> str | dict[str, Any]:
        # Checked for its meaning later (tuner.targets); here only that it is not absurdly large.
        if isinstance(target, str) and len(target) > 256:
            raise ValueError("a target name is at most 256 characters; give a target as a JSON object")
        if isinstance(target, dict) and (len(target) > MAX_TARGET_KEYS or len(json.dumps(target)) > 4096):
            raise ValueError(f"a target has at most {MAX_TARGET_KEYS} attributes and 4 KiB of JSON")
        return target


class ProgressOut(BaseModel):
    trials_done: int
    trials_total: int
    tasks_done: int
    tasks_total: int


class TimingOut(EntityOut):
    median_ms: float
    min_ms: float
    max_ms: float
    rounds_ms: list[float] = Field(description="Each round's median, in the order the rounds ran")


class LatencyReportOut(BaseModel):
    timings: dict[str, TimingOut] = Field(
        description="Per implementation ('untuned TVM', 'Kiln', 'onnxruntime', ...): its interleaved rounds, "
        "each in a fresh process"
    )
    warnings: list[str] = Field(
        description="Why the figures may be off: a busy machine, rounds that disagree"
    )
    other_cpu_share: float | None = Field(description="Share of all CPUs other processes used while timing")
    load_average: float | None = Field(description="1-minute load average when timing began")

    @classmethod
    def of(cls, report: LatencyReport) -> LatencyReportOut:
        return cls(
            timings={name: TimingOut.from_entity(t) for name, t in report.timings.items()},
            warnings=list(report.warnings),
            other_cpu_share=report.other_cpu_share,
            load_average=report.load_average,
        )


class OutputAccuracyOut(EntityOut):
    name: str
    step: float | None = Field(description="One quantization step (LSB) of the output; null: a float output")
    max_abs: float = Field(description="Largest absolute difference from the reference")
    max_steps: float | None = Field(description="That difference in steps (LSB)")
    beyond_one_step: float | None = Field(description="Share of the elements more than one step off")
    cosine: float = Field(description="Cosine similarity with the reference over all elements")
    relative_error: float | None = Field(
        default=None, description="Norm-wise relative error ||actual - reference|| / ||reference||"
    )
    top1_agreement: float | None = Field(
        default=None,
        description="Share of the rows (last axis) whose arg-max equals the float model's; null: no float "
        "model given, or no class axis",
    )


class QuantizationMetricOut(EntityOut):
    top1_changed: float | None = Field(
        description="Largest share, over class-score outputs, of validation samples whose top-1 changed"
    )
    relative_error: dict[str, float] = Field(description="Per output, the norm-wise relative error")


class AccuracyBudgetOut(EntityOut):
    max_top1_changed: float
    max_relative_error: float


class CoreSpeedOut(EntityOut):
    name: str = Field(description="The operator's node name")
    int8_ms: float = Field(description="Its kernel alone in int8 on the job's CPU (untuned schedules), ms")
    other: str = Field(description="The precision it would return to: bf16 or float32")
    other_ms: float = Field(description="Its kernel alone in that precision, ms")
    chosen: str = Field(description="int8 where it is faster by more than 5 %, else the other")


class QuantizationOut(EntityOut):
    method: str = Field(
        description="How the activations' ranges were calibrated: minmax, percentile, entropy"
    )
    samples: str = Field(description="The calibration and validation samples, and where they came from")
    synthetic: bool = Field(description="The samples are seeded synthetic inputs, not the user's")
    budget: AccuracyBudgetOut
    before: QuantizationMetricOut = Field(
        description="Every convolution and matmul in int8, their outputs rounded to 8 bits"
    )
    after: QuantizationMetricOut = Field(description="As compiled, after the accuracy control")
    within_budget: bool
    returned: list[str] = Field(
        description="Operators returned from int8 (to returned_precision) to hold the budget, worst first"
    )
    precision: dict[str, str] = Field(
        description="Each quantizable operator's precision: int8, bf16 or float32"
    )
    weight_bits: int = Field(
        default=8, description="The weights' bits: 8, or 7 on CPUs without VNNI (vpmaddubsw is exact on them)"
    )
    float_outputs: bool = Field(
        default=False,
        description="The convolutions' and matmuls' outputs stay float (taken when rounding them to 8 bits "
        "broke the budget)",
    )
    returned_precision: str = Field(
        default="float32",
        description="What the returned operators compute in: bf16 on a CPU that multiplies it natively "
        "(AMX-BF16, AVX512-BF16) when that holds the budget, else float32",
    )
    speeds: list[CoreSpeedOut] = Field(
        default_factory=list,
        description="precision auto: each int8 operator timed alone in int8 and in returned_precision",
    )
    returned_for_speed: list[str] = Field(
        default_factory=list,
        description="Operators returned from int8 because they were no faster in it (the budget held)",
    )
    speed_note: str = Field(default="", description="Why operators were not timed, or what timing left")

    @classmethod
    def of(cls, report: QuantizationReport) -> QuantizationOut:
        return cls.from_entity(
            report,
            budget=AccuracyBudgetOut.from_entity(report.budget),
            before=QuantizationMetricOut.from_entity(report.before),
            after=QuantizationMetricOut.from_entity(report.after),
            returned=list(report.returned),
            speeds=[CoreSpeedOut.from_entity(speed) for speed in report.speeds],
            returned_for_speed=list(report.returned_for_speed),
        )


class AccuracyOut(EntityOut):
    reference: str = Field(
        description="What the outputs were compared with (onnxruntime on the same model; for a reduced "
        "precision, the float32 model on onnxruntime or untuned TVM)"
    )
    inputs: int = Field(description="Seeded inputs compared")
    outputs: list[OutputAccuracyOut]
    tolerance: float | None = Field(
        default=None,
        description="Reduced precision: the norm-wise relative error allowed; null: quantized (one step)",
    )
    float_model: str | None = Field(default=None, description="The float model top-1 was counted against")
    quantization: QuantizationOut | None = Field(
        default=None,
        description="precision int8: how Kiln quantized the float model, and the accuracy control",
    )
    allowed_steps: float = Field(
        default=1.0,
        description="Quantized outputs: the steps allowed from the reference, one per quantized layer",
    )

    @classmethod
    def of(cls, report: AccuracyReport) -> AccuracyOut:
        quantization = QuantizationOut.of(report.quantization) if report.quantization is not None else None
        return cls.from_entity(
            report,
            outputs=[OutputAccuracyOut.from_entity(o) for o in report.outputs],
            quantization=quantization,
        )


class TaskGroupOut(EntityOut):
    index: int
    task_indices: list[int] = Field(description="The job's tasks in this group (positions in its task list)")
    trials: int | None = Field(
        description="The group's share of the job's trials; null: the time budget only"
    )
    status: TaskGroupStatus
    worker: str | None = Field(description="The worker that holds (or last held) the group")
    attempts: int
    heartbeat_at: datetime | None
    finished_at: datetime | None
    error: str | None = Field(description="Why the group was requeued or failed")


class JobOut(EntityOut):
    id: str
    model_id: str
    model_name: str
    status: JobStatus
    stage: str | None = Field(description="What a running job is doing: importing, tuning, compiling...")
    target: dict[str, Any]
    target_key: str = Field(description="The canonical target its records are keyed by")
    trials: int | None = Field(description="Trial budget; null: no trial limit (time budget only)")
    time_budget_s: float | None = Field(description="Tuning time budget in seconds; null: none")
    tuning_s: float = Field(description="Seconds spent tuning so far, over all attempts")
    tuning_remaining_s: float | None = Field(description="Seconds left of the time budget; null: none")
    max_trials_per_task: int | None
    runner: dict[str, Any]
    cost_model: str
    space: str | None = Field(description="The schedule space that tunes the job")
    precision: str = Field(description="The precision policy for float matmuls and convolutions")
    float_model_id: str | None = Field(description="The float model the accuracy report compares top-1 with")
    calibration_id: str | None = Field(default=None, description="precision int8: the calibration file")
    calibration_method: str = Field(default="minmax", description="precision int8: how ranges are calibrated")
    accuracy_budget: AccuracyBudgetOut | None = Field(default=None, description="precision int8: the budget")
    seed: int
    workers: int = Field(description="How many workers may tune the job's tasks at once")
    task_groups: list[TaskGroupOut] = Field(
        default_factory=list, description="A split job's groups of tasks, and which worker tunes each"
    )
    progress: ProgressOut
    baseline_latency_ms: float | None = Field(description="Untuned TVM build, end to end")
    tuned_latency_ms: float | None
    reference_latency_ms: dict[str, float] = Field(
        description="Peers measured beside it, end to end, e.g. {'onnxruntime': 0.1}"
    )
    latency_report: LatencyReportOut | None = Field(
        description="How the latencies were measured: every round of every implementation, and warnings"
    )
    accuracy: AccuracyOut | None = Field(
        default=None,
        description="Quantized models: the tuned outputs against onnxruntime over seeded inputs, in steps; "
        "reduced precision (bf16, fp16): against the float32 model, norm-wise",
    )
    speedup: float | None = Field(description="Untuned TVM's latency over the tuned model's")
    peer: str | None = Field(description="The runtime measured beside Kiln (onnxruntime for ONNX models)")
    peer_speedup: float | None = Field(
        description="The peer's latency over the tuned model's: > 1 when Kiln's artifact is faster"
    )
    error: str | None = Field(description="Why a job failed or was cancelled, in one sentence")
    trials_note: str | None = Field(
        default=None, description="Why a finished job measured fewer trials than it asked for"
    )
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    worker: str | None
    attempts: int

    @classmethod
    def of(cls, job: Job, progress: dict[str, int], model_name: str) -> JobOut:
        spec = job.spec
        now = datetime.now(timezone.utc)
        return cls.from_entity(
            job,
            model_id=spec.model_id,
            model_name=model_name,
            target=spec.target,
            trials=spec.trials,
            time_budget_s=spec.time_budget_s,
            tuning_s=job.tuning_elapsed_s(now),
            tuning_remaining_s=job.tuning_remaining_s(now),
            max_trials_per_task=spec.max_trials_per_task,
            runner=spec.runner.to_dict(),
            cost_model=spec.cost_model,
            space=spec.space,
            precision=spec.precision,
            float_model_id=spec.float_model_id,
            calibration_id=spec.calibration_id,
            calibration_method=spec.calibration_method,
            accuracy_budget=AccuracyBudgetOut.from_entity(spec.accuracy_budget),
            seed=spec.seed,
            workers=spec.workers,
            progress=ProgressOut(**progress),
            reference_latency_ms=dict(job.reference_latency_ms),
            latency_report=LatencyReportOut.of(job.latency_report) if job.latency_report else None,
            accuracy=AccuracyOut.of(job.accuracy) if job.accuracy else None,
        )


class JobPage(BaseModel):
    items: list[JobOut]
    total: int
    limit: int
    offset: int


class TaskOut(EntityOut):
    id: int
    name: str
    weight: int
    flops: float
    workload_hash: str
    trials: int
    best_latency_us: float | None
    gflops: float | None
    share: float | None = Field(description="Fraction of the model's estimated time spent in this task")
    search_stats: dict[str, int | str | dict[str, int]] | None = Field(
        default=None,
        description="What the search did: the space's hooks (cpu-poly: candidates examined, rejected, passed "
        "through despite the model, seeds measured, and the caches they held tiles against), and for a job "
        "measuring through an RPC tracker `measured_on`, the candidates each server (host:port) measured; "
        "null when there is nothing to say",
    )
    schedule_source: Literal["tuned", "similar", "rule", "analytic", "model", "sampled", "none"] | None = (
        Field(
            default=None,
            description="Where the schedule compiled into the model came from: tuned (the best measured record), "
            "similar (the best record of the same operator at the nearest other shape measured on this target, "
            "its tiles adapted, unmeasured at this shape), rule (a default rule), analytic (the register-tiled schedule of a float32 matmul or convolution sized from "
            "the CPU's vector registers, unmeasured), model (the polyhedral model's best-ranked tiling, unmeasured), sampled (a "
            "design-space sample, unmeasured) or none (serial loops); null until the job compiled",
        )
    )

    @classmethod
    def list_of(cls, tasks: list[Task]) -> list[TaskOut]:
        return [cls.from_entity(t, share=share) for t, share in zip(tasks, time_shares(tasks), strict=True)]
