"""Kiln's graph passes never break a model plain TVM compiles: operators TVM's layout rules fail on stay in
the model's layout while the convolutions around them go to NHWC, and a pass that fails is left out with
its reason, the plan's values unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from kiln_tvm import relax, structural_equal, tvm
from tests.model_builders import IR_VERSION
from tuner.compile import LoadedModel, build_untuned
from tuner.entities import PlanningOptions
from tuner.frontend import load_model
from tuner.passes.guarded import SkippedPasses, guarded
from tuner.passes.levels import LevelRecorder, recording_levels
from tuner.passes.plan import plan_graph
from tuner.targets import host_target, to_tvm_target

TARGET = to_tvm_target(host_target())
SHAPE = (1, 4, 8, 8)


def _conv_then(
    nodes: list[onnx.NodeProto], outputs: list[onnx.ValueInfoProto], opset: int, extra=()
) -> onnx.ModelProto:
    """``x`` [1, 4, 8, 8] -> two 3x3 convolutions ``c1``, ``c2`` (8 channels, padded) -> ``nodes``."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float32), f"w{i}")
        for i in (1, 2)
    ]
    convs = [helper.make_node("Conv", ["x", f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]) for i in (1, 2)]
    graph = helper.make_graph(
        [*convs, *nodes],
        "conv_then",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE), *extra],
        outputs,
        initializer=weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = IR_VERSION if opset <= 17 else 10
    onnx.checker.check_model(model)
    return model


def _out(name: str = "y", shape: tuple[int | str, ...] = (1, 8, 8, 8)) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _expanded_gelu() -> list[onnx.NodeProto]:
    """ONNX's own expansion of Gelu (its function body, as the node test ``gelu_default_2_expanded``)."""

    def const(name: str, value: float) -> onnx.NodeProto:
        return helper.make_node(
            "Constant", [], [name], value=helper.make_tensor(name, TensorProto.FLOAT, [], [value])
        )

    return [
        const("half", 0.5),
        helper.make_node("CastLike", ["half", "c1"], ["half_c"]),
        const("one", 1.0),
        helper.make_node("CastLike", ["one", "c1"], ["one_c"]),
        const("two", 2.0),
        helper.make_node("CastLike", ["two", "c1"], ["two_c"]),
        helper.make_node("Sqrt", ["two_c"], ["sqrt_two"]),
        helper.make_node("Div", ["c1", "sqrt_two"], ["x_sqrt"]),
        helper.make_node("Erf", ["x_sqrt"], ["erf"]),
        helper.make_node("Sum", ["one_c", "erf"], ["phi"]),
        helper.make_node("Mul", ["half_c", "c1"], ["half_x"]),
        helper.make_node("Mul", ["half_x", "phi"], ["g"]),
        helper.make_node("Conv", ["g", "w2b"], ["y"], pads=[1, 1, 1, 1]),
    ]


def _model(case: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    if case == "max":
        return _conv_then([helper.make_node("Max", ["c1", "c2"], ["y"])], [_out()], 13), {"x": x}
    if case == "gelu":
        model = _conv_then(_expanded_gelu()[:-1] + [helper.make_node("Relu", ["g"], ["y"])], [_out()], 20)
        return model, {"x": x}
    if case == "compress":
        condition = helper.make_tensor_value_info("keep", TensorProto.BOOL, (8,))
        nodes = [helper.make_node("Compress", ["c1", "keep"], ["y"], axis=1)]
        keep = np.array([1, 0, 1, 1, 0, 0, 1, 1], dtype=bool)
        return _conv_then(nodes, [_out(shape=(1, "kept", 8, 8))], 17, extra=[condition]), {
            "x": x,
            "keep": keep,
        }
    if case == "dropout":
        nodes = [helper.make_node("Dropout", ["c1"], ["d"]), helper.make_node("Add", ["d", "c2"], ["y"])]
        return _conv_then(nodes, [_out()], 17), {"x": x}
    raise AssertionError(case)


def _conv_layouts(mod: tvm.IRModule) -> list[str]:
    found: list[str] = []

    def visit(expr: object) -> None:
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", None) == "relax.nn.conv2d":
            found.append(str(expr.attrs.data_layout))

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return found


@pytest.mark.parametrize(
    ("case", "kept"),
    [
        ("max", "stack"),
        ("gelu", "stack"),
        ("compress", "the values of dynamic shape"),
        ("dropout", "nn.dropout"),
    ],
)
def test_layout_conversion_keeps_only_what_it_fails_on(case: str, kept: str, tmp_path: Path) -> None:
    model, feeds = _model(case)
    path = tmp_path / f"{case}.onnx"
    onnx.save(model, path)
    (expected,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)

    plan = plan_graph(
        load_model(path, {k: v.shape for k, v in feeds.items()}).mod,
        TARGET,
        PlanningOptions(weight_prepack=False),
    )
    # The convolutions were converted although an operator after them has a layout rule that fails.
    assert _conv_layouts(plan.prepared) and set(_conv_layouts(plan.prepared)) == {"NHWC"}
    notes = plan.fusion.skipped_passes
    assert len(notes) == 1 and notes[0].startswith(
        f"layout conversion to NHWC: {kept} kept in the model's layout"
    )
    (got,) = LoadedModel(build_untuned(plan.prepared, TARGET)).run(list(feeds.values()))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_a_failing_pass_is_left_out_with_its_reason() -> None:
    @tvm.transform.module_pass(opt_level=0, name="Explodes")
    def explodes(mod: tvm.IRModule, _ctx: object) -> tvm.IRModule:
        raise tvm.error.InternalError("Check failed: no rule for relax.frobnicate")

    class Report:
        def __init__(self) -> None:
            self.items: list[str] = []

    report = Report()

    @tvm.transform.module_pass(opt_level=0, name="FillsThenExplodes")
    def fills_then_explodes(mod: tvm.IRModule, _ctx: object) -> tvm.IRModule:
        report.items.append("half done")
        return explodes(mod)

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.exp(x)))
    mod = bb.get()

    skipped = SkippedPasses()
    recorder = LevelRecorder()
    with recording_levels(recorder):
        out = tvm.transform.Sequential(
            [
                guarded(fills_then_explodes, skipped, "the frobnication", (report,)),
                relax.transform.FoldConstant(),
            ]
        )(mod)
    assert structural_equal(out, mod)
    assert report.items == []  # put back as it was before the pass
    assert skipped.notes == ["the frobnication skipped: Check failed: no rule for relax.frobnicate"]
    # The recorder saw the guarded pass end although the pass inside it never did.
    assert [level.name for level in recorder.levels()] == ["imported", "FillsThenExplodes", "FoldConstant"]
