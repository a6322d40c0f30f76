"""QDQ convolutions and matmuls lowered to integer arithmetic match onnxruntime to within one step."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest

from kiln_tvm import relax
from schedules.vnni import has_packed_block, integer_dot
from tests.quant_models import QuantSpec, build_qdq_net, plan_and_compare, reference_output
from tuner.compile import LoadedModel, build_untuned
from tuner.frontend import load_model
from tuner.passes.plan import GraphPlan, plan_graph
from tuner.targets import host_target, to_tvm_target

TARGET = to_tvm_target(host_target())
CORE_OPS = ("relax.nn.conv2d", "relax.matmul")


def _ops(func: relax.Function) -> list[relax.Call]:
    found: list[relax.Call] = []

    def visit(expr: object) -> None:
        if isinstance(expr, relax.Call) and hasattr(expr.op, "name"):
            found.append(expr)

    relax.analysis.post_order_visit(func.body, visit)
    return found


def _integer_cores(plan: GraphPlan) -> list[tuple[str, str]]:
    """The operand types of each integer convolution and matmul: the Relax operators' (u8 x s8), and those
    of the kernels over packed weights that replace them (tuner.passes.int8_packing): u8 x s8 for VNNI,
    u8 x s16 for the int16 products of CPUs without it, as the dot product of ``plan``'s CPU reads them."""
    cores = []
    for c in _ops(plan.prepared["main"]):
        if c.op.name in CORE_OPS and str(c.ty.dtype) == "int32":
            cores.append(tuple(str(a.ty.dtype) for a in c.args[:2]))
        elif c.op.name == "relax.call_tir" and has_packed_block(plan.prepared[c.args[0]]):
            cores.append(tuple(str(a.ty.dtype) for a in c.args[1].fields[:2]))
    return cores


@pytest.mark.parametrize(
    "spec",
    [
        QuantSpec(),
        QuantSpec(bias=False, activation=None),
        QuantSpec(activation="clip"),
        QuantSpec(per_channel=False),
        QuantSpec(act_dtype="uint8"),
        QuantSpec(weight_dtype="uint8", weight_zero_point=5),
        QuantSpec(weight_zero_point=3, activation=None),
    ],
    ids=[
        "relu-bias",
        "plain",
        "relu6",
        "per-tensor",
        "u8-activations",
        "u8-weights",
        "asymmetric-s8-weights",
    ],
)
@pytest.mark.parametrize("kind", ["conv", "matmul"])
def test_quantized_layers_compute_in_integers_and_match_onnxruntime(
    kind: str, spec: QuantSpec, tmp_path: Path
) -> None:
    plan = plan_and_compare(build_qdq_net(kind, spec), tmp_path)
    cores = _integer_cores(plan)
    # The layer and the matmul after it; a convolution of asymmetric weights adds the input's window
    # sums (a convolution with ones).
    assert len(cores) == (3 if spec.weight_zero_point and kind == "conv" else 2), plan.prepared["main"]
    dot = integer_dot(to_tvm_target(host_target()))
    packed = dot.weight_dtype if dot is not None else "int8"
    for operands in cores:
        assert operands in {("uint8", "int8"), ("uint8", packed)}, cores  # u8 x s8 (or s16), as x86 wants
    assert len(plan.fusion.integer_ops) == 2 and not plan.fusion.kept_float
    floats = [c for c in _ops(plan.prepared["main"]) if c.op.name in CORE_OPS and str(c.ty.dtype) != "int32"]
    assert not floats, plan.prepared["main"]


def test_a_grouped_convolution_is_lowered(tmp_path: Path) -> None:
    plan = plan_and_compare(build_qdq_net("conv", QuantSpec(weight_zero_point=2), groups=2), tmp_path)
    assert len(_integer_cores(plan)) >= 2


@pytest.mark.parametrize("layout_op", ["MaxPool", "Reshape", "Transpose", "Flatten"])
def test_qdq_pairs_around_layout_operators_fold(layout_op: str, tmp_path: Path) -> None:
    kind = "matmul" if layout_op == "Transpose" else "conv"
    plan = plan_and_compare(build_qdq_net(kind, layout_op=layout_op), tmp_path)
    calls = _ops(plan.prepared["main"])
    # Only the model's input is quantized and only its output dequantized: the layout operator runs on
    # the integers.
    assert sum(c.op.name == "relax.quantize" for c in calls) == 1, plan.prepared["main"]
    assert sum(c.op.name == "relax.dequantize" for c in calls) == 1, plan.prepared["main"]


def test_an_unquantized_output_is_computed_in_integers_and_goes_on_in_float(tmp_path: Path) -> None:
    model = build_qdq_net("matmul", QuantSpec(activation=None))
    graph = model.graph
    # Drop the last layer's QuantizeLinear/DequantizeLinear pair: its MatMul output goes out in float.
    last_dq = next(
        n
        for n in graph.node
        if n.output[0] == next(m for m in graph.node if m.op_type == "Identity").input[0]
    )
    last_q = next(n for n in graph.node if n.output[0] == last_dq.input[0])
    identity = next(n for n in graph.node if n.op_type == "Identity")
    identity.input[0] = last_q.input[0]
    graph.node.remove(last_dq)
    graph.node.remove(last_q)
    path = tmp_path / "float_tail.onnx"
    onnx.save(model, path)
    plan = plan_graph(load_model(path).mod, TARGET)
    assert plan.fusion.integer_ops == ["matmul 4x32 @ 32x24 -> int8", "matmul 4x24 @ 24x10 -> float32"]
    assert not plan.fusion.kept_float
    assert len(_integer_cores(plan)) == 2, plan.prepared["main"]
    floats = [c for c in _ops(plan.prepared["main"]) if c.op.name in CORE_OPS and str(c.ty.dtype) != "int32"]
    assert not floats, plan.prepared["main"]
    x = np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)
    got = LoadedModel(build_untuned(plan.prepared, TARGET)).run([x])[0]
    # The accumulator is exact; only the float scaling's rounding differs from the dequantized matmul.
    np.testing.assert_allclose(got, reference_output(path, x), rtol=1e-4, atol=1e-4)


def test_a_weight_computed_at_run_time_stays_in_float_with_the_reason(tmp_path: Path) -> None:
    from onnx import TensorProto, helper, numpy_helper

    from tests.model_builders import _model

    inits = [
        numpy_helper.from_array(np.float32(0.05), "s"),
        numpy_helper.from_array(np.int8(0), "z"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("QuantizeLinear", ["w", "s", "z"], ["wq"]),
        helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["wd"]),
        helper.make_node("MatMul", ["xd", "wd"], ["m"]),
        helper.make_node("QuantizeLinear", ["m", "s", "z"], ["mq"]),
        helper.make_node("DequantizeLinear", ["mq", "s", "z"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "runtime_weight",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [8, 6]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])],
        initializer=inits,
    )
    model = _model(graph, opset=13)
    path = tmp_path / "runtime_weight.onnx"
    onnx.save(model, path)
    plan = plan_graph(load_model(path).mod, TARGET)
    assert plan.fusion.integer_ops == []
    (kept,) = plan.fusion.kept_float
    assert (kept.op, kept.shapes) == ("matmul", "4x8 @ 8x6")
    assert kept.reason == "its weight is computed at run time"


def test_the_report_reaches_the_cli_and_the_api_schema() -> None:
    from cli.render import fusion_line
    from service.schemas import FusionOut
    from tuner.entities import FusionSummary, KeptFloat

    fusion = FusionSummary(
        operators_before=9,
        kernels_after=3,
        distinct_tasks=3,
        integer_ops=["conv2d 1x8x12x12 * 16x8x3x3 -> int8"],
        kept_float=[KeptFloat("matmul", "4x24 @ 24x10", "its output is not quantized")],
        integer_kernels="vnni",
        vnni_packed=[],
        vnni_unpacked=["conv2d 1x14x14x8 * 16x3x3x8: 8 input channels (a multiple of 4 is packed)"],
    )
    lines = fusion_line(fusion).splitlines()
    assert lines[1] == "quantized: 1 convolutions/matmuls in integers (u8 x s8 -> int32), 1 kept in float"
    assert lines[2] == "  float: matmul 4x24 @ 24x10: its output is not quantized"
    assert lines[3] == "  on VNNI (vpdpbusd, packed weights): 0 of 1"
    assert lines[4] == "  plain integer kernel: " + fusion.vnni_unpacked[0]
    body = FusionOut.of(fusion).model_dump()
    assert body["integer_ops"] == fusion.integer_ops
    assert body["integer_kernels"] == "vnni" and body["vnni_unpacked"] == fusion.vnni_unpacked
    assert body["kept_float"] == [
        {"op": "matmul", "shapes": "4x24 @ 24x10", "reason": "its output is not quantized"}
    ]
    assert FusionSummary.from_dict(dataclasses.asdict(fusion)) == fusion
