"""ONNX ``Loop`` of a trip count computed from a shape, and ``Scan``, written out before conversion: the
values onnxruntime computes; a ``Loop`` whose condition the body computes is refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.onnx_import import assert_outputs_match, untuned_outputs
from tuner.errors import UnsupportedOperator
from tuner.frontend import load_model


def _model(nodes: list[onnx.NodeProto], inputs, outputs, inits=()) -> onnx.ModelProto:
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _running_sum_loop(condition_from_body: bool) -> onnx.ModelProto:
    """``for i in range(x.shape[0]): acc = acc * 0.5 + x[i]``, the trip count ``Shape(x)[0]``; the partial
    sums are the scan output. With ``condition_from_body`` the body computes its condition (a while loop)."""
    cond_out = (
        helper.make_node("Less", ["acc_sum", "limit"], ["cond_out"])
        if condition_from_body
        else helper.make_node("Identity", ["cond_in"], ["cond_out"])
    )
    body = helper.make_graph(
        [
            helper.make_node("Gather", ["x", "i"], ["row"], axis=0),
            helper.make_node("Mul", ["acc_in", "half"], ["decayed"]),
            helper.make_node("Add", ["decayed", "row"], ["acc_out"]),
            helper.make_node("ReduceSum", ["acc_out"], ["acc_sum"], keepdims=0),
            cond_out,
            helper.make_node("Identity", ["acc_out"], ["partial"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [4]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("partial", TensorProto.FLOAT, [4]),
        ],
    )
    inits = [
        numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
        numpy_helper.from_array(np.array(True), "true"),
        numpy_helper.from_array(np.zeros(4, dtype=np.float32), "acc0"),
        numpy_helper.from_array(np.array(0.5, dtype=np.float32), "half"),
        numpy_helper.from_array(np.array(1e9, dtype=np.float32), "limit"),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["trips"], axis=0),
        helper.make_node("Loop", ["trips", "true", "acc0"], ["acc", "partials"], body=body),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    outputs = [
        helper.make_tensor_value_info("acc", TensorProto.FLOAT, [4]),
        helper.make_tensor_value_info("partials", TensorProto.FLOAT, ["n", 4]),
    ]
    return _model(nodes, [x], outputs, inits)


def test_a_loop_over_a_shape_is_written_out(tmp_path: Path) -> None:
    path = tmp_path / "loop.onnx"
    onnx.save(_running_sum_loop(condition_from_body=False), path)
    feeds = {"x": np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)}
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert_outputs_match(untuned_outputs(path, feeds), expected, rtol=1e-5, atol=1e-6)


def test_a_while_loop_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "while.onnx"
    onnx.save(_running_sum_loop(condition_from_body=True), path)
    with pytest.raises(
        UnsupportedOperator, match=r"operator 'Loop' is not supported .*Kiln writes out a Scan"
    ):
        load_model(path, {"x": (5, 4)})


@pytest.mark.parametrize("reverse", [0, 1])
def test_a_scan_is_written_out(reverse: int, tmp_path: Path) -> None:
    """A running maximum over the rows of ``x`` [6, 3] (forward or backward) with the rows it saw."""
    body = helper.make_graph(
        [
            helper.make_node("Max", ["best_in", "row"], ["best_out"]),
            helper.make_node("Mul", ["row", "two"], ["doubled"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("best_in", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("row", TensorProto.FLOAT, [3]),
        ],
        [
            helper.make_tensor_value_info("best_out", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("doubled", TensorProto.FLOAT, [3]),
        ],
        [numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")],
    )
    scan = helper.make_node(
        "Scan",
        ["start", "x"],
        ["best", "rows"],
        body=body,
        num_scan_inputs=1,
        scan_input_directions=[reverse],
        scan_output_axes=[1],
    )
    model = _model(
        [scan],
        [
            helper.make_tensor_value_info("start", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 3]),
        ],
        [
            helper.make_tensor_value_info("best", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("rows", TensorProto.FLOAT, [3, 6]),
        ],
    )
    path = tmp_path / "scan.onnx"
    onnx.save(model, path)
    rng = np.random.default_rng(1)
    feeds = {
        "start": np.full(3, -10.0, dtype=np.float32),
        "x": rng.standard_normal((6, 3)).astype(np.float32),
    }
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert_outputs_match(untuned_outputs(path, feeds), expected, rtol=1e-6, atol=1e-6)
