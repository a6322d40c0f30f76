"""Layout conversion leaves no transposes between converted operators: ReLU6/Clip stay in NHWC."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from kiln_tvm import relax, tvm
from tests.artifacts import onnxruntime_output
from tests.model_builders import build_relu6_cnn, build_torch_relu6_cnn, save_torch_program
from tuner.compile import LoadedModel, build_untuned
from tuner.frontend import load_model
from tuner.passes.elementwise import elementwise_as_operators
from tuner.passes.plan import plan_graph
from tuner.targets import host_target, to_tvm_target

TARGET = to_tvm_target(host_target())


def _calls(func: relax.Function, op_name: str) -> list[relax.Call]:
    found: list[relax.Call] = []

    def visit(expr: object) -> None:
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == op_name:
            found.append(expr)

    relax.analysis.post_order_visit(func.body, visit)
    return found


def _assert_transposes_only_at_the_edges(main: relax.Function) -> None:
    """The graph's only permute_dims are the input's (NCHW -> NHWC) and the output's (back)."""
    transposes = _calls(main, "relax.permute_dims")
    assert len(transposes) == 2, main
    into = [t for t in transposes if any(t.args[0].same_as(p) for p in main.params)]
    assert len(into) == 1, main
    assert list(into[0].attrs.axes) == [0, 2, 3, 1]


def _kernel_names(plan) -> list[str]:
    return [info.name for info in plan.infos]


def test_onnx_clip_between_nhwc_convolutions_fuses_into_them(tmp_path: Path) -> None:
    path = tmp_path / "relu6.onnx"
    onnx.save(build_relu6_cnn(), path)
    imported = load_model(path)
    plan = plan_graph(imported.mod, TARGET)

    main = plan.prepared["main"]
    _assert_transposes_only_at_the_edges(main)
    assert {str(c.attrs.data_layout) for c in _calls(main, "relax.nn.conv2d")} == {"NHWC"}
    assert len(_calls(main, "relax.maximum")) == len(_calls(main, "relax.minimum")) == 2
    names = _kernel_names(plan)
    # Both activations run in their convolution's epilogue; only the edge transposes stay separate.
    assert sum("conv2d" in n and "maximum" in n and "minimum" in n for n in names) == 2, names
    assert [n for n in names if "transpose" in n and "conv2d" not in n] == [
        n for n in names if "conv" not in n
    ]
    assert len([n for n in names if "conv" not in n]) == 2, names

    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32) * 4
    kiln = LoadedModel(build_untuned(plan.prepared, TARGET)).run([x])[0]
    np.testing.assert_allclose(kiln, onnxruntime_output(path, x), rtol=1e-4, atol=1e-5)
    # The comparison covers both clip bounds: what each Clip receives crosses 0 and 6.
    for low, high in _clip_inputs(path, x):
        assert low < 0 and high > 6, (low, high)


def _clip_inputs(path: Path, x: np.ndarray) -> list[tuple[float, float]]:
    """The smallest and largest value each Clip of the model at ``path`` receives on ``x`` (onnxruntime)."""
    model = onnx.load(path)
    names = [node.input[0] for node in model.graph.node if node.op_type == "Clip"]
    model.graph.output.extend(onnx.ValueInfoProto(name=name) for name in names)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    values = session.run(names, {session.get_inputs()[0].name: x})
    assert len(values) == 2
    return [(float(v.min()), float(v.max())) for v in values]


def test_torch_relu6_and_hardtanh_stay_in_nhwc(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    module = build_torch_relu6_cnn()
    x = torch.randn(1, 3, 16, 16) * 4
    imported = load_model(save_torch_program(module, (x,), tmp_path / "relu6.pt2"))
    plan = plan_graph(imported.mod, TARGET)

    main = plan.prepared["main"]
    _assert_transposes_only_at_the_edges(main)
    assert not _calls(main, "relax.clip")
    names = _kernel_names(plan)
    assert sum("conv2d" in n and "maximum" in n and "minimum" in n for n in names) == 2, names

    kiln = LoadedModel(build_untuned(plan.prepared, TARGET)).run([x.numpy()])[0]
    with torch.no_grad():
        expected = module(x).numpy()
    np.testing.assert_allclose(kiln, expected, rtol=1e-4, atol=1e-5)


def test_kernels_that_are_not_scalar_max_or_min_are_left_alone() -> None:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    y = relax.Var("y", relax.TensorType((2, 3), "float32"))
    with bb.function("main", [x, y]):
        # max of two full tensors, a transpose and an add against a scalar are not what the rewrite handles
        both = bb.emit_te(tvm.topi.maximum, x, y)
        flipped = bb.emit_te(tvm.topi.transpose, both, [1, 0])
        shifted = bb.emit_te(tvm.topi.add, flipped, 1.0)
        bb.emit_func_output(shifted)
    before = bb.get()
    after = elementwise_as_operators()(before)

    assert len(_calls(after["main"], "relax.call_tir")) == 3
    assert not _calls(after["main"], "relax.maximum")


def test_clip_with_a_scalar_immediate_becomes_operators() -> None:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    with bb.function("main", [x]):
        low = bb.emit_te(tvm.topi.maximum, x, 0.0)  # ONNX Clip before opset 11: bounds are attributes
        out = bb.emit(relax.op.clip(low, -1.0, 6.0))
        bb.emit_func_output(out)
    after = elementwise_as_operators()(bb.get())

    main = after["main"]
    assert not _calls(main, "relax.call_tir") and not _calls(main, "relax.clip")
    assert len(_calls(main, "relax.maximum")) == 2 and len(_calls(main, "relax.minimum")) == 1
    data = np.array([[-9.0, -0.5, 0.5], [3.0, 6.5, 100.0]], np.float32)
    out = LoadedModel(tvm.compile(after, target=TARGET)).run([data])[0]
    np.testing.assert_array_equal(out, np.clip(np.maximum(data, 0), -1, 6))
