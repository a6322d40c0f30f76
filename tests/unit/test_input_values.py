"""Inputs bound to values at registration (``--input-value``, an upload's ``input_values``): a graph that
takes its shape, axes and k as inputs compiles with them as constants, and computes what onnxruntime
computes when it is fed the same values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tests.model_builders import PARAMETER_VALUES, parameterized_onnx
from tests.onnx_import import assert_outputs_match
from tuner.compile import LoadedModel, build_untuned
from tuner.entities import TensorSpec
from tuner.errors import InvalidSpec, KilnError
from tuner.frontend import load_model, parse_input_values
from tuner.frontend.input_values import MAX_BOUND_ELEMENTS, bound_array, parse_input_values_json
from tuner.targets import host_target, to_tvm_target


def test_bound_inputs_become_constants_and_the_model_computes_what_onnxruntime_does(tmp_path: Path) -> None:
    path = parameterized_onnx(tmp_path / "model.onnx")
    with pytest.raises(KilnError):  # at run time, these parameters are beyond the importer
        load_model(path)

    imported = load_model(path, input_values=PARAMETER_VALUES)
    assert [t.name for t in imported.signature.inputs] == ["x"]
    assert {b.name: (b.dtype, b.shape, b.values) for b in imported.signature.bound_inputs} == {
        "shape": ("int64", (2,), [6, -1]),
        "axes": ("int64", (1,), [1]),
        "k": ("int64", (1,), [2]),
    }
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    feeds = {"x": x, **{name: np.array(v, dtype=np.int64) for name, v in PARAMETER_VALUES.items()}}
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["y"], feeds)
    got = LoadedModel(build_untuned(imported.mod, to_tvm_target(host_target()))).run([x])
    assert_outputs_match(got, expected, rtol=1e-5, atol=1e-5)

    # What Kiln stores is the model with the values as constants: onnxruntime runs it on x alone.
    stored = ort.InferenceSession(imported.canonical_bytes, providers=["CPUExecutionProvider"])
    assert [i.name for i in stored.get_inputs()] == ["x"]
    assert_outputs_match(stored.run(["y"], {"x": x}), expected, rtol=1e-6, atol=1e-6)
    # Other values are another model.
    assert load_model(path, input_values={**PARAMETER_VALUES, "k": [1]}).sha256 != imported.sha256


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"nope": [1]}, "does not take"),
        ({"shape": [6, -1, 1]}, "dimension 0 must be 2"),
        ({"shape": [[6, -1]]}, "rank 1"),
        ({"axes": [1.5]}, "not integers"),
        ({"axes": ["one"]}, "numbers"),
        ({"shape": [6, [1]]}, "rectangular"),
    ],
)
def test_a_value_that_does_not_fit_its_input_is_refused(values: dict, message: str, tmp_path: Path) -> None:
    path = parameterized_onnx(tmp_path / "model.onnx")
    with pytest.raises(InvalidSpec, match=message):
        load_model(path, input_values={**PARAMETER_VALUES, **values})


def test_bound_values_are_parameters_not_weights() -> None:
    spec = TensorSpec("w", (MAX_BOUND_ELEMENTS + 1,), "float32")
    with pytest.raises(InvalidSpec, match="a weight belongs in the model"):
        bound_array(spec, [0.0] * (MAX_BOUND_ELEMENTS + 1))
    with pytest.raises(InvalidSpec, match="finite"):
        bound_array(TensorSpec("s", (1,), "float32"), [float("nan")])
    with pytest.raises(InvalidSpec, match="numeric inputs only"):
        bound_array(TensorSpec("s", (1,), "string"), ["a"])
    assert bound_array(TensorSpec("s", ("n",), "float32"), [0.5, 2]).tolist() == [0.5, 2.0]
    assert bound_array(TensorSpec("k", (), "int64"), 3).shape == ()
    assert str(bound_array(TensorSpec("start", (), "bfloat16"), 1.5).dtype) == "bfloat16"


def test_input_values_are_parsed_from_the_command_line_and_a_form() -> None:
    assert parse_input_values(["axes=[0, 1]", "k=3", "scales=[1.0,2.5]"]) == {
        "axes": [0, 1],
        "k": 3,
        "scales": [1.0, 2.5],
    }
    for bad in ("axes", "axes=", "=1", "axes=[0,"):
        with pytest.raises(InvalidSpec, match="--input-value"):
            parse_input_values([bad])
    with pytest.raises(InvalidSpec, match="twice"):
        parse_input_values(["k=1", "k=2"])
    assert parse_input_values_json('{"k": 3}') == {"k": 3}
    assert parse_input_values_json("  ") is None
    for bad in ("[1]", "{"):
        with pytest.raises(InvalidSpec, match="input_values"):
            parse_input_values_json(bad)


def test_a_torch_program_takes_no_input_values(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from tests.model_builders import save_torch_program

    path = save_torch_program(torch.nn.ReLU(), (torch.ones(2, 3),), tmp_path / "relu.pt2")
    with pytest.raises(InvalidSpec, match="binds inputs of ONNX models"):
        load_model(path, input_values={"x": [1.0]})
