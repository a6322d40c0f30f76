"""QOperator and dynamically quantized ONNX models import, and compute what onnxruntime computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime import quantization

from tests.artifacts import onnxruntime_output
from tests.model_builders import _model, build_mlp, build_small_cnn
from tuner.compile import LoadedModel, build_untuned
from tuner.frontend import load_model
from tuner.frontend.onnx_qoperator import qoperator_to_qdq
from tuner.passes.plan import GraphPlan, plan_graph
from tuner.targets import host_target, to_tvm_target

TARGET = to_tvm_target(host_target())


class _Calibration(quantization.CalibrationDataReader):
    def __init__(self, name: str, shape: list[int]) -> None:
        rng = np.random.default_rng(0)
        self.batches = iter([{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(8)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.batches, None)


def _input_shape(model: onnx.ModelProto) -> list[int]:
    return [d.dim_value or 1 for d in model.graph.input[0].type.tensor_type.shape.dim]


def _quantized(model: onnx.ModelProto, tmp_path: Path, how: str) -> Path:
    source, out = tmp_path / "float.onnx", tmp_path / f"{how}.onnx"
    onnx.save(model, source)
    if how == "dynamic":
        # onnxruntime's ConvInteger kernel takes unsigned weights
        quantization.quantize_dynamic(
            str(source),
            str(out),
            op_types_to_quantize=["Conv", "MatMul", "Gemm"],
            weight_type=quantization.QuantType.QUInt8,
        )
    else:
        reader = _Calibration(model.graph.input[0].name, _input_shape(model))
        quantization.quantize_static(
            str(source), str(out), reader, quant_format=quantization.QuantFormat.QOperator, per_channel=True
        )
    return out


def _check_against_onnxruntime(path: Path, steps: float) -> GraphPlan:
    model = onnx.load(path)
    plan = plan_graph(load_model(path).mod, TARGET)
    loaded = LoadedModel(build_untuned(plan.prepared, TARGET))
    for seed in range(6):
        x = np.random.default_rng(seed).standard_normal(_input_shape(model)).astype(np.float32)
        np.testing.assert_allclose(loaded.run([x])[0], onnxruntime_output(path, x), rtol=0, atol=steps)
    return plan


def _output_step(path: Path) -> float:
    """The scale of the last DequantizeLinear (the QOperator models' float output)."""
    model = onnx.load(path)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    last = [n for n in model.graph.node if n.op_type == "DequantizeLinear"][-1]
    return float(inits[last.input[1]])


@pytest.mark.parametrize("builder", [build_mlp, build_small_cnn], ids=["mlp-qgemm", "cnn-qlinearconv"])
def test_qoperator_models_are_rewritten_to_qdq_and_computed_in_integers(builder, tmp_path: Path) -> None:
    path = _quantized(builder(), tmp_path, "qoperator")
    ops = {n.op_type for n in onnx.load(path).graph.node}
    assert ops & {"QLinearConv", "QGemm", "QLinearMatMul"}
    plan = _check_against_onnxruntime(path, 1.001 * _output_step(path))
    assert plan.fusion.integer_ops and not plan.fusion.kept_float


def test_qlinear_matmul_with_per_column_weight_scales(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array(np.float32(0.02), "xs"),
        numpy_helper.from_array(np.uint8(128), "xz"),
        numpy_helper.from_array(rng.integers(-127, 128, (16, 8)).astype(np.int8), "w"),
        numpy_helper.from_array((0.01 + 0.01 * rng.random(8)).astype(np.float32), "ws"),
        numpy_helper.from_array(np.zeros(8, np.int8), "wz"),
        numpy_helper.from_array(np.float32(0.1), "ys"),
        numpy_helper.from_array(np.uint8(120), "yz"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("QLinearMatMul", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qlinearmatmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        initializer=inits,
    )
    model = _model(graph, opset=13)
    path = tmp_path / "qlinearmatmul.onnx"
    onnx.save(model, path)
    rewritten, count = qoperator_to_qdq(model)
    assert count == 1 and "QLinearMatMul" not in {n.op_type for n in rewritten.graph.node}
    # ONNX's semantics, in NumPy: the integer product, requantized per output column. onnxruntime's own
    # QLinearMatMul is held to them only where it meets them: on a CPU without VNNI its u8 x s8 kernel
    # saturates (a step and more off here, on a Zen 3).
    x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero = (numpy_helper.to_array(i) for i in inits)
    plan = plan_graph(load_model(path).mod, TARGET)
    loaded = LoadedModel(build_untuned(plan.prepared, TARGET))
    step = 1.001 * float(y_scale)
    for seed in range(6):
        x = np.random.default_rng(seed).standard_normal((4, 16)).astype(np.float32)
        xq = np.clip(np.rint(x / x_scale) + int(x_zero), 0, 255).astype(np.int32)
        product = (xq - int(x_zero)) @ (w.astype(np.int32) - w_zero.astype(np.int32))
        yq = np.clip(np.rint(product * (x_scale * w_scale / y_scale)) + int(y_zero), 0, 255)
        expected = ((yq - int(y_zero)) * y_scale).astype(np.float32)
        got = loaded.run([x])[0]
        np.testing.assert_allclose(got, expected, rtol=0, atol=step)
        ort = onnxruntime_output(path, x)
        if np.abs(ort - expected).max() <= step:
            np.testing.assert_allclose(got, ort, rtol=0, atol=step)
    assert plan.fusion.integer_ops == ["matmul 4x16 @ 16x8 -> uint8"]


def test_dynamically_quantized_models_import_and_match(tmp_path: Path) -> None:
    # DynamicQuantizeLinear + MatMulInteger (the MLP) and ConvInteger (the CNN): integer products
    # with scales computed at run time.
    for builder, integer_op in ((build_mlp, "MatMulInteger"), (build_small_cnn, "ConvInteger")):
        path = _quantized(builder(), tmp_path, "dynamic")
        ops = {n.op_type for n in onnx.load(path).graph.node}
        assert {"DynamicQuantizeLinear", integer_op} <= ops
        _check_against_onnxruntime(path, 1e-4)


def test_models_without_qoperator_nodes_are_left_alone() -> None:
    model = build_mlp()
    same, count = qoperator_to_qdq(model)
    assert count == 0 and same is model
