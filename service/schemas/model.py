"""Models: what an upload stored, and the preview of its tasks."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from service.schemas.common import EntityOut
from tuner.entities import (
    FusionSummary,
    ModelInfo,
    TaskInfo,
    TensorSpec,
)


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
        "without AVX-512), 'avx512' and 'avx2' (weights packed as int16 for vpmaddwd, exact int16 products, on "
        "CPUs without VNNI: zmm with AVX512-BW, ymm with AVX2), 'plain' (tiled integer loops: no vector integer "
        "dot product), '' without any",
    )
    vnni_packed: list[str] = Field(
        default_factory=list,
        description="Integer operators on packed kernels (VNNI's, or vpmaddubsw/vpmaddwd)",
    )
    seven_bit_packed: list[str] = Field(
        default_factory=list,
        description="Of vnni_packed on a CPU without VNNI, those over 7-bit weights (within +-64) on vpmaddubsw; "
        "the others on exact int16 products (vpmaddwd)",
    )
    amx_matmuls: list[str] = Field(
        default_factory=list, description="Of the packed operators, the matmuls tuned on AMX tiles (tdpbusd)"
    )
    vnni_unpacked: list[str] = Field(
        default_factory=list, description="Integer operators on a VNNI CPU left on plain kernels, and why"
    )
    precision: str = Field(
        default="as-is",
        description="The precision the plan computes in: as-is, bf16 or fp16 (what 'auto' chose, for a job under it)",
    )
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
    precision_choice: str = Field(
        default="",
        description="Under the 'auto' policy, what it chose ('precision': bf16 or as-is) and why; '' otherwise",
    )
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
