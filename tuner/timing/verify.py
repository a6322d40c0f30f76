"""Checking a tuned build: its outputs against untuned TVM and onnxruntime, and end-to-end latencies.

Each latency is timed in a fresh process per implementation (thread pools of two runtimes in one process
slow each other), on the same seeded inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tuner.compile import LoadedModel, build_untuned, random_inputs
from tuner.entities import AccuracyReport, LatencyReport, ModelFormat
from tuner.errors import VerificationFailed
from tuner.frontend import ImportedModel
from tuner.frontend.onnx_qoperator import dequantized_output_steps
from tuner.jobs.artifact import export_library
from tuner.passes.precision import RELATIVE_TOLERANCE
from tuner.settings import Settings
from tuner.timing.accuracy import ACCURACY_INPUTS, accuracy_report, require_accuracy, with_top1
from tuner.timing.side_by_side import interleaved_timings

#: The name the untuned build goes by in comparisons and reports.
UNTUNED = "untuned TVM"
#: The name the tuned build goes by in latency reports.
TUNED = "Kiln"


@dataclass(frozen=True)
class Comparison:
    """Outcome of comparing a build's outputs with a reference."""

    reference: str
    max_abs_error: float
    max_rel_error: float
    ok: bool


#: The norm-wise relative error a quantized model's float outputs (those it does not dequantize itself:
#: after a float layer norm...) may have against the reference semantics: every float perturbation
#: upstream of a QuantizeLinear (a fused multiply-add, an exact integer sum for the reference's float one)
#: flips the ties it lands on, and the flips compound through the layers; 16 unit roundoffs of 8 bits, as
#: bf16's 16 of 2^-8 (tuner.passes.precision). An int8 DistilBERT lands 0.7-1.5 % from onnxruntime's
#: reference run (which is itself 3.5 % from the float model); a wrong kernel, of the order of 100 %.
QUANTIZED_FLOAT_TOLERANCE = 16 * 2.0**-8


def compare_outputs(
    actual: list[np.ndarray],
    expected: list[np.ndarray],
    reference: str,
    rtol: float,
    atol: float | list[float],
    *,
    norm_wise: list[float | None] | None = None,
) -> Comparison:
    """Compare outputs element-wise: ok when ``|a - e| <= atol + rtol * |e|`` everywhere (``atol`` one
    for all outputs, or one per output); an output given a ``norm_wise`` tolerance is held to
    ``||a - e|| / ||e||`` instead."""
    if len(actual) != len(expected):
        return Comparison(reference, float("inf"), float("inf"), False)
    atols = atol if isinstance(atol, list) else [atol] * len(actual)
    norms = norm_wise if norm_wise is not None else [None] * len(actual)
    max_abs = 0.0
    max_rel = 0.0
    ok = True
    for a, e, atol, norm in zip(actual, expected, atols, norms, strict=True):
        if a.shape != e.shape:
            return Comparison(reference, float("inf"), float("inf"), False)
        a64 = a.astype(np.float64)
        e64 = e.astype(np.float64)
        diff = np.abs(a64 - e64)
        if diff.size:
            max_abs = max(max_abs, float(diff.max()))
            max_rel = max(max_rel, float((diff / np.maximum(np.abs(e64), 1e-12)).max()))
        if norm is not None:
            scale = float(np.linalg.norm(e64))
            ok = ok and float(np.linalg.norm(a64 - e64)) <= norm * scale
        else:
            ok = ok and bool(np.all(diff <= atol + rtol * np.abs(e64)))
    return Comparison(reference, max_abs, max_rel, ok)


def require_match(comparisons: list[Comparison], rtol: float, atol: float) -> None:
    """Raise ``VerificationFailed`` naming every reference the tuned build disagrees with."""
    bad = [c for c in comparisons if not c.ok]
    if bad:
        detail = "; ".join(f"vs {c.reference}: max abs error {c.max_abs_error:.3g}" for c in bad)
        raise VerificationFailed(
            f"tuned model outputs differ beyond tolerance |a-b| <= {atol:g} + {rtol:g}*|b| ({detail})"
        )


@dataclass(frozen=True)
class Latencies:
    """End-to-end latencies of one job, in ms: the untuned and tuned builds and peer runtimes."""

    untuned_ms: float | None = None
    tuned_ms: float | None = None
    references_ms: dict[str, float] = field(default_factory=dict)  # e.g. {"onnxruntime": 0.3}
    report: LatencyReport | None = None  # the rounds behind these medians, and any warnings

    @classmethod
    def of(cls, report: LatencyReport) -> Latencies:
        """The medians of an interleaved measurement of :data:`UNTUNED`, :data:`TUNED` and peers."""
        medians = {name: t.median_ms for name, t in report.timings.items()}
        return cls(
            untuned_ms=medians.pop(UNTUNED, None),
            tuned_ms=medians.pop(TUNED, None),
            references_ms=medians,
            report=report,
        )

    @property
    def speedup(self) -> float | None:
        """Untuned over tuned."""
        return self.untuned_ms / self.tuned_ms if self.untuned_ms and self.tuned_ms else None


#: The reference a quantized model is held to: onnxruntime running each QuantizeLinear, float operator and
#: DequantizeLinear as written (graph optimizations off), i.e. the semantics ONNX defines. Its optimized
#: graph fuses QDQ chains into integer kernels of its own whose rounding differs: on a QDQ BERT-style
#: encoder block from quantize_static, 3 quantization steps from its own unoptimized run (bench/int8.py,
#: 2026-12-02); on the MLPs and CNNs of the tests, within one.
REFERENCE_SEMANTICS = "onnxruntime (reference semantics)"


def verify_outputs(
    settings: Settings,
    imported: ImportedModel,
    tuned_exe: Any,
    untuned_exe: Any,
    *,
    inputs: list[np.ndarray],
    reference_semantics: bool = False,
    chained_layers: int = 1,
) -> list[Comparison]:
    """Compare the tuned build with the untuned one and with onnxruntime (ONNX models, when installed);
    :class:`~tuner.errors.VerificationFailed` when any disagrees. With ``reference_semantics`` (quantized
    models), onnxruntime runs the graph as written (:data:`REFERENCE_SEMANTICS`), and a quantized output
    may be a step off per quantized layer in a chain (``chained_layers``: :mod:`tuner.timing.accuracy`)."""
    rtol, atol = settings.verify_rtol, settings.verify_atol
    tuned_out = LoadedModel(tuned_exe).run(inputs)
    atols = output_tolerances(imported, atol, len(tuned_out), max(1, chained_layers))
    # A quantized model's float outputs are held norm-wise (QUANTIZED_FLOAT_TOLERANCE), its dequantized
    # ones to steps (atols).
    steps = output_steps(imported, len(tuned_out))
    norms = [QUANTIZED_FLOAT_TOLERANCE if reference_semantics and s is None else None for s in steps]
    untuned = LoadedModel(untuned_exe).run(inputs)
    comparisons = [compare_outputs(tuned_out, untuned, UNTUNED, rtol, atols, norm_wise=norms)]
    runner = _onnxruntime_runner(imported, reference_semantics)
    if runner is not None:
        name = REFERENCE_SEMANTICS if reference_semantics else "onnxruntime"
        comparisons.append(compare_outputs(tuned_out, runner(inputs), name, rtol, atols, norm_wise=norms))
    require_match(comparisons, rtol, max(atols, default=atol))
    return comparisons


@dataclass(frozen=True)
class FloatReference:
    """The float model a quantized or reduced-precision job stands for: its name and how to run it."""

    name: str
    run: Callable[[list[np.ndarray]], list[np.ndarray]]


def float_reference(name: str, imported: ImportedModel, target: Any) -> FloatReference:
    """Run the float model ``imported`` on onnxruntime (ONNX, when installed), else untuned TVM."""
    runner = _onnxruntime_runner(imported)
    if runner is None:
        runner = LoadedModel(build_untuned(imported.mod, target)).run
    return FloatReference(name, runner)


def measure_accuracy(
    imported: ImportedModel,
    tuned_exe: Any,
    seed: int,
    float_model: FloatReference | None = None,
    *,
    chained_layers: int = 1,
) -> AccuracyReport | None:
    """A quantized ONNX model's tuned outputs against onnxruntime's run of the graph as written
    (:data:`REFERENCE_SEMANTICS`) over :data:`ACCURACY_INPUTS` seeded inputs (:mod:`tuner.timing.accuracy`), with
    the top-1 agreement against ``float_model`` when given; :class:`~tuner.errors.VerificationFailed`
    beyond a step per quantized layer (``chained_layers``). None when onnxruntime is not installed or the
    model is not ONNX."""
    reference = _onnxruntime_runner(imported, reference_semantics=True)
    if reference is None:
        return None
    names = [spec.name for spec in imported.signature.outputs]
    steps = dequantized_output_steps(imported.canonical_bytes)
    if len(steps) != len(names):
        steps = [None] * len(names)
    report = _accuracy_over_inputs(
        imported,
        tuned_exe,
        reference,
        name=REFERENCE_SEMANTICS,
        seed=seed,
        steps=steps,
        tolerance=None,
        float_model=float_model,
        chained_layers=chained_layers,
    )
    require_accuracy(report)
    return report


def verify_reduced_precision(
    imported: ImportedModel,
    tuned_exe: Any,
    untuned_exe: Any,
    *,
    seed: int,
    policy: str,
    float_model: FloatReference | None = None,
) -> tuple[list[Comparison], AccuracyReport]:
    """A reduced-precision build (bf16, fp16) against the float32 model over :data:`ACCURACY_INPUTS`
    seeded inputs: onnxruntime's outputs for an ONNX model (when installed), else untuned TVM's, which
    computes in float32. Element-wise tolerances do not apply to a low precision; each output's norm-wise
    relative error is held to the policy's (:data:`tuner.passes.precision.RELATIVE_TOLERANCE`), and
    :class:`~tuner.errors.VerificationFailed` names the outputs beyond it. With ``float_model``, the report
    adds the top-1 agreement with it."""
    report = reduced_precision_report(
        imported, tuned_exe, lambda: untuned_exe, seed=seed, policy=policy, float_model=float_model
    )
    tolerance = RELATIVE_TOLERANCE[policy]
    comparisons = [
        Comparison(
            report.reference,
            max((o.max_abs for o in report.outputs), default=0.0),
            max((o.relative_error or 0.0 for o in report.outputs), default=0.0),
            all((o.relative_error or 0.0) <= tolerance for o in report.outputs),
        )
    ]
    require_accuracy(report)
    return comparisons, report


def reduced_precision_report(
    imported: ImportedModel,
    reduced_exe: Any,
    float_exe: Callable[[], Any],
    *,
    seed: int,
    policy: str,
    float_model: FloatReference | None = None,
    inputs: int = ACCURACY_INPUTS,
) -> AccuracyReport:
    """The accuracy report of a reduced-precision build against the float32 model (onnxruntime's run of an
    ONNX model, else the build ``float_exe()`` returns, only then built), under ``policy``'s tolerance,
    over ``inputs`` seeded inputs, without judging it (:func:`~tuner.timing.accuracy.require_accuracy`
    does)."""
    runner = _onnxruntime_runner(imported)
    name = "onnxruntime (float32)" if runner is not None else f"{UNTUNED} (float32)"
    if runner is None:
        runner = LoadedModel(float_exe()).run
    return _accuracy_over_inputs(
        imported,
        reduced_exe,
        runner,
        name=name,
        seed=seed,
        steps=[None] * len(imported.signature.outputs),
        tolerance=RELATIVE_TOLERANCE[policy],
        float_model=float_model,
        inputs=inputs,
    )


def _accuracy_over_inputs(
    imported: ImportedModel,
    tuned_exe: Any,
    reference: Callable[[list[np.ndarray]], list[np.ndarray]],
    *,
    name: str,
    seed: int,
    steps: list[float | None],
    tolerance: float | None,
    float_model: FloatReference | None = None,
    inputs: int = ACCURACY_INPUTS,
    chained_layers: int = 1,
) -> AccuracyReport:
    model = LoadedModel(tuned_exe)
    actual, expected, floats = [], [], []
    for index in range(inputs):
        inputs = random_inputs(imported.signature, seed + index)
        actual.append(model.run(inputs))
        expected.append(reference(inputs))
        if float_model is not None:
            floats.append(float_model.run(inputs))
    names = [spec.name for spec in imported.signature.outputs]
    report = accuracy_report(
        actual, expected, names, steps, reference=name, tolerance=tolerance, chained_layers=chained_layers
    )
    return report if float_model is None else with_top1(report, actual, floats, float_model.name)


def output_tolerances(
    imported: ImportedModel, atol: float, outputs: int, allowed_steps: int = 1
) -> list[float]:
    """The absolute tolerance of each output: ``atol``, or ``allowed_steps`` quantization steps (and a hair)
    for an output a quantized model dequantizes, where integer kernels may round a tie the other way (once
    per quantized layer in a chain)."""
    steps = output_steps(imported, outputs)
    return [max(atol, 1.001 * allowed_steps * step) if step else atol for step in steps]


def output_steps(imported: ImportedModel, outputs: int) -> list[float | None]:
    """Each output's quantization step when the model dequantizes it (None: a float output)."""
    steps: list[float | None] = [None] * outputs
    if imported.format is ModelFormat.ONNX:
        found = dequantized_output_steps(imported.canonical_bytes)
        steps = found if len(found) == outputs else steps
    return steps


def measure_latencies(
    imported: ImportedModel,
    untuned_exe: Any,
    tuned_lib: Path,
    *,
    build_dir: Path,
    inputs: list[np.ndarray],
    rounds: int = 3,
) -> Latencies:
    """End-to-end latencies of the untuned and tuned builds and of onnxruntime (ONNX models, when
    installed), from interleaved rounds, each implementation in its own fresh process per round."""
    contenders: dict[str, tuple[str, Path]] = {
        UNTUNED: ("tvm", export_library(untuned_exe, build_dir / "untuned.so")),
        TUNED: ("tvm", tuned_lib),
    }
    onnx_file, _ = onnxruntime_model(imported, build_dir)
    if onnx_file is not None:
        contenders["onnxruntime"] = ("onnxruntime", onnx_file)
    return Latencies.of(interleaved_timings(contenders, inputs, rounds))


def onnxruntime_model(imported: ImportedModel, build_dir: Path) -> tuple[Path | None, str]:
    """The model as an ONNX file onnxruntime can run, written to ``build_dir`` (once); or None and why
    there is none."""
    if imported.format is not ModelFormat.ONNX:
        return None, f"onnxruntime runs ONNX models; this one is a {imported.format.value} program"
    if not _has_onnxruntime():
        return None, "onnxruntime is not installed"
    onnx_file = build_dir / "model.onnx"
    if not onnx_file.exists():
        imported.write_canonical(onnx_file)
    return onnx_file, ""


def _has_onnxruntime() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def _onnxruntime_runner(
    imported: ImportedModel, reference_semantics: bool = False
) -> Callable[[list[np.ndarray]], list[np.ndarray]] | None:
    """onnxruntime's session of the model as a function of the inputs (None: not ONNX, or not installed);
    with ``reference_semantics``, its graph optimizations off (:data:`REFERENCE_SEMANTICS`)."""
    if imported.format is not ModelFormat.ONNX or not _has_onnxruntime():
        return None
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if reference_semantics:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    source = imported.canonical if isinstance(imported.canonical, bytes) else str(imported.canonical)
    session = onnxruntime.InferenceSession(source, options, providers=["CPUExecutionProvider"])

    def run(inputs: list[np.ndarray]) -> list[np.ndarray]:
        feed = {spec.name: x for spec, x in zip(imported.signature.inputs, inputs, strict=True)}
        return [np.asarray(o) for o in session.run(None, feed)]

    return run


__all__ = [
    "TUNED",
    "UNTUNED",
    "FloatReference",
    "Latencies",
    "float_reference",
    "measure_accuracy",
    "measure_latencies",
    "verify_outputs",
    "verify_reduced_precision",
]
