"""What planning a model's graph found: its tasks, its program's levels, the fusion summary."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class TaskInfo:
    """A tuning task extracted from a model (before any tuning)."""

    name: str
    weight: int
    flops: float
    workload_hash: str
    tir: str  # TVMScript of the fused PrimFunc before scheduling
    #: The polyhedral analysis of that PrimFunc (schedules.poly, without cache sizes), as JSON; an
    #: ``{"error": ...}`` when it failed.
    polyhedral: dict[str, Any] | None = None


@dataclass(frozen=True)
class IrLevel:
    """One level of a model's lowering: the Relax program after one of Kiln's graph passes (or as
    imported, or fused), and what that pass changed."""

    position: int  # 0: as imported; then one per pass, in the order they ran
    name: str  # "imported", "ConvertLayout", "FoldConstant", "FuseOps", ...
    text: str  # the program's Relax functions as TVMScript ("" when unchanged: see ``changed``)
    changed: bool  # False: the pass left the program as the level before (its text is that level's)
    operators_before: int
    operators_after: int
    #: Relax operator calls by kind after the pass, and their change by kind (after - before; nonzero only).
    histogram: dict[str, int] = field(default_factory=dict)
    delta: dict[str, int] = field(default_factory=dict)
    kernels: int = 0  # calls of TIR kernels (call_tir) after the pass
    prim_funcs: int = 0  # TIR functions in the module after the pass
    seconds: float = 0.0  # how long the pass ran


@dataclass(frozen=True)
class KeptFloat:
    """A quantized operator of the model that Kiln left in float, and why."""

    op: str  # "conv2d", "matmul"
    shapes: str  # "1x256 @ 256x512"
    reason: str


@dataclass(frozen=True)
class FusionSummary:
    """Graph-level effect of Kiln's passes: operators before fusion, kernels after, and for quantized models
    the operators computed in integers and those kept in float."""

    operators_before: int
    kernels_after: int
    distinct_tasks: int
    operator_histogram: dict[str, int] = field(default_factory=dict)
    integer_ops: list[str] = field(default_factory=list)  # "conv2d 1x3x32x32 * 16x3x3x3 -> int8"
    kept_float: list[KeptFloat] = field(default_factory=list)
    #: How the integer kernels compute: "amx" (weights packed for vpdpbusd where they fit, and the packed
    #: matmuls that are whole 16 x 32 x 64 blocks on AMX tiles), "vnni" (packed for vpdpbusd zmm where they
    #: fit), "avx-vnni" (packed 8 channels wide for vpdpbusd ymm: AVX-VNNI without AVX-512), "avx512" and
    #: "avx2" (no VNNI: packed as int16 for vpmaddwd zmm / ymm, exact int16 products), "plain" (tiled integer
    #: loops: no vector integer dot product); "" without integer kernels.
    integer_kernels: str = ""
    vnni_packed: list[str] = field(default_factory=list)  # "conv2d 1x56x56x64 * 64x3x3x64"
    #: Of vnni_packed on a CPU without VNNI, those over 7-bit weights, on vpmaddubsw (not int16 vpmaddwd).
    seven_bit_packed: list[str] = field(default_factory=list)
    amx_matmuls: list[str] = field(default_factory=list)  # of vnni_packed, those tuned on AMX tiles
    vnni_unpacked: list[str] = field(default_factory=list)  # "conv2d 1x224x224x3 * ...: why"
    #: The job's precision policy (tuner.passes.precision), the operators it put on low-precision operands, and
    #: how the target computes them: "native", "mixed", "emulated" (with why in the note), or "" when none
    #: was; the bf16 matmuls on AMX-BF16 kernels among them, those (and the convolutions) on AVX512-BF16's,
    #: and on a CPU with either, the bf16 operators on neither (why).
    precision: str = "as-is"
    reduced_ops: list[str] = field(default_factory=list)  # "matmul 32x512 @ 512x2048 -> bf16"
    amx_bf16_matmuls: list[str] = field(default_factory=list)  # "matmul 128x256 @ 256x1024"
    avx512_bf16_matmuls: list[str] = field(default_factory=list)  # on vdpbf16ps: "matmul 4x256 @ 256x512"
    avx512_bf16_convolutions: list[str] = field(default_factory=list)  # "conv2d 1x56x56x64 * 64x3x3x64"
    bf16_unpacked: list[str] = field(default_factory=list)  # bf16 operators on no bf16 instruction: why
    precision_compute: str = ""
    precision_note: str = ""
    #: Under the ``auto`` policy, what it chose (``precision``) and why; "" under the others.
    precision_choice: str = ""
    #: The graph passes that failed on this model and were left out, or operators a pass kept out of its
    #: rewrite, each with TVM's reason (``tuner.passes.guarded``): the plan compiles without them.
    skipped_passes: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FusionSummary:
        """The summary from its JSON form (``dataclasses.asdict``)."""
        fields = dict(data)
        fields["kept_float"] = [KeptFloat(**k) for k in fields.get("kept_float", [])]
        return cls(**fields)


@dataclass(frozen=True)
class ModelPlan:
    """A model's tuning tasks and fused graph on one target, before any tuning."""

    target_key: str
    tasks: list[TaskInfo]
    fusion: FusionSummary
    graph: str  # the Relax program after fusion, as TVMScript


@dataclass(frozen=True)
class PlanError:
    """Why a model could not be planned for a target (kept, so that it is not retried per request)."""

    target_key: str
    kind: str  # a KilnError kind
    message: str
    transient: bool = False  # it may not come again (the machine was busy, the client left): not kept


@dataclass(frozen=True)
class PlanningOptions:
    """How Kiln's graph passes plan a model (CPU targets): whether tuned kernels choose their weights'
    layout (``weight_prepack``), the layout convolutions are converted to (``cpu_conv_layout``; "NCHW" or
    None keeps the model's), whether exp, erf, tanh and softmax use TVM's approximations (``fast_math``),
    and the job's precision policy for float matmuls and convolutions (``precision``)."""

    weight_prepack: bool = True
    cpu_conv_layout: str | None = "NHWC"
    fast_math: bool = True
    precision: str = "as-is"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlanningOptions:
        return cls(**data)
