"""Graph passes and task extraction: Relax model in, fused kernels and their tuning tasks out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kiln_tvm import Target, estimate_flops, ms, relax, structural_hash, tvm
from kiln_tvm.x86_amx import INT8
from schedules.amx import fits_amx_tiles, has_amx_bf16, has_amx_int8
from schedules.vnni import has_avx512_bf16, integer_dot, seven_bit_dot
from tuner.entities import FusionSummary, IrLevel, PlanningOptions, TaskInfo
from tuner.passes.activations import gelu_as_formula
from tuner.passes.bf16_packing import Bf16AmxReport, pack_for_amx_bf16
from tuner.passes.elementwise import elementwise_as_operators
from tuner.passes.guarded import SkippedPasses, guarded
from tuner.passes.int8_packing import VnniReport, keep_packed_layouts, pack_for_vnni
from tuner.passes.layout_conversion import convert_layout
from tuner.passes.levels import LevelRecorder, kernel_calls, operator_histogram, recording_levels
from tuner.passes.precision import (
    PrecisionReport,
    auto_precision,
    precision_compute,
    read_bf16_round_trips,
    reduce_precision,
)
from tuner.passes.qdq_lowering import QuantReport, lower_qdq
from tuner.passes.qdq_tables import lookups_as_elementwise, tabulate_qdq_chains
from tuner.passes.tile_rewrite import tile_as_broadcast


@dataclass(frozen=True)
class GraphPlan:
    """A model after Kiln's graph passes, ready to tune and to compile.

    ``lowered`` is the module whose fused PrimFuncs are the tasks; compiling applies the tuned records
    to this very module so that the workload hashes match.
    """

    prepared: tvm.IRModule
    lowered: tvm.IRModule
    tasks: list[Any]  # MetaSchedule ExtractedTask
    infos: list[TaskInfo]
    fusion: FusionSummary
    weight_prepack: bool
    #: The program as imported, then after each graph pass (with ``record_levels``; else empty).
    levels: list[IrLevel] = field(default_factory=list)


CONV_LAYOUTS = {"NHWC": {"relax.nn.conv2d": ["NHWC", "OHWI"]}}


def inference_passes(
    *,
    conv_layout: str | None = None,
    fast_math: bool = False,
    quant_report: QuantReport | None = None,
    vnni_report: VnniReport | None = None,
    precision: str = "as-is",
    precision_report: PrecisionReport | None = None,
    bf16_report: Bf16AmxReport | None = None,
    skipped: SkippedPasses | None = None,
) -> tvm.transform.Pass:
    """Inference simplifications run before legalization.

    Quantized (QDQ) convolutions and matmuls are lowered to integer operators first, while their
    weights are still integer constants (:mod:`tuner.passes.qdq_lowering`; ``quant_report`` collects what was
    lowered and what stays in float).

    Convolutions can be converted to ``conv_layout`` (NHWC on CPU: channels innermost, so kernels
    vectorize over output channels and write contiguously; transposes appear only at the graph's
    edges). With a ``precision`` policy other than "as-is", float matmuls and convolutions then take bf16
    or fp16 operands with fp32 accumulation (:mod:`tuner.passes.precision`; ``precision_report`` collects them),
    their weights folded to the low precision below. Batch-norm is decomposed so that it fuses into the
    preceding convolution's epilogue; constant folding and common-subexpression elimination shrink the
    graph before fusion.

    With a ``vnni_report`` (x86 CPUs; its dot product: VNNI's ``vpdpbusd``, else ``vpmaddwd``), the integer
    matmuls and NHWC convolutions whose weights fit are then put on kernels over weights packed for it
    (:mod:`tuner.passes.int8_packing`).
    With a ``bf16_report`` (the bf16 policy on CPUs with AMX-BF16 or AVX512-BF16), the bf16 matmuls that
    are whole AMX blocks, or else whose weights pack for ``vdpbf16ps``, go on kernels over weights packed
    for those instructions (:mod:`tuner.passes.bf16_packing`).

    With ``fast_math``, GELUs are written out as their formula (:mod:`tuner.passes.activations`), then ``exp``,
    ``erf``, ``tanh`` and softmax use TVM's polynomial approximations
    (``topi.fast_exp``...): LLVM lowers the exact ones to a scalar libm call per element (an erf costs
    ~6 ns an element here, 45x its approximation), which no schedule can vectorise.
    """
    skipped = skipped if skipped is not None else SkippedPasses()

    def guard(inner: tvm.transform.Pass, what: str, *reports: Any) -> tvm.transform.Pass:
        return guarded(inner, skipped, what, tuple(r for r in reports if r is not None))

    # NCHW (or None) keeps the layout ONNX and PyTorch models come in.
    layout = [convert_layout(CONV_LAYOUTS[conv_layout], skipped)] if conv_layout in CONV_LAYOUTS else []
    fast = [
        guard(gelu_as_formula(), "GELU as its formula"),
        guard(relax.transform.FastMathTransform(), "fast math"),
    ]
    return tvm.transform.Sequential(
        [
            # TVM's tile computes wrong values on several tiled axes: a broadcast computes them right.
            guard(tile_as_broadcast(), "tile as a broadcast"),
            # Activations the importers emit as opaque kernels become operators ConvertLayout can move.
            guard(elementwise_as_operators(), "activations as operators"),
            guard(lower_qdq(quant_report), "quantized operators in integers", quant_report),
            guard(tabulate_qdq_chains(quant_report), "quantized activations as tables", quant_report),
            # Before the layout moves the casts: a model's own bf16 rounding, read as bf16 operands.
            guard(
                read_bf16_round_trips(precision_report), "bf16 round trips as bf16 operands", precision_report
            ),
            *layout,
            guard(reduce_precision(precision, precision_report), f"precision {precision}", precision_report),
            guard(relax.transform.DecomposeOpsForInference(), "inference decompositions"),
            *(fast if fast_math else []),
            guard(relax.transform.CanonicalizeBindings(), "binding canonicalization"),
            guard(relax.transform.EliminateCommonSubexpr(), "common-subexpression elimination"),
            guard(relax.transform.FoldConstant(), "constant folding"),
            guard(relax.transform.DeadCodeElimination(), "dead-code elimination"),
            *(
                [guard(pack_for_vnni(vnni_report), "VNNI weight packing", vnni_report)]
                if vnni_report is not None
                else []
            ),
            *(
                [guard(pack_for_amx_bf16(bf16_report), "bf16 weight packing", bf16_report)]
                if bf16_report is not None
                else []
            ),
        ]
    )


def is_cpu_target(target: Target) -> bool:
    """CPU targets get NHWC convolutions and compile-time weight re-layout (MetaSchedule's RewriteLayout)."""
    return "cpu" in [str(k) for k in target.keys]


def lower_graph(prepared: tvm.IRModule, target: Target, weight_prepack: bool) -> tvm.IRModule:
    """Legalize to TIR and fuse (TVM's ``zero`` pipeline, the lookup tables of quantized activations fused
    as elementwise operators), optionally marking weights layout-free."""
    zero = tvm.transform.Sequential(
        [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            lookups_as_elementwise(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
    )
    with target:
        lowered = zero(prepared)
        if weight_prepack:
            lowered = keep_packed_layouts(relax.transform.AttachAttrLayoutFreeBuffers()(lowered))
    return lowered


def describe_task(task: Any) -> TaskInfo:
    """Name, weight, FLOPs, workload hash and unscheduled TIR of one extracted task."""
    mod = task.dispatched[0]
    return TaskInfo(
        name=str(task.task_name),
        weight=int(task.weight),
        flops=estimate_flops(mod),
        workload_hash=structural_hash(mod),
        tir=mod.script(),
    )


def plan_graph(
    mod: tvm.IRModule,
    target: Target,
    options: PlanningOptions | None = None,
    *,
    record_levels: bool = False,
) -> GraphPlan:
    """Run Kiln's graph passes on an imported model and extract its tuning tasks.

    ``options`` (:class:`~tuner.entities.PlanningOptions`; default: Kiln's defaults): on CPU targets,
    ``weight_prepack`` lets tuned kernels pick their weights' layout, applied once at compile time (it
    makes the search about twice as slow per trial), convolutions are converted to ``cpu_conv_layout``
    and ``fast_math`` approximates exp, erf, tanh and softmax (see :func:`inference_passes`);
    ``precision`` is the policy for float matmuls and convolutions (:mod:`tuner.passes.precision`). With
    ``record_levels``, the plan keeps the program after each graph pass (:mod:`tuner.passes.levels`).
    """
    options = options or PlanningOptions()
    weight_prepack, cpu_conv_layout = options.weight_prepack, options.cpu_conv_layout
    fast_math, precision = options.fast_math, options.precision
    precision_choice = ""
    if precision == "auto":
        precision, precision_choice = auto_precision(target)
    cpu = is_cpu_target(target)
    prepack = weight_prepack and cpu
    operators = operator_histogram(mod)
    quant = QuantReport()
    dot = integer_dot(target) if cpu else None
    vnni = (
        VnniReport(dot=dot, seven_bit=seven_bit_dot(target), amx=has_amx_int8(target))
        if dot is not None
        else None
    )
    reduced = PrecisionReport()
    amx_bf16, dot_bf16 = cpu and has_amx_bf16(target), cpu and has_avx512_bf16(target)
    # bf16 cores come from the bf16 policy, or from a model that rounds operands to bf16 itself (a
    # quantized model's operators returned to bf16): any policy but fp16 may have them.
    bf16 = (
        Bf16AmxReport(amx=amx_bf16, dot=dot_bf16) if precision != "fp16" and (amx_bf16 or dot_bf16) else None
    )
    skipped = SkippedPasses()
    recorder = LevelRecorder() if record_levels else None
    with recording_levels(recorder):
        prepared = inference_passes(
            conv_layout=cpu_conv_layout if cpu else None,
            fast_math=fast_math and cpu,
            quant_report=quant,
            vnni_report=vnni,
            precision=precision,
            precision_report=reduced,
            bf16_report=bf16,
            skipped=skipped,
        )(mod)
        lowered = lower_graph(prepared, target, prepack)
    tasks = [t for t in ms.relax_integration.extract_tasks(lowered, target) if not _is_scheduled(t)]
    infos = [describe_task(t) for t in tasks]
    on_amx = bf16.packed if bf16 is not None else []
    on_dot = bf16.dot_packed if bf16 is not None else []
    dot_convolutions = bf16.dot_convolutions if bf16 is not None else []
    compute = precision_compute(
        ("bf16" if precision == "as-is" else precision) if reduced.reduced else "as-is",
        target,
        len(reduced.reduced),
        len(on_amx),
        len(on_dot) + len(dot_convolutions),
    )
    amx = (
        [core for core, extents in vnni.matmul_extents.items() if fits_amx_tiles(INT8, *extents)]
        if vnni is not None and has_amx_int8(target)
        else []
    )
    fusion = FusionSummary(
        operators_before=sum(operators.values()),
        kernels_after=kernel_calls(operator_histogram(lowered)),
        distinct_tasks=len(tasks),
        operator_histogram=operators,
        integer_ops=quant.lowered,
        kept_float=quant.kept_float,
        integer_kernels=_integer_kernels(quant, vnni, amx),
        vnni_packed=vnni.packed if vnni is not None else [],
        seven_bit_packed=vnni.seven_bit_packed if vnni is not None else [],
        amx_matmuls=amx,
        vnni_unpacked=vnni.unpacked if vnni is not None else [],
        precision=precision,
        reduced_ops=reduced.reduced,
        amx_bf16_matmuls=on_amx,
        avx512_bf16_matmuls=on_dot,
        avx512_bf16_convolutions=dot_convolutions,
        bf16_unpacked=bf16.unpacked if bf16 is not None else [],
        precision_compute=compute.mode,
        precision_note=compute.note,
        precision_choice=precision_choice,
        skipped_passes=skipped.notes,
    )
    return GraphPlan(
        prepared=prepared,
        lowered=lowered,
        tasks=tasks,
        infos=infos,
        fusion=fusion,
        weight_prepack=prepack,
        levels=recorder.levels() if recorder is not None else [],
    )


def _integer_kernels(quant: QuantReport, vnni: VnniReport | None, amx: list[str]) -> str:
    """The job's ``integer_kernels`` (see :class:`tuner.entities.FusionSummary`)."""
    if not quant.lowered:
        return ""
    if vnni is None:
        return "plain"
    if amx:
        return "amx"
    return vnni.dot.kind


def _is_scheduled(task: Any) -> bool:
    return bool(task.mod.attrs and task.mod.attrs.get("tirx.is_scheduled", False))
