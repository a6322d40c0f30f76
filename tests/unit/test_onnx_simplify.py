"""ONNX models whose shapes, axes and pads are computed in the graph, and models of old opsets: imported
after their constants are folded (and their opset converted), with the values onnxruntime computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.onnx_import import assert_outputs_match, untuned_outputs
from tuner.compile import LoadedModel, build_untuned
from tuner.errors import InvalidModel, UnsupportedOperator
from tuner.frontend import load_model
from tuner.frontend.onnx_simplify import has_foldable_values, simplify
from tuner.targets import host_target, to_tvm_target

TARGET = to_tvm_target(host_target())


def _model(nodes: list[onnx.NodeProto], inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset >= 9 else 3
    onnx.checker.check_model(model)
    return model


def _check_against_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert_outputs_match(untuned_outputs(path, feeds), expected, rtol=1e-5, atol=1e-6)


def _flatten_by_shape() -> onnx.ModelProto:
    """``x`` [2, 3, 4, 5] reshaped to [2, 60] with the shape computed as exporters write it:
    ``Shape -> Gather(0) -> Unsqueeze -> Concat([-1]) -> Reshape``, then a TF-style ``Pad`` whose pads
    are computed from the shape too."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 4, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "m"])
    inits = [
        numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
        numpy_helper.from_array(np.array([0], dtype=np.int64), "axis0"),
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus_one"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "one"),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "axis0"], ["batch_1d"]),
        helper.make_node("Concat", ["batch_1d", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        # pads [0, 0, 0, batch - 1]: the end of the last axis padded by a computed amount
        helper.make_node("Sub", ["batch_1d", "one"], ["pad_end"]),
        helper.make_node("Concat", ["axis0", "axis0", "axis0", "pad_end"], ["pads"], axis=0),
        helper.make_node("Pad", ["flat", "pads"], ["y"]),
    ]
    return _model(nodes, [x], [y], inits)


def test_a_shape_subgraph_is_folded_into_constants(tmp_path: Path) -> None:
    model = _flatten_by_shape()
    assert has_foldable_values(model)
    simplified = simplify(model, {"x": (2, 3, 4, 5)})
    assert simplified.folded
    assert {n.op_type for n in simplified.model.graph.node} == {"Reshape", "Pad"}
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    _check_against_onnxruntime(model, {"x": x}, tmp_path)


@pytest.mark.parametrize("axes_from", ["initializer", "computed"])
def test_reduce_sum_with_axes_as_an_input_of_the_node(axes_from: str, tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])
    if axes_from == "initializer":
        inits = [numpy_helper.from_array(np.array([1, 2], dtype=np.int64), "axes")]
        nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)]
    else:  # axes = Range(1, rank(x)): every axis but the first, computed from the shape
        inits = [
            numpy_helper.from_array(np.array(1, dtype=np.int64), "start"),
            numpy_helper.from_array(np.array(1, dtype=np.int64), "step"),
        ]
        nodes = [
            helper.make_node("Shape", ["x"], ["shape"]),
            helper.make_node("Size", ["shape"], ["rank"]),
            helper.make_node("Range", ["start", "rank", "step"], ["axes"]),
            helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0),
        ]
    model = _model(nodes, [x], [y], inits, opset=13)
    x_value = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    _check_against_onnxruntime(model, {"x": x_value}, tmp_path)


def test_a_model_of_an_old_opset_is_converted(tmp_path: Path) -> None:
    """Opset 9: Slice takes its starts and ends as attributes and Upsample its scales as an input, forms
    TVM's importer reads wrongly or not at all; converted to opset 17 first, both compute as onnxruntime."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b", "c", "d"])
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], dtype=np.float32), "scales")
    nodes = [
        helper.make_node("Slice", ["x"], ["s"], starts=[1, 2], ends=[3, 5], axes=[2, 3]),
        helper.make_node("Upsample", ["s", "scales"], ["y"], mode="nearest"),
    ]
    model = _model(nodes, [x], [y], [scales], opset=9)
    x_value = np.random.default_rng(2).standard_normal((1, 2, 4, 6)).astype(np.float32)
    _check_against_onnxruntime(model, {"x": x_value}, tmp_path)


def test_a_model_that_does_not_convert_says_so(tmp_path: Path) -> None:
    # Opset 7's Upsample without its required scales: ONNX's converter cannot bring it forward.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b", "c", "d"])
    model = helper.make_model(
        helper.make_graph([helper.make_node("Upsample", ["x"], ["y"])], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 7)],
    )
    model.ir_version = 3
    path = tmp_path / "old.onnx"
    onnx.save(model, path)
    with pytest.raises(
        InvalidModel,
        match=r"uses ONNX opset 7; Kiln converts models older than opset 11 to opset 17 .*failed: .*scales",
    ):
        load_model(path)


def test_a_model_onnxruntime_cannot_load_is_converted_as_it_is() -> None:
    """Folding is best effort: a model onnxruntime refuses goes to TVM's importer unfolded."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("NotAnOperator", ["r"], ["y"], domain="kiln.test"),
    ]
    graph = helper.make_graph(nodes, "g", [x], [y])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("kiln.test", 1)]
    )
    simplified = simplify(model, {"x": (2, 3)})
    assert not simplified.folded and simplified.skipped_reason
    assert [n.op_type for n in simplified.model.graph.node] == ["Shape", "Reshape", "NotAnOperator"]


def test_an_optional_tensor_input_and_an_empty_input_are_fed_as_tensors(tmp_path: Path) -> None:
    """An input typed ``optional(tensor)`` is that tensor when fed; a declared size of 0 is an empty
    tensor (CastLike's model of the target type), not a missing size."""
    optional = helper.make_value_info(
        "maybe", helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [3]))
    )
    like = helper.make_tensor_value_info("like", TensorProto.DOUBLE, [0])
    y = helper.make_tensor_value_info("y", TensorProto.DOUBLE, [3])
    nodes = [
        helper.make_node("OptionalGetElement", ["maybe"], ["x"]),
        helper.make_node("CastLike", ["x", "like"], ["y"]),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [optional, like], [y]), opset_imports=[helper.make_opsetid("", 18)]
    )
    model.ir_version = 8
    path = tmp_path / "optional.onnx"
    onnx.save(model, path)
    imported = load_model(path)
    assert [(s.name, s.shape, s.dtype) for s in imported.signature.inputs] == [
        ("maybe", (3,), "float32"),
        ("like", (0,), "float64"),
    ]
    x = np.array([1.5, -2.0, 3.25], dtype=np.float32)
    (got,) = LoadedModel(build_untuned(imported.mod, TARGET)).run([x, np.zeros((0,), dtype=np.float64)])
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, x.astype(np.float64))


def test_a_training_operator_is_refused_as_such(tmp_path: Path) -> None:
    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, [2, 5])
    labels = helper.make_tensor_value_info("labels", TensorProto.INT64, [2])
    loss = helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])
    node = helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss"])
    model = helper.make_model(
        helper.make_graph([node], "g", [scores, labels], [loss]), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    path = tmp_path / "loss.onnx"
    onnx.save(model, path)
    with pytest.raises(UnsupportedOperator) as caught:
        load_model(path)
    assert caught.value.message == (
        "operator 'SoftmaxCrossEntropyLoss' is not supported by the ONNX importer; SoftmaxCrossEntropyLoss is a "
        "training operator: Kiln compiles models for inference, so export the model without its training graph"
    )
