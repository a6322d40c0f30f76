"""A tuned model's profile under this machine's roofline."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from service.schemas.common import EntityOut
from tuner.entities import (
    KernelProfile,
    MachineLimits,
    ModelProfile,
)
from tuner.timing.profile_check import ProfileCheck


class MachineLimitsOut(EntityOut):
    peak_gflops: float = Field(description="fp32 FMA peak of all threads, GFLOP/s (measured)")
    peak_gflops_one_thread: float = Field(description="The same on one thread")
    bandwidth_gbs: float = Field(description="STREAM triad bandwidth of all threads, GB/s (measured)")
    threads: int
    vector_lanes: int = Field(description="fp32 lanes of the widest vector the target uses")
    ridge_intensity: float = Field(description="FLOP/byte where the two roofs meet")
    how: str = Field(description="How each figure was measured")
    other_cpu_share: float | None = Field(
        description="Largest share of all CPUs other processes used while a kept figure was measured"
    )
    disturbed: bool = Field(
        description="Other processes kept the machine busy through every try: the figures may be low (the "
        "next jobs measure them again, a few times, and keep each at its best)"
    )
    measurements: int = Field(description="How many measurements the figures are the best of")
    host: str = Field(description="The host name and target the figures are cached under")
    measured_at: datetime | None
    int8_gops: float | None = Field(
        default=None,
        description="int8 peak of all threads, G operations/s (a multiply-accumulate counts 2; measured on "
        "the CPU's widest int8 dot product; null: none)",
    )
    int8_instruction: str | None = Field(default=None, description="That dot product, e.g. 'vpdpbusd zmm'")
    bf16_gflops: float | None = Field(
        default=None, description="bf16 peak of all threads on vdpbf16ps, GFLOP/s (null: no AVX512-BF16)"
    )
    bf16_instruction: str | None = Field(default=None, description="That dot product")


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
    precision: str | None = Field(
        default=None,
        description="What it computes in ('fp32', 'int8', 'bf16'; null: other): its compute roof is that "
        "precision's peak",
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
