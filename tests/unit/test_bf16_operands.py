"""Operators returned from int8 to bf16: their operands rounded to bf16 in the ONNX model (Cast pairs, as
onnxruntime runs them), and Kiln reading such a round trip as bf16 operands with float32 accumulation."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from kiln_tvm import tvm
from tests.model_builders import build_small_cnn
from tuner.compile import LoadedModel, build_untuned
from tuner.frontend import load_model
from tuner.passes.plan import plan_graph
from tuner.quantization.bf16_operands import with_bf16_operands
from tuner.targets import host_target, to_tvm_target

CORES = {"conv1", "conv2", "conv3", "fc"}  # build_small_cnn's convolutions and matmul


def _bf16(values: np.ndarray) -> np.ndarray:
    """``values`` rounded to bf16 (to nearest, ties to even) and widened back."""
    return values.astype(ml_dtypes.bfloat16).astype(np.float32)


def _as_written(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)[0]


def _matmul_model(weight: np.ndarray) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")],
        "fc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, weight.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, weight.shape[1]])],
        [numpy_helper.from_array(weight, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_returned_operator_multiplies_bf16_rounded_operands_in_float32() -> None:
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((64, 8)).astype(np.float32)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    model = with_bf16_operands(_matmul_model(weight), {"fc"})
    onnx.checker.check_model(model)
    y = _as_written(model, {"x": x})
    np.testing.assert_allclose(y, _bf16(x) @ _bf16(weight), rtol=1e-5, atol=1e-5)
    assert np.abs(y - x @ weight).max() > 1e-3  # the rounding is really there
    with pytest.raises(KeyError, match="conv9"):
        with_bf16_operands(_matmul_model(weight), {"conv9"})


def _cnn_in_bf16(tmp_path: Path) -> tuple[Path, onnx.ModelProto]:
    float_model = build_small_cnn(batch=1)
    path = tmp_path / "cnn_bf16.onnx"
    onnx.save(with_bf16_operands(float_model, CORES), path)
    return path, float_model


def test_kiln_computes_a_models_bf16_round_trips_on_bf16_operands_as_onnxruntime_does(tmp_path: Path) -> None:
    path, float_model = _cnn_in_bf16(tmp_path)
    imported = load_model(path)
    target = to_tvm_target(host_target())
    plan = plan_graph(imported.mod, target)
    assert len(plan.fusion.reduced_ops) == len(CORES)
    assert all(op.endswith("-> bf16 (rounded so by the model)") for op in plan.fusion.reduced_ops)
    assert plan.fusion.precision_compute in ("native", "mixed", "emulated")
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
    (tuned,) = LoadedModel(build_untuned(plan.prepared, target)).run([x])
    expected = _as_written(onnx.load(str(path)), {"x": x})
    np.testing.assert_allclose(tuned, expected, rtol=1e-5, atol=1e-5)
    # ... which is not the float32 model: the products are on bf16 values.
    assert np.abs(expected - _as_written(float_model, {"x": x})).max() > 1e-4


def test_a_weight_bf16_cannot_hold_exactly_keeps_its_matmul_in_float32() -> None:
    rng = np.random.default_rng(2)
    weight = rng.standard_normal((64, 8)).astype(np.float32)
    model = _matmul_model(weight)
    # Only the data is rounded: the weight's values need float32, so the product stays float32.
    cast = [
        helper.make_node("Cast", ["x"], ["x_bf16"], to=TensorProto.BFLOAT16),
        helper.make_node("Cast", ["x_bf16"], ["x_wide"], to=TensorProto.FLOAT),
    ]
    model.graph.node[0].input[0] = "x_wide"
    model.graph.node.insert(0, cast[1])
    model.graph.node.insert(0, cast[0])
    mod = tvm.relax.frontend.onnx.from_onnx(model, keep_params_in_input=False)
    assert plan_graph(mod, to_tvm_target(host_target())).fusion.reduced_ops == []


@pytest.mark.parametrize("mcpu", ["sapphirerapids", "znver4"])
def test_on_a_bf16_cpu_the_round_trips_go_on_its_bf16_instructions(mcpu: str, tmp_path: Path) -> None:
    """Build-only (planned for that CPU): AMX-BF16 tiles on Sapphire Rapids, vdpbf16ps on Zen 4."""
    path, _ = _cnn_in_bf16(tmp_path)
    target = to_tvm_target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    fusion = plan_graph(load_model(path).mod, target).fusion
    native = [*fusion.amx_bf16_matmuls, *fusion.avx512_bf16_matmuls, *fusion.avx512_bf16_convolutions]
    assert native, fusion.bf16_unpacked
    assert fusion.precision_compute in ("native", "mixed"), fusion.precision_note
    if mcpu == "znver4":  # no AMX there
        assert fusion.amx_bf16_matmuls == [] and fusion.avx512_bf16_convolutions
