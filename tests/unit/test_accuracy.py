"""The accuracy report of a quantized model's outputs: steps off, share beyond one step, cosine; and the
verification failing beyond one step."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.entities import AccuracyReport
from tuner.errors import VerificationFailed
from tuner.timing.accuracy import accuracy_report, require_accuracy, top1_agreement, with_top1


def test_differences_are_counted_in_steps_and_one_step_passes() -> None:
    step = 0.5
    expected = [[np.arange(8, dtype=np.float32) * step, np.ones(3, np.float32)] for _ in range(2)]
    actual = [[e[0].copy(), e[1] + 1e-3] for e in expected]
    actual[1][0][3] += step  # one element, one step off: a tie rounded the other way
    report = accuracy_report(actual, expected, ["y", "logits"], [step, None], reference="onnxruntime")
    y, logits = report.outputs
    assert report.inputs == 2 and report.reference == "onnxruntime"
    assert y.max_steps == pytest.approx(1.0) and y.beyond_one_step == 0.0
    assert 0.99 < y.cosine <= 1.0
    assert (
        logits.step is None and logits.max_steps is None and logits.max_abs == pytest.approx(1e-3, rel=1e-3)
    )
    require_accuracy(report)
    assert AccuracyReport.from_dict(report.to_dict()) == report


def test_more_than_one_step_fails_verification_naming_the_output() -> None:
    expected = [[np.zeros(4, np.float32)]]
    actual = [[np.array([0.0, 0.0, 0.2, 0.0], np.float32)]]
    report = accuracy_report(actual, expected, ["y"], [0.1], reference="onnxruntime")
    assert report.outputs[0].max_steps == pytest.approx(2.0)
    assert report.outputs[0].beyond_one_step == pytest.approx(0.25)
    with pytest.raises(VerificationFailed, match=r"y: up to 2\.0 steps off, 25\.00% of its elements"):
        require_accuracy(report)


def test_a_chain_of_quantized_layers_may_carry_a_step_from_each() -> None:
    """A tie rounded the other way in one layer is carried through the layers after it: a chain of L
    quantized layers may be L steps off at its output, not more (a wrong kernel is off by hundreds)."""
    expected = [[np.zeros(4, np.float32)]]
    actual = [[np.array([0.0, 0.3, 0.2, 0.0], np.float32)]]
    report = accuracy_report(actual, expected, ["y"], [0.1], reference="onnxruntime", chained_layers=3)
    assert report.allowed_steps == 3.0 and report.outputs[0].max_steps == pytest.approx(3.0)
    require_accuracy(report)
    assert AccuracyReport.from_dict(report.to_dict()) == report
    actual[0][0][0] = 0.4
    report = accuracy_report(actual, expected, ["y"], [0.1], reference="onnxruntime", chained_layers=3)
    with pytest.raises(
        VerificationFailed, match=r"more than 3 quantization step\(s\) \(one per quantized layer"
    ):
        require_accuracy(report)


def test_top1_agreement_counts_rows_whose_arg_max_matches_the_float_model() -> None:
    floats = [np.array([[0.1, 0.9], [0.8, 0.2]]), np.array([[0.3, 0.7], [0.6, 0.4]])]
    actual = [np.array([[0.2, 0.8], [0.1, 0.9]]), np.array([[0.4, 0.6], [0.7, 0.3]])]  # 3 of 4 agree
    assert top1_agreement(actual, floats) == 0.75
    assert top1_agreement([np.array(1.0)], [np.array(2.0)]) is None  # no class axis
    report = accuracy_report(
        [[a] for a in actual], [[a] for a in actual], ["y"], [None], reference="onnxruntime"
    )
    marked = with_top1(report, [[a] for a in actual], [[f] for f in floats], "mlp.onnx")
    assert marked.float_model == "mlp.onnx" and marked.outputs[0].top1_agreement == 0.75
    assert AccuracyReport.from_dict(marked.to_dict()) == marked


def test_a_quantized_models_float_outputs_are_held_norm_wise() -> None:
    """Float outputs of a quantized model (after a float layer norm) carry the ties flipped upstream: held
    to a norm-wise relative error of 16 unit roundoffs of 8 bits, not element-wise; a wrong kernel fails."""
    from tuner.timing.verify import QUANTIZED_FLOAT_TOLERANCE, compare_outputs

    expected = [np.linspace(-1.0, 1.0, 1000)]
    drifted = [expected[0] + np.random.default_rng(0).normal(0, 0.01, 1000)]  # ~1.7 % norm-wise
    assert not compare_outputs(drifted, expected, "r", 1e-3, 1e-4).ok
    assert compare_outputs(drifted, expected, "r", 1e-3, 1e-4, norm_wise=[QUANTIZED_FLOAT_TOLERANCE]).ok
    wrong = [expected[0][::-1].copy()]
    assert not compare_outputs(wrong, expected, "r", 1e-3, 1e-4, norm_wise=[QUANTIZED_FLOAT_TOLERANCE]).ok
