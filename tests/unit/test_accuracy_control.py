"""Accuracy control: a float model quantized by onnxruntime's quantizer and held to a budget on validation
samples, the operators that hurt it most returned to float one at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.model_builders import build_bottleneck, build_small_cnn
from tuner.entities import AccuracyBudget, TensorSpec
from tuner.jobs.quantizing import _evaluator
from tuner.quantization.accuracy_control import compare_outputs, control_accuracy
from tuner.quantization.calibration import synthetic_calibration
from tuner.quantization.onnx_quantizer import StaticQuantizer


def _quantized_weights(path: Path) -> set[str]:
    """The nodes of a QDQ model whose weight (second input) comes from a DequantizeLinear."""
    model = onnx.load(str(path))
    dequantized = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    return {
        n.name
        for n in model.graph.node
        if n.op_type in ("Conv", "Gemm", "MatMul") and n.input[1] in dequantized
    }


def test_a_classifier_within_budget_is_all_int8(tmp_path: Path) -> None:
    calibration = synthetic_calibration((TensorSpec("x", (4, 3, 32, 32), "float32"),), samples=16)
    quantizer = StaticQuantizer(build_small_cnn(batch=4), calibration.calibration, "minmax", tmp_path)
    path, report = control_accuracy(quantizer, calibration, AccuracyBudget(), _evaluator(calibration), ["y"])
    assert report.within_budget and report.returned == ()
    assert report.precision == {"conv1": "int8", "conv2": "int8", "conv3": "int8", "fc": "int8"}
    assert _quantized_weights(path) == {"conv1", "conv2", "conv3", "fc"}
    # The [batch, classes] output is judged by top-1, over the validation samples (8 runs x 4 batch rows).
    assert report.after.top1_changed is not None and report.after.top1_changed <= 0.01
    assert 0 < report.after.relative_error["y"] < 0.05
    assert not report.float_outputs  # held with the outputs rounded to 8 bits: the faster form kept


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy"])
def test_a_broken_budget_returns_the_worst_operators_to_float_until_it_holds(
    method: str, tmp_path: Path
) -> None:
    calibration = synthetic_calibration((TensorSpec("x", (1, 64, 16, 16), "float32"),), samples=16)
    quantizer = StaticQuantizer(build_bottleneck(), calibration.calibration, method, tmp_path)
    evaluate = _evaluator(calibration)
    floats = evaluate(quantizer.float_path)
    error = lambda path: compare_outputs(evaluate(path), floats, ["y"]).relative_error["y"]  # noqa: E731
    rounded = error(quantizer.quantize())  # the cores' outputs rounded to 8 bits: the faster form
    quantizer.float_outputs = True
    everything = error(quantizer.quantize())
    alone = {n.name: error(quantizer.quantize([n.name])) for n in quantizer.nodes}
    quantizer.float_outputs = False
    assert everything < rounded  # what leaving the outputs in float is for
    worst = min(alone, key=alone.__getitem__)  # the one whose return to float helps most

    # A budget the rounded outputs break and the float ones hold: float outputs, nothing returned.
    between = AccuracyBudget(max_relative_error=(everything + rounded) / 2)
    path, report = control_accuracy(quantizer, calibration, between, evaluate, ["y"])
    assert report.float_outputs and report.returned == () and report.within_budget
    assert report.before.relative_error["y"] == pytest.approx(rounded)
    assert report.after.relative_error["y"] == pytest.approx(everything)
    assert _quantized_weights(path) == {n.name for n in quantizer.nodes}

    # A budget the float outputs break too: the worst operator returns to float32.
    quantizer.float_outputs = False
    budget = AccuracyBudget(max_relative_error=(everything + alone[worst]) / 2)
    assert alone[worst] < budget.max_relative_error < everything
    path, report = control_accuracy(quantizer, calibration, budget, evaluate, ["y"])
    assert report.method == method and report.synthetic and report.float_outputs
    assert report.before.relative_error["y"] == pytest.approx(rounded)
    assert report.within_budget and report.after.relative_error["y"] <= budget.max_relative_error
    assert len(report.returned) == 1 and report.returned[0].startswith(f"{worst} (Conv ")
    assert report.precision[worst] == "float32"
    assert [n for n, p in report.precision.items() if p == "int8"] == [
        n.name for n in quantizer.nodes if n.name != worst
    ]
    assert _quantized_weights(path) == {n.name for n in quantizer.nodes} - {worst}

    # A budget nothing in int8 holds: every operator returns, and the float model is what remains.
    path, report = control_accuracy(
        quantizer, calibration, AccuracyBudget(max_relative_error=1e-9), evaluate, ["y"]
    )
    assert set(report.precision.values()) == {"float32"} and len(report.returned) == 3
    assert report.within_budget and report.after.relative_error["y"] == 0.0
    assert _quantized_weights(path) == set()


def test_unnamed_nodes_are_named_for_the_quantizer(tmp_path: Path) -> None:
    model = build_small_cnn(batch=1)
    for node in model.graph.node:
        node.name = ""
    calibration = synthetic_calibration((TensorSpec("x", (1, 3, 32, 32), "float32"),), samples=4)
    quantizer = StaticQuantizer(model, calibration.calibration, "minmax", tmp_path)
    names = [n.name for n in quantizer.nodes]
    assert len(names) == 4 and len(set(names)) == 4 and all(names)
    assert _quantized_weights(quantizer.quantize([names[0]])) == set(names[1:])
    out = _evaluator(calibration)(quantizer.quantize())
    assert np.isfinite(out[0][0]).all()


def test_class_scores_of_any_rank_are_judged_by_the_samples_whose_answer_changed(tmp_path: Path) -> None:
    """A softmax over the last axis makes an output class scores whatever its rank (a text recognizer's
    [batch, steps, characters]): judged by the share of samples any of whose steps changed its top-1 (its
    text may have), not by relative error."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((16, 12)).astype(np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["logits"], name="project"),
            helper.make_node("Softmax", ["logits"], ["y"], name="softmax", axis=-1),
        ],
        "steps",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 12])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    calibration = synthetic_calibration((TensorSpec("x", (1, 6, 16), "float32"),), samples=8)
    quantizer = StaticQuantizer(model, calibration.calibration, "minmax", tmp_path)
    assert quantizer.class_scores == {"y"}
    # A relative error budget nothing meets does not apply to class scores: the top-1 budget does.
    budget = AccuracyBudget(max_top1_changed=1.0, max_relative_error=1e-12)
    _, report = control_accuracy(quantizer, calibration, budget, _evaluator(calibration), ["y"])
    assert report.within_budget and report.returned == () and report.before.top1_changed is not None
    assert report.before.relative_error["y"] > 1e-12
    # One answer per validation sample, whatever its steps: the share moves in quarters.
    assert round(report.before.top1_changed * 4, 6) == int(round(report.before.top1_changed * 4))


def test_a_sample_changes_when_any_of_its_steps_does() -> None:
    floats = np.zeros((1, 4, 3))
    floats[..., 0] = 1.0
    quantized = floats.copy()
    quantized[0, 2] = [0.0, 2.0, 0.0]  # one step of the first sample reads another class
    metric = compare_outputs([[quantized], [floats]], [[floats], [floats]], ["y"], [True])
    assert metric.top1_changed == 0.5  # 1 of 2 samples, though only 1 of 8 steps


def test_a_model_before_opset_13_is_converted_for_per_channel_weights(tmp_path: Path) -> None:
    """paddle2onnx exports at opset 11 or 12, where DequantizeLinear has no axis: onnxruntime's quantizer
    writes one anyway (an invalid model) unless the model is converted to opset 13 first."""
    model = build_small_cnn(batch=1)
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = 11
    calibration = synthetic_calibration((TensorSpec("x", (1, 3, 32, 32), "float32"),), samples=4)
    quantizer = StaticQuantizer(model, calibration.calibration, "minmax", tmp_path)
    path = quantizer.quantize()
    assert max(o.version for o in onnx.load(str(path)).opset_import if o.domain in ("", "ai.onnx")) >= 13
    assert np.isfinite(_evaluator(calibration)(path)[0][0]).all()


def test_on_a_bf16_cpu_operators_return_to_bf16_first_and_to_float32_when_bf16_breaks_the_budget(
    tmp_path: Path,
) -> None:
    calibration = synthetic_calibration((TensorSpec("x", (1, 64, 16, 16), "float32"),), samples=16)
    quantizer = StaticQuantizer(build_bottleneck(), calibration.calibration, "minmax", tmp_path)
    evaluate = _evaluator(calibration)
    floats = evaluate(quantizer.float_path)
    error = lambda path: compare_outputs(evaluate(path), floats, ["y"]).relative_error["y"]  # noqa: E731
    quantizer.float_outputs = True
    everything = error(quantizer.quantize())
    names = [n.name for n in quantizer.nodes]
    alone = {name: error(quantizer.quantize([name])) for name in names}
    worst = min(alone, key=alone.__getitem__)
    worst_in_bf16 = error(quantizer.quantize([worst], bf16=True))
    all_in_bf16 = error(quantizer.quantize(names, bf16=True))
    quantizer.float_outputs = False
    assert alone[worst] < worst_in_bf16 < everything  # bf16 rounds the operands: a little worse
    assert all_in_bf16 > 0

    # A budget the worst operator holds in bf16: it returns to bf16, its operands rounded in the model.
    budget = AccuracyBudget(max_relative_error=(worst_in_bf16 + everything) / 2)
    path, report = control_accuracy(quantizer, calibration, budget, evaluate, ["y"], bf16=True)
    assert report.within_budget and report.returned_precision == "bf16"
    assert report.after.relative_error["y"] == pytest.approx(worst_in_bf16)
    assert len(report.returned) == 1 and report.precision[worst] == "bf16"
    assert _quantized_weights(path) == set(names) - {worst}
    casts = [n for n in onnx.load(str(path)).graph.node if n.op_type == "Cast"]
    assert len(casts) == 4  # the worst operator's data and weight, each to bf16 and back

    # A budget no mix of int8 and bf16 holds: the operators return to float32 instead.
    quantizer.float_outputs = False
    strict = AccuracyBudget(max_relative_error=all_in_bf16 / 2)
    path, report = control_accuracy(quantizer, calibration, strict, evaluate, ["y"], bf16=True)
    assert report.within_budget and report.returned_precision == "float32"
    assert set(report.precision.values()) == {"float32"} and report.after.relative_error["y"] == 0.0
    assert not any(n.op_type == "Cast" for n in onnx.load(str(path)).graph.node)


def test_int8_is_chosen_only_where_it_is_faster_by_more_than_the_margin() -> None:
    from tuner.entities import CoreSpeed

    assert CoreSpeed("a", 1.0, "float32", 2.0).chosen == "int8"
    assert CoreSpeed("b", 0.97, "float32", 1.0).chosen == "float32"  # within the noise: the accurate one
    assert CoreSpeed("c", 2.0, "bf16", 1.0).chosen == "bf16"
    speed = CoreSpeed("d", 0.5, "bf16", 1.5)
    assert CoreSpeed.from_dict(speed.to_dict()) == speed and speed.to_dict()["chosen"] == "int8"


def test_operators_no_faster_in_int8_return_only_while_the_budget_holds(tmp_path: Path) -> None:
    """The decision on timings (given here: the timing itself is tested on real kernels in
    tests/integration/test_int8_pipeline.py)."""
    from tuner.entities import CoreSpeed

    calibration = synthetic_calibration((TensorSpec("x", (4, 3, 32, 32), "float32"),), samples=16)
    quantizer = StaticQuantizer(build_small_cnn(batch=4), calibration.calibration, "minmax", tmp_path)
    seen: list[tuple[list[str], str]] = []

    def fc_slower(qdq: Path, floats: Path, names: list[str], other: str) -> tuple[list[CoreSpeed], str]:
        seen.append((names, other))
        return [CoreSpeed(n, 2.0 if n == "fc" else 1.0, other, 1.5) for n in names], ""

    evaluate = _evaluator(calibration)
    path, report = control_accuracy(
        quantizer, calibration, AccuracyBudget(), evaluate, ["y"], timer=fc_slower
    )
    assert seen == [(["conv1", "conv2", "conv3", "fc"], "float32")]
    assert report.precision == {"conv1": "int8", "conv2": "int8", "conv3": "int8", "fc": "float32"}
    assert report.returned == () and report.returned_for_speed == (
        next(n.describe() for n in quantizer.nodes if n.name == "fc"),
    )
    assert _quantized_weights(path) == {"conv1", "conv2", "conv3"} and report.within_budget
    assert len(report.speeds) == 4 and report.speed_note == ""
