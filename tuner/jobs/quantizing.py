"""The int8 policy's first stage (and auto's, given calibration inputs): a float ONNX model (a torch.export
program exported to ONNX first) quantized within the job's accuracy budget, on the user's calibration
samples (or, for int8 asked by name, seeded synthetic ones), before the model is imported and planned."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from schedules.vnni import seven_bit_dot
from tuner.entities import CoreSpeed, JobSpec, ModelFormat, ModelInfo, QuantizationReport
from tuner.jobs.measuring import measuring_caches
from tuner.passes.plan import GraphPlan
from tuner.passes.precision import native_bf16
from tuner.quantization.accuracy_control import CoreTimer, control_accuracy
from tuner.quantization.calibration import CalibrationSet
from tuner.quantization.calibration_files import check_int8_model, job_calibration, job_inputs
from tuner.quantization.onnx_quantizer import StaticQuantizer
from tuner.quantization.program_export import onnx_from_program
from tuner.settings import Settings
from tuner.targets import is_host_cpu, to_tvm_target
from tuner.timing.core_speeds import CoreBuild, time_cores


def quantizes(spec: JobSpec) -> bool:
    """Whether a job quantizes its float model: precision int8, or auto with calibration inputs."""
    return spec.precision == "int8" or (spec.precision == "auto" and spec.calibration_id is not None)


def with_int8_choice(plan: GraphPlan, policy: str, report: QuantizationReport) -> GraphPlan:
    """``plan`` of a quantized model, its fusion summary saying the policy and what it chose."""
    ints = sum(1 for p in report.precision.values() if p == "int8")
    held = "within" if report.within_budget else "NOT within"
    choice = (
        f"{policy}: int8 ({report.weight_bits}-bit weights{', float core outputs' if report.float_outputs else ''}) from {report.samples} ({report.method} calibration): {ints} of "
        f"{len(report.precision)} convolutions/matmuls in int8, {len(report.returned)} returned to "
        f"{report.returned_precision} for the budget, {len(report.returned_for_speed)} no faster in int8 "
        f"(timed alone), {held} the accuracy budget"
    )
    fusion = dataclasses.replace(plan.fusion, precision="int8", precision_choice=choice)
    return dataclasses.replace(plan, fusion=fusion)


def quantize_model(
    settings: Settings,
    spec: JobSpec,
    model: ModelInfo,
    float_path: Path,
    *,
    shapes: dict[str, tuple[int, ...]],
    workdir: Path,
) -> tuple[Path, QuantizationReport]:
    """``float_path`` quantized to int8 within ``spec``'s accuracy budget: the QDQ model's path (in
    ``workdir``) and the report."""
    check_int8_model(model)
    calibration = job_calibration(settings, spec.calibration_id, job_inputs(model, shapes))
    if model.format is ModelFormat.TORCH_EXPORT:
        names = tuple(t.name for t in model.signature.inputs)
        float_path = onnx_from_program(float_path, workdir / "exported.onnx", input_names=names)
    # Without VNNI, 7-bit weights put the kernels on vpmaddubsw, exact on them and twice as fast as the
    # int16 products full 8-bit weights need there; the accuracy control judges what they cost.
    target = to_tvm_target(spec.target)
    seven_bits = seven_bit_dot(target) is not None
    quantizer = StaticQuantizer(
        onnx.load(str(float_path)),
        calibration.calibration,
        spec.calibration_method,
        workdir,
        weight_bits=7 if seven_bits else 8,
    )
    outputs = [o.name for o in quantizer.model.graph.output]
    # Operators the budget returns from int8 go to bf16 where the CPU multiplies it natively.
    bf16 = bool(native_bf16(target))
    timer, why_not = _core_timer(settings, spec, workdir / "cores")
    path, report = control_accuracy(
        quantizer, calibration, spec.accuracy_budget, _evaluator(calibration), outputs, bf16=bf16, timer=timer
    )
    return path, (dataclasses.replace(report, speed_note=why_not) if why_not else report)


def _core_timer(settings: Settings, spec: JobSpec, workdir: Path) -> tuple[CoreTimer | None, str]:
    """Under ``auto``, what times each int8 operator alone against its bf16/float32 form on this CPU;
    else None and why not."""
    if spec.precision != "auto":
        return None, "not timed: precision int8 was asked for by name"
    if not is_host_cpu(spec.target):
        return None, "not timed: the job's target is not this machine's CPU"
    if settings.core_timing_budget_s <= 0:
        return None, "not timed: KILN_CORE_TIMING_BUDGET_S is 0"
    build = CoreBuild(
        to_tvm_target(spec.target),
        settings.planning_options("as-is"),
        measuring_caches(settings, runs_here=True),
    )

    def timer(qdq: Path, floats: Path, names: list[str], other: str) -> tuple[list[CoreSpeed], str]:
        return time_cores(
            qdq, floats, names, other, build, workdir=workdir, budget_s=settings.core_timing_budget_s
        )

    return timer, ""


def _evaluator(calibration: CalibrationSet) -> Callable[[Path], list[list[np.ndarray]]]:
    """Runs an ONNX model as ONNX defines it (onnxruntime, graph optimizations off) on the validation
    samples."""
    import onnxruntime  # the worker's dependency; imported when a job quantizes, as verification does

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3

    def evaluate(path: Path) -> list[list[np.ndarray]]:
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return [[np.asarray(o) for o in session.run(None, sample)] for sample in calibration.validation]

    return evaluate
