"""What the compiler did, as the dashboard shows it: tuning curves, the graph, the program's levels, kernels' assembly, best schedules."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from service.schemas.common import EntityOut
from service.schemas.model import FusionOut


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


class BestOut(EntityOut):
    task_id: int
    name: str
    latency_us: float
    gflops: float | None
    trace: str = Field(description="The schedule, as the Python calls that apply it")
    tir: str = Field(description="The tuned PrimFunc as TVMScript")
    tir_before: str = Field(description="The PrimFunc before scheduling, as TVMScript")
    trace_json: Any
