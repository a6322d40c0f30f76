"""Accuracy control: the quantized model held to the user's budget on held-back validation samples, the
operators that hurt it most returned to float one at a time until it holds.

The metric compares the quantized model with the float model on the validation samples:

* for a classifier-like output (``[batch, classes]``, or class scores of any rank that a softmax over the
  last axis produces: a text recognizer's ``[batch, steps, characters]``), the share of the validation
  samples (each batch row) whose answer changes: its top-1 class, or for scores over steps any step's, as
  a recognizer's text may then change (default budget: 1 %, NNCF's ``max_drop`` of 0.01 and Intel Neural
  Compressor's default);
* for any other output, its norm-wise relative error ``||q - f|| / ||f||`` over all validation samples
  (default budget: 0.05).

The quantized model is run as ONNX defines it (onnxruntime with its graph optimizations off: dequantize,
the float operator, quantize), which Kiln's integer kernels compute to within one rounding step
(:mod:`tuner.timing.accuracy`), so that the model judged is the model Kiln compiles.

When the fully quantized model breaks the budget with the cores' outputs rounded to 8 bits (the faster
form), it is quantized again with them left in float (:mod:`tuner.quantization.onnx_quantizer`). When
that breaks the budget too, each quantized convolution or matmul is ranked by how
much the outputs' error shrinks when it alone stays in float (a continuous measure, where the top-1
share moves in steps of one sample); then they return to float in that order, one at a time, until the
budget holds (as NNCF's ``quantize_with_accuracy_control`` does, by the metric). On a CPU that multiplies
bf16 natively, they return to bf16 first (:mod:`tuner.quantization.bf16_operands`: twice float32's rate
there, a rounding of the operands to 8 significant bits where int8 has a per-tensor scale), and to float32
only when the budget breaks with every one of them in bf16.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tuner.entities import AccuracyBudget, CoreSpeed, QuantizationMetric, QuantizationReport
from tuner.quantization.calibration import CalibrationSet
from tuner.quantization.onnx_quantizer import StaticQuantizer

#: Runs an ONNX model on the validation samples: per sample, its outputs.
Evaluator = Callable[[Path], list[list[np.ndarray]]]
#: Times int8 operators alone (the QDQ model, the float model, their names, the precision they would
#: return to): each one's timings, and a note on those not timed (:mod:`tuner.timing.core_speeds`).
CoreTimer = Callable[[Path, Path, list[str], str], tuple[list[CoreSpeed], str]]


def is_classifier_output(value: np.ndarray) -> bool:
    """Whether an output reads as class scores: ``[batch, classes]`` with at least two classes."""
    return value.ndim == 2 and value.shape[-1] >= 2


def compare_outputs(
    quantized: list[list[np.ndarray]],
    floats: list[list[np.ndarray]],
    names: Sequence[str],
    classifier: Sequence[bool] | None = None,
) -> QuantizationMetric:
    """The metric of ``quantized`` against ``floats`` (per sample, the outputs ``names``); ``classifier``
    says which outputs are class scores (default: the ``[batch, classes]`` ones)."""
    top1: list[float] = []
    errors: dict[str, float] = {}
    for index, name in enumerate(names):
        q = [run[index].astype(np.float64) for run in quantized]
        f = [run[index].astype(np.float64) for run in floats]
        scores = classifier[index] if classifier is not None else is_classifier_output(f[0])
        if scores:
            # One answer per batch row: its class, or the classes of all its steps.
            changed = np.concatenate(
                [
                    (a.argmax(-1) != b.argmax(-1)).reshape(a.shape[0], -1).any(axis=1)
                    for a, b in zip(q, f, strict=True)
                ]
            )
            top1.append(float(changed.mean()))
        qa, fa = np.concatenate([a.ravel() for a in q]), np.concatenate([b.ravel() for b in f])
        norm = float(np.linalg.norm(fa))
        errors[name] = float(np.linalg.norm(qa - fa) / norm) if norm else float(np.any(qa != fa))
    return QuantizationMetric(top1_changed=max(top1) if top1 else None, relative_error=errors)


def within(metric: QuantizationMetric, budget: AccuracyBudget, classifier: Sequence[bool]) -> bool:
    """Whether ``metric`` holds ``budget``: the top-1 share on classifier outputs, the relative error on
    the others (``classifier`` says which, in output order)."""
    if metric.top1_changed is not None and metric.top1_changed > budget.max_top1_changed:
        return False
    errors = list(metric.relative_error.values())
    return all(c or e <= budget.max_relative_error for c, e in zip(classifier, errors, strict=True))


def control_accuracy(
    quantizer: StaticQuantizer,
    calibration: CalibrationSet,
    budget: AccuracyBudget,
    evaluate: Evaluator,
    output_names: Sequence[str],
    *,
    bf16: bool = False,
    timer: CoreTimer | None = None,
) -> tuple[Path, QuantizationReport]:
    """The QDQ model that holds ``budget`` (``evaluate`` runs a model on the validation samples; the float
    model first), with its report: the metric with every operator in int8 and at the end, what returned
    to float and why, and each operator's precision. With ``bf16`` (a CPU that multiplies bf16 natively),
    operators return to bf16 first, and to float32 only when the budget breaks with all of them in bf16.
    With ``timer`` (precision auto), the operators left in int8 are timed alone against that other
    precision, and those no faster in int8 return to it too, when the budget still holds."""
    floats = evaluate(quantizer.float_path)
    classifier = [
        is_classifier_output(out) or name in quantizer.class_scores
        for name, out in zip(output_names, floats[0] if floats else [], strict=False)
    ]

    def measure(path: Path) -> QuantizationMetric:
        return compare_outputs(evaluate(path), floats, output_names, classifier)

    first = quantizer.quantize()
    before = measure(first)
    path, after, returned, returned_to = first, before, list[str](), "float32"
    if not within(before, budget, classifier) and not quantizer.float_outputs:
        # The faster form broke the budget: the cores' outputs left in float, before any returns.
        quantizer.float_outputs = True
        path = quantizer.quantize()
        after = measure(path)
    if not within(after, budget, classifier):
        order = _sensitivity(quantizer, after, measure)
        for returned_to in ("bf16", "float32") if bf16 else ("float32",):
            returned = []
            for node in order:
                returned.append(node)
                path = quantizer.quantize(returned, bf16=returned_to == "bf16")
                after = measure(path)
                if within(after, budget, classifier):
                    break
            if within(after, budget, classifier):
                break
    other = returned_to if returned else ("bf16" if bf16 else "float32")
    speed = _SpeedChoice(path, after, [], [], "")
    if timer is not None:
        judge = lambda p: _judged(measure(p), budget, classifier)  # noqa: E731
        speed = _return_slower(quantizer, returned, other, timer, judge=judge, kept=speed)
    path, after, for_speed = speed.path, speed.after, speed.returned
    if for_speed:
        returned_to = other
    kept = set(returned) | set(for_speed)
    report = QuantizationReport(
        method=quantizer.method,
        samples=calibration.describe(),
        synthetic=calibration.synthetic,
        budget=budget,
        before=before,
        after=after,
        within_budget=within(after, budget, classifier),
        returned=tuple(n.describe() for n in quantizer.nodes if n.name in set(returned)),
        precision={n.name: (returned_to if n.name in kept else "int8") for n in quantizer.nodes},
        weight_bits=quantizer.weight_bits,
        float_outputs=quantizer.float_outputs,
        returned_precision=returned_to,
        speeds=tuple(speed.speeds),
        returned_for_speed=tuple(n.describe() for n in quantizer.nodes if n.name in set(for_speed)),
        speed_note=speed.note,
    )
    return path, report


@dataclass(frozen=True)
class _SpeedChoice:
    """The model after the operators no faster in int8 returned (or as it was), and what was timed."""

    path: Path
    after: QuantizationMetric
    returned: list[str]
    speeds: list[CoreSpeed]
    note: str


def _judged(
    metric: QuantizationMetric, budget: AccuracyBudget, classifier: Sequence[bool]
) -> tuple[QuantizationMetric, bool]:
    return metric, within(metric, budget, classifier)


def _return_slower(
    quantizer: StaticQuantizer,
    returned: list[str],
    other: str,
    timer: CoreTimer,
    *,
    judge: Callable[[Path], tuple[QuantizationMetric, bool]],
    kept: _SpeedChoice,
) -> _SpeedChoice:
    """The int8 operators timed alone against ``other``; those no faster in int8 returned to it, unless
    that breaks the budget (``judge``: a model's metric and whether it holds), then ``kept`` stays."""
    ints = [n.name for n in quantizer.nodes if n.name not in set(returned)]
    if not ints:
        return kept
    speeds, note = timer(kept.path, quantizer.float_path, ints, other)
    slower = [speed.name for speed in speeds if speed.chosen != "int8"]
    if not slower:
        return dataclasses.replace(kept, speeds=speeds, note=note)
    candidate = quantizer.quantize([*returned, *slower], bf16=other == "bf16")
    metric, holds = judge(candidate)
    if holds:
        return _SpeedChoice(candidate, metric, slower, speeds, note)
    broke = f"{len(slower)} no faster in int8 kept in int8: returning them broke the budget"
    return dataclasses.replace(kept, speeds=speeds, note="; ".join(filter(None, [note, broke])))


def _sensitivity(
    quantizer: StaticQuantizer, before: QuantizationMetric, measure: Callable[[Path], QuantizationMetric]
) -> list[str]:
    """The quantized nodes, the one whose return to float shrinks the outputs' summed relative error most
    first."""
    total = sum(before.relative_error.values())
    gains = {}
    for node in quantizer.nodes:
        alone = measure(quantizer.quantize([node.name]))
        gains[node.name] = total - sum(alone.relative_error.values())
    return sorted(gains, key=lambda name: -gains[name])


def replace_budget(budget: AccuracyBudget, **changes: float | None) -> AccuracyBudget:
    """``budget`` with the given fields changed (None keeps a field)."""
    return dataclasses.replace(budget, **{k: v for k, v in changes.items() if v is not None})
