"""The API's request and response bodies (pydantic). Routes convert entities into these, never ORM rows.

A response built from an entity (:class:`EntityOut`) takes every field the entity has under the same
name; only what differs (a nested entity, an enum shown by its value, a field of the job's spec) is
given by hand.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, field_validator

from tuner.curves import time_shares
from tuner.entities import (
    DEFAULT_TRIALS,
    AccuracyReport,
    FusionSummary,
    Job,
    JobStatus,
    KernelProfile,
    LatencyReport,
    MachineLimits,
    ModelInfo,
    ModelProfile,
    Task,
    TaskInfo,
    TensorSpec,
)
from tuner.profile_check import ProfileCheck

MAX_TIME_BUDGET_S = 7 * 24 * 3600  # a week: a longer budget is a typo
# Sizes no real request comes near, so that nothing a client sends is built or echoed at any size.
MAX_INPUTS = 256
MAX_RANK = 16
MAX_TARGET_KEYS = 32


class ErrorDetail(BaseModel):
    kind: str = Field(description="Machine-readable error class, e.g. 'invalid_model'")
    message: str = Field(description="What went wrong, and usually what to do about it")


class ErrorOut(BaseModel):
    error: ErrorDetail


_Out = TypeVar("_Out", bound="EntityOut")


class EntityOut(BaseModel):
    """A response body built from an entity of :mod:`tuner.entities`."""

    @classmethod
    def from_entity(cls: type[_Out], entity: object, **given: Any) -> _Out:
        """The fields ``entity`` has (attributes and properties of the same name), then ``given``."""
        data = {name: getattr(entity, name) for name in cls.model_fields if hasattr(entity, name)}
        return cls.model_validate({**data, **given})


class TensorOut(EntityOut):
    name: str
    shape: list[int | str] = Field(description="Sizes; a string names a dynamic dimension")
    dtype: str

    @classmethod
    def of(cls, spec: TensorSpec) -> TensorOut:
        return cls.from_entity(spec)


class BoundInputOut(EntityOut):
    name: str
    dtype: str
    shape: list[int]
    values: Any = Field(description="The value it was bound to: a number, or nested lists")


class ModelOut(EntityOut):
    id: str
    name: str
    format: str
    sha256: str
    size_bytes: int
    inputs: list[TensorOut]
    outputs: list[TensorOut]
    bound_inputs: list[BoundInputOut] = Field(
        default_factory=list,
        description="Inputs of the uploaded model bound to values at upload (input_values): constants of "
        "the stored model, no longer its inputs",
    )
    created_at: datetime

    @classmethod
    def of(cls, model: ModelInfo) -> ModelOut:
        return cls.from_entity(
            model,
            format=model.format.value,
            inputs=[TensorOut.of(t) for t in model.signature.inputs],
            outputs=[TensorOut.of(t) for t in model.signature.outputs],
            bound_inputs=[BoundInputOut.from_entity(b) for b in model.signature.bound_inputs],
        )


class KeptFloatOut(EntityOut):
    op: str = Field(description="The operator: conv2d or matmul")
    shapes: str = Field(description="Its operands' shapes")
    reason: str = Field(description="Why Kiln computes it in float")


class FusionOut(EntityOut):
    operators_before: int = Field(description="Relax operators before fusion")
    kernels_after: int = Field(description="Fused kernels (PrimFunc calls) after fusion")
    distinct_tasks: int = Field(description="Distinct kernels, i.e. tuning tasks")
    operator_histogram: dict[str, int]
    integer_ops: list[str] = Field(
        default_factory=list,
        description="Quantized convolutions and matmuls computed in integers (u8 x s8 -> int32), with their "
        "shapes and output type",
    )
    kept_float: list[KeptFloatOut] = Field(
        default_factory=list, description="Quantized operators left in float, and why"
    )
    integer_kernels: str = Field(
        default="",
        description="How the integer kernels compute: 'amx' (as 'vnni', and the packed matmuls that are whole "
        "16x32x64 blocks on AMX tiles), 'vnni' (weights packed for the vpdpbusd dot product "
        "where they fit), 'avx-vnni' (the same, 8 channels wide for the 256-bit vpdpbusd of AVX-VNNI CPUs "
        "without AVX-512), 'plain' (tiled integer loops: the CPU has no VNNI), '' without any",
    )
    vnni_packed: list[str] = Field(default_factory=list, description="Integer operators on VNNI kernels")
    amx_matmuls: list[str] = Field(
        default_factory=list, description="Of the packed operators, the matmuls tuned on AMX tiles (tdpbusd)"
    )
    vnni_unpacked: list[str] = Field(
        default_factory=list, description="Integer operators on a VNNI CPU left on plain kernels, and why"
    )
    precision: str = Field(default="as-is", description="The job's precision policy: as-is, bf16 or fp16")
    reduced_ops: list[str] = Field(
        default_factory=list,
        description="Float matmuls and convolutions put on bf16/fp16 operands (fp32 accumulation)",
    )
    precision_compute: str = Field(
        default="",
        description="How the target computes them: 'native' (low-precision instructions: AMX-BF16 tiles), "
        "'mixed' (some natively, the others widened), 'emulated' (widened to fp32), '' when the policy "
        "changed nothing",
    )
    amx_bf16_matmuls: list[str] = Field(
        default_factory=list, description="Of the reduced operators, the bf16 matmuls on AMX-BF16 tiles"
    )
    avx512_bf16_matmuls: list[str] = Field(
        default_factory=list,
        description="Of the reduced operators, the bf16 matmuls on AVX512-BF16's vdpbf16ps (packed weights)",
    )
    avx512_bf16_convolutions: list[str] = Field(
        default_factory=list,
        description="Of the reduced operators, the bf16 NHWC convolutions on AVX512-BF16's vdpbf16ps",
    )
    bf16_unpacked: list[str] = Field(
        default_factory=list,
        description="On a CPU with AMX-BF16 or AVX512-BF16, the bf16 operators on neither, and why",
    )
    precision_note: str = Field(default="", description="Why the target computes them that way")
    skipped_passes: list[str] = Field(
        default_factory=list,
        description="Graph passes that failed on this model and were left out (or operators a pass kept "
        "out of its rewrite, e.g. in the model's layout), each with the reason; the model compiles without",
    )

    @classmethod
    def of(cls, fusion: FusionSummary) -> FusionOut:
        return cls.from_entity(fusion, kept_float=[KeptFloatOut.from_entity(k) for k in fusion.kept_float])


class TaskPreviewOut(EntityOut):
    name: str
    weight: int = Field(description="How many times the model calls this kernel")
    flops: float
    workload_hash: str


class ModelTasksOut(BaseModel):
    model_id: str
    target_key: str
    tasks: list[TaskPreviewOut]
    fusion: FusionOut

    @classmethod
    def of(
        cls, model_id: str, target_key: str, tasks: list[TaskInfo], fusion: FusionSummary
    ) -> ModelTasksOut:
        return cls(
            model_id=model_id,
            target_key=target_key,
            tasks=[TaskPreviewOut.from_entity(t) for t in tasks],
            fusion=FusionOut.of(fusion),
        )


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
    precision: Literal["as-is", "bf16", "fp16"] = Field(
        default="as-is",
        description="Float models: 'bf16' or 'fp16' computes matmuls and convolutions on low-precision "
        "operands with fp32 accumulation (weights stored in the low precision, sensitive operators kept in "
        "fp32), verified by norm-wise relative error against the float32 model; 'as-is' keeps the model's",
    )
    float_model_id: str | None = Field(
        default=None,
        max_length=64,
        description="A stored float model this quantized or reduced-precision one came from: the job's "
        "accuracy report adds the share of rows whose arg-max (top-1) agrees with it",
    )
    seed: StrictInt = Field(default=0, ge=0, le=2**31 - 1)
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

    @classmethod
    def of(cls, report: AccuracyReport) -> AccuracyOut:
        return cls.from_entity(report, outputs=[OutputAccuracyOut.from_entity(o) for o in report.outputs])


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
    seed: int
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
            seed=spec.seed,
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
    search_stats: dict[str, int | str] | None = Field(
        default=None,
        description="What the space's hooks did (cpu-poly: candidates examined, rejected, passed through "
        "despite the model, seeds measured, and the caches they held tiles against); null for spaces "
        "without hooks",
    )
    schedule_source: Literal["tuned", "similar", "rule", "model", "sampled", "none"] | None = Field(
        default=None,
        description="Where the schedule compiled into the model came from: tuned (the best measured record), "
        "similar (the best record of the same operator at the nearest other shape measured on this target, "
        "its tiles adapted, unmeasured at this shape), rule (a default rule), model (the polyhedral model's best-ranked tiling, unmeasured), sampled (a "
        "design-space sample, unmeasured) or none (serial loops); null until the job compiled",
    )

    @classmethod
    def list_of(cls, tasks: list[Task]) -> list[TaskOut]:
        return [cls.from_entity(t, share=share) for t, share in zip(tasks, time_shares(tasks), strict=True)]


class CurvePoint(EntityOut):
    index: int = Field(description="1-based trial number within the task")
    record_id: int
    latency_us: float | None = Field(description="Measured mean latency; null when the candidate failed")
    best_us: float | None = Field(description="Best latency so far in this task")
    at: datetime
    elapsed_s: float = Field(description="Seconds since the job was submitted")


class CurveOut(BaseModel):
    task_id: int
    name: str
    points: list[CurvePoint]


class JobCurvePoint(EntityOut):
    index: int = Field(description="1-based trial number within the job")
    task_id: int
    record_id: int
    latency_us: float | None = Field(description="This trial's latency; null when the candidate failed")
    task_best_us: float | None = Field(description="Its task's best latency so far")
    estimate_us: float | None = Field(
        description="Estimated end-to-end latency: sum over tasks of weight x best so far (null until every "
        "task has one)"
    )
    at: datetime
    elapsed_s: float = Field(description="Seconds since the job was submitted")


class JobCurveOut(BaseModel):
    points: list[JobCurvePoint]
    warm_start_us: dict[int, float] = Field(
        description="Per task id: the best latency stored before this job measured anything (warm start)"
    )
    peer: str | None = Field(
        default=None, description="The runtime measured beside Kiln (onnxruntime), once the job measured it"
    )
    peer_ms: float | None = Field(
        default=None, description="The peer's end-to-end latency, measured by the job"
    )
    latency_ms: float | None = Field(
        default=None, description="Kiln's end-to-end latency, measured by the job"
    )


class GraphOut(EntityOut):
    target_key: str
    fusion: FusionOut
    graph: str = Field(description="The Relax program after Kiln's passes and fusion, as TVMScript")


class IrLevelOut(EntityOut):
    position: int = Field(description="0: the program as imported; then one level per graph pass, in order")
    name: str = Field(
        description="'imported', or the pass (ConvertLayout, FoldConstant, LegalizeOps, FuseOps...)"
    )
    changed: bool = Field(
        description="Whether the pass changed the program (false: same text as the level before)"
    )
    operators_before: int
    operators_after: int
    histogram: dict[str, int] = Field(description="Relax operator calls by kind after the pass")
    delta: dict[str, int] = Field(
        description="Change of each kind's count by the pass (after - before; nonzero)"
    )
    kernels: int = Field(description="Calls of TIR kernels (call_tir) after the pass")
    prim_funcs: int = Field(description="TIR functions in the module after the pass")
    seconds: float = Field(description="How long the pass ran")


class IrLevelTextOut(IrLevelOut):
    text: str = Field(description="The program's Relax functions after the pass, as TVMScript")


class InstructionMixOut(BaseModel):
    instructions: int = Field(description="Instructions in the kernel's functions")
    fma: dict[str, int] = Field(
        description="Floating-point FMAs by register width: zmm (512-bit), ymm (256), xmm (128), scalar"
    )
    dot_products: dict[str, int] = Field(
        description="Dot-product and tile instructions: vpdpbusd (VNNI), vdpbf16ps (AVX512-BF16), tdpbusd/"
        "tdpbf16ps (AMX)"
    )
    widest_vector_bits: int = Field(description="The widest vector register the kernel uses (0: none)")


class KernelAssemblyOut(EntityOut):
    task_id: int
    name: str
    mix: InstructionMixOut
    text: str = Field(description="The kernel's x86 assembly as compiled into the job's model (LLVM)")


class MachineLimitsOut(EntityOut):
    peak_gflops: float = Field(description="fp32 FMA peak of all threads, GFLOP/s (measured)")
    peak_gflops_one_thread: float = Field(description="The same on one thread")
    bandwidth_gbs: float = Field(description="STREAM triad bandwidth of all threads, GB/s (measured)")
    threads: int
    vector_lanes: int = Field(description="fp32 lanes of the widest vector the target uses")
    ridge_intensity: float = Field(description="FLOP/byte where the two roofs meet")
    how: str = Field(description="How each figure was measured")
    host: str = Field(description="The host name and target the figures are cached under")
    measured_at: datetime | None


class KernelProfileOut(EntityOut):
    name: str
    kind: str = Field(description="'kernel' (a TIR function) or 'runtime' (the VM's builtins, together)")
    calls: int = Field(description="Calls in one run of the model")
    total_us: float = Field(description="Time of all its calls in one run (median per call over the runs)")
    share: float = Field(description="Share of the profile's total time")
    flops: float | None = Field(description="FLOPs per call, from the TIR")
    bytes: int | None = Field(description="Bytes per call: its argument tensors, each read or written once")
    gflops: float | None = Field(description="Achieved GFLOP/s")
    gbs: float | None = Field(description="Achieved GB/s of the bytes above")
    intensity: float | None = Field(description="Arithmetic intensity, FLOP/byte")
    attainable_gflops: float | None = Field(description="The roofline at this intensity")
    roof_fraction: float | None = Field(description="Achieved over attainable")
    bound: str | None = Field(description="'memory' or 'compute': the side of the ridge it lies on")
    onnxruntime_us: float | None = Field(description="Time of the onnxruntime nodes matched to it, one run")
    onnxruntime_nodes: list[str]
    matched_calls: int = Field(description="Calls of this kernel some onnxruntime node matched")
    compared: bool = Field(description="Whether onnxruntime's time covers all its calls (a fair comparison)")
    tuned_best_us: float | None = Field(
        default=None, description="Its task's best latency per call as measured while tuning"
    )

    @classmethod
    def of(
        cls, kernel: KernelProfile, limits: MachineLimits | None, tuned_best_us: float | None = None
    ) -> KernelProfileOut:
        attainable = kernel.attainable_gflops(limits)
        gflops = kernel.gflops
        return cls.from_entity(
            kernel,
            attainable_gflops=attainable,
            roof_fraction=gflops / attainable if gflops and attainable else None,
            bound=kernel.bound(limits),
            tuned_best_us=tuned_best_us,
        )


class OnnxruntimeNodeOut(EntityOut):
    name: str
    op: str
    us: float = Field(description="Its time in one run (median over the runs)")
    kernel: str | None = Field(description="The Kiln kernel it was matched to (null: none)")


class ProfileOut(EntityOut):
    job_id: str
    runs: int = Field(description="Profiled runs the medians are over")
    total_us: float = Field(description="Sum of every row's time: one run of the model as profiled")
    kernels_us: float = Field(description="The kernels' time, each timed in place, in one run")
    latency_ms: float | None = Field(description="The tuned model's latency as the job measured it")
    run_us: float | None = Field(
        description="The model's run, uninstrumented, timed in the process that profiled it (median)"
    )
    limits: MachineLimitsOut | None
    kernels: list[KernelProfileOut] = Field(description="By time, largest first")
    onnxruntime_total_us: float | None = Field(description="onnxruntime's run as its profiler timed it")
    onnxruntime_latency_ms: float | None = Field(
        description="onnxruntime's latency as the job measured it, unprofiled (its profiler adds a cost per node)"
    )
    onnxruntime_unmatched_us: float = Field(description="onnxruntime's time in nodes no kernel matched")
    onnxruntime_nodes: list[OnnxruntimeNodeOut]
    onnxruntime_note: str = Field(description="Why there is no onnxruntime profile ('' when there is)")
    how: str
    disturbed: bool = Field(description="Whether the figures disagree with each other (a busy machine)")
    warnings: list[str] = Field(description="What disagrees, and by how much; empty when the figures agree")

    @classmethod
    def of(cls, job_id: str, profile: ModelProfile, check: ProfileCheck) -> ProfileOut:
        limits = profile.limits
        return cls.from_entity(
            profile,
            job_id=job_id,
            limits=MachineLimitsOut.from_entity(limits) if limits else None,
            kernels=[
                KernelProfileOut.of(k, limits, check.tuned_best_us.get(k.name)) for k in profile.kernels
            ],
            onnxruntime_nodes=[OnnxruntimeNodeOut.from_entity(n) for n in profile.onnxruntime_nodes],
            disturbed=check.disturbed,
            warnings=check.warnings,
        )


class BestOut(EntityOut):
    task_id: int
    name: str
    latency_us: float
    gflops: float | None
    trace: str = Field(description="The schedule, as the Python calls that apply it")
    tir: str = Field(description="The tuned PrimFunc as TVMScript")
    tir_before: str = Field(description="The PrimFunc before scheduling, as TVMScript")
    trace_json: Any


class DeviceOut(EntityOut):
    key: str
    free: int
    pending: int
    total: int


class DevicesOut(BaseModel):
    tracker: str | None
    devices: list[DeviceOut]
    message: str | None = None


class HealthOut(BaseModel):
    status: Literal["ok"]
    database: str
    schema_revision: str | None
    embedded_workers: int
    auth: bool
