"""Quantized ONNX models for the tests, built by hand so every quantization parameter is chosen.

A layer is ``DequantizeLinear(x) -> Conv/MatMul(DequantizeLinear(W)) [+ bias] [-> activation] ->
QuantizeLinear -> DequantizeLinear``, as onnxruntime's ``quantize_static`` writes QDQ models. Output
scales come from the float layer's range on a seeded input, so outputs use most of the integer range.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.model_builders import IR_VERSION, OPSET, _model
from tuner.compile import LoadedModel, build_untuned
from tuner.frontend import load_model
from tuner.passes.plan import GraphPlan, plan_graph
from tuner.targets import host_target, to_tvm_target

TARGET = to_tvm_target(host_target())

_ONNX_TYPES = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8}


@dataclass(frozen=True)
class QuantSpec:
    """How one layer is quantized."""

    act_dtype: str = "int8"  # activations (input and output)
    weight_dtype: str = "int8"
    per_channel: bool = True
    weight_zero_point: int = 0  # nonzero: asymmetric weights (every channel gets this plus its index % 3)
    bias: bool = True
    activation: str | None = "relu"  # "relu", "clip" (ReLU6), or None
    #: After the layer's quantized output: "gelu" (Div, Erf, Add, Mul, Mul), "tanh", or "requantize" (Mul
    #: and Add by constants), each operator's output quantized as onnxruntime's quantize_static writes them
    #: (all but the Div's).
    chain: str | None = None


def _range(dtype: str) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


class _Graph:
    def __init__(self, seed: int, x_shape: tuple[int, ...]) -> None:
        self.rng = np.random.default_rng(seed)
        self.x_shape = x_shape
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}{self.count}"

    def const(self, stem: str, value: np.ndarray) -> str:
        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], **attrs: object) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def quantize(self, x: str, scale: float, zero: int, dtype: str) -> str:
        s = self.const("s", np.float32(scale))
        z = self.const("z", np.array(zero, dtype=dtype))
        return self.node("QuantizeLinear", [x, s, z])

    def dequantize(self, q: str, scale: float, zero: int, dtype: str) -> str:
        s = self.const("s", np.float32(scale))
        z = self.const("z", np.array(zero, dtype=dtype))
        return self.node("DequantizeLinear", [q, s, z])

    def weights(self, shape: tuple[int, ...], axis: int, spec: QuantSpec) -> tuple[str, np.ndarray]:
        """A dequantized constant weight; returns its node's output and its float value."""
        low, high = _range(spec.weight_dtype)
        channels = shape[axis]
        zero = np.array(
            [spec.weight_zero_point + (c % 3 if spec.weight_zero_point else 0) for c in range(channels)]
        )
        if spec.weight_dtype == "uint8":
            zero = zero + 128
        ints = self.rng.integers(low, high + 1, size=shape)
        scale = (0.004 + 0.004 * self.rng.random(channels)).astype(np.float32)
        if not spec.per_channel:
            scale, zero = scale[:1], zero[:1]
        broadcast = [1] * len(shape)
        broadcast[axis] = -1 if spec.per_channel else 1
        value = (ints - zero.reshape(broadcast)) * scale.reshape(broadcast)
        w = self.const("w", ints.astype(spec.weight_dtype))
        s = self.const("ws", scale if spec.per_channel else scale[0])
        z = self.const(
            "wz", zero.astype(spec.weight_dtype) if spec.per_channel else zero[0].astype(spec.weight_dtype)
        )
        out = self.name("dequantizelinear")
        self.nodes.append(helper.make_node("DequantizeLinear", [w, s, z], [out], axis=axis))
        return out, value.astype(np.float32)

    def bias(self, channels: int, x_scale: float, w_value: np.ndarray, axis: int) -> str:
        """An int32 bias dequantized with the input scale times each channel's weight scale, as ORT does."""
        ints = self.rng.integers(-2000, 2000, size=channels).astype(np.int32)
        weight_scale = (
            np.abs(w_value).max(axis=tuple(i for i in range(w_value.ndim) if i != axis)) / 127.0 + 1e-6
        )
        scale = (x_scale * weight_scale).astype(np.float32)
        b = self.const("b", ints)
        s = self.const("bs", scale)
        z = self.const("bz", np.zeros(channels, np.int32))
        out = self.name("dequantizelinear")
        self.nodes.append(helper.make_node("DequantizeLinear", [b, s, z], [out], axis=0))
        return out

    def activation(self, x: str, kind: str | None) -> str:
        if kind == "relu":
            return self.node("Relu", [x])
        if kind == "clip":
            return self.node(
                "Clip", [x, self.const("lo", np.float32(0.0)), self.const("hi", np.float32(6.0))]
            )
        return x


def _output_params(values: np.ndarray, dtype: str) -> tuple[float, int]:
    low, high = float(min(values.min(), 0.0)), float(max(values.max(), 0.0))
    scale = max(high - low, 1e-3) / 255.0
    qmin, _ = _range(dtype)
    return scale, int(np.clip(round(qmin - low / scale), *_range(dtype)))


def _probe(g: _Graph, out: str, x: np.ndarray) -> np.ndarray:
    """The value of ``out`` on ``x`` (onnxruntime, the graph built so far)."""
    import onnxruntime as ort

    model = helper.make_model(
        _graph_with_output(g, out, "probe"), opset_imports=[helper.make_opsetid("", OPSET)]
    )
    model.ir_version = IR_VERSION
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def build_qdq_net(
    kind: str = "conv",
    spec: QuantSpec = QuantSpec(),
    layout_op: str | None = None,
    seed: int = 0,
    groups: int = 1,
) -> onnx.ModelProto:
    """A quantized layer (``kind`` "conv": 1x8x12x12 input, 16 3x3 filters with padding 1 and ``groups``;
    "matmul": 4x32 input times a 32x24 weight), then optionally ``layout_op`` ("MaxPool", "Reshape",
    "Transpose" or "Flatten") between Q/DQ pairs of the same parameters, then a second quantized
    matmul layer. Input ``x`` float, output ``y`` float (dequantized)."""
    x_shape = (1, 8, 12, 12) if kind == "conv" else (4, 32)
    g = _Graph(seed, x_shape)
    dtype = spec.act_dtype
    x_scale, x_zero = 0.03, (7 if dtype == "int8" else 135)
    xq = g.dequantize(g.quantize("x", x_scale, x_zero, dtype), x_scale, x_zero, dtype)
    if kind == "conv":
        w, w_value = g.weights((16, 8 // groups, 3, 3), 0, spec)
        inputs = [xq, w] + ([g.bias(16, x_scale, w_value, 0)] if spec.bias else [])
        core = g.node("Conv", inputs, pads=[1, 1, 1, 1], kernel_shape=[3, 3], group=groups)
    else:
        w, w_value = g.weights((32, 24), 1, spec)
        core = g.node("MatMul", [xq, w])
        if spec.bias:
            core = g.node("Add", [core, g.bias(24, x_scale, w_value, 1)])
    act = g.activation(core, spec.activation)
    # Output quantization parameters from the float layer's range on a seeded input.
    x = np.random.default_rng(seed).standard_normal(x_shape).astype(np.float32)
    y_scale, y_zero = _output_params(_probe(g, act, x), dtype)
    y = g.dequantize(g.quantize(act, y_scale, y_zero, dtype), y_scale, y_zero, dtype)
    if spec.chain is not None:
        y = _quantized_chain(g, y, spec.chain, x, dtype)
    if layout_op is not None:
        y = _layout(g, y, layout_op, kind)
        y = g.dequantize(g.quantize(y, y_scale, y_zero, dtype), y_scale, y_zero, dtype)
    # A second quantized layer: a matmul over the flattened features.
    if kind == "conv" or layout_op in ("Reshape", "Flatten", "MaxPool"):
        y = g.node("Flatten", [y], axis=1)
        y = g.dequantize(g.quantize(y, y_scale, y_zero, dtype), y_scale, y_zero, dtype)
    features = _probe(g, y, x).shape[-1]
    w2, _ = g.weights((features, 10), 1, spec)
    out = g.node("MatMul", [y, w2])
    probe2 = _probe(g, out, x)
    o_scale, o_zero = _output_params(probe2, dtype)
    out = g.dequantize(g.quantize(out, o_scale, o_zero, dtype), o_scale, o_zero, dtype)
    return _model(_graph_with_output(g, out, "y", probe2.shape))


def _quantized_chain(g: _Graph, y: str, chain: str, x: np.ndarray, dtype: str) -> str:
    """``chain`` applied to ``y``, each operator's output quantized with parameters from its range on ``x``."""

    def requantized(out: str) -> str:
        scale, zero = _output_params(_probe(g, out, x), dtype)
        return g.dequantize(g.quantize(out, scale, zero, dtype), scale, zero, dtype)

    if chain == "tanh":
        return requantized(g.node("Tanh", [y]))
    if chain == "requantize":
        scaled = requantized(g.node("Mul", [y, g.const("c", np.float32(0.37))]))
        return requantized(g.node("Add", [scaled, g.const("c", np.float32(0.25))]))
    assert chain == "gelu", chain
    erf = requantized(g.node("Erf", [g.node("Div", [y, g.const("c", np.float32(1.4142135))])]))
    shifted = requantized(g.node("Add", [erf, g.const("c", np.float32(1.0))]))
    product = requantized(g.node("Mul", [y, shifted]))
    return requantized(g.node("Mul", [product, g.const("c", np.float32(0.5))]))


def _layout(g: _Graph, y: str, op: str, kind: str) -> str:
    if op == "MaxPool":
        return g.node("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2])
    if op == "Transpose":
        return g.node("Transpose", [y], perm=[0, 1, 3, 2] if kind == "conv" else [1, 0])
    if op == "Reshape":
        shape = g.const("shape", np.array([1, -1] if kind == "conv" else [-1, 12], np.int64))
        return g.node("Reshape", [y, shape])
    if op == "Flatten":
        return g.node("Flatten", [y], axis=1)
    raise ValueError(op)


def _graph_with_output(
    g: _Graph, out: str, name: str, out_shape: tuple[int, ...] | None = None
) -> onnx.GraphProto:
    nodes = [*g.nodes, helper.make_node("Identity", [out], [name])]
    return helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(g.x_shape))],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(out_shape) if out_shape else None)],
        initializer=list(g.inits),
    )


def output_step(model: onnx.ModelProto) -> float:
    """The quantization step of the model's (dequantized) output."""
    produced = {n.output[0]: n for n in model.graph.node}
    node = produced[model.graph.output[0].name]
    while node.op_type == "Identity":
        node = produced[node.input[0]]
    assert node.op_type == "DequantizeLinear"
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return float(inits[node.input[1]])


def qdq_sessions(path: Path) -> tuple[object, object]:
    """onnxruntime as users run it, and ONNX's own semantics of the QDQ graph: onnxruntime with its graph
    optimizations off, so each DequantizeLinear, float operator and QuantizeLinear runs as written (its
    fused QLinear kernels round the bias and the requantization differently, by up to one step)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    providers = ["CPUExecutionProvider"]
    return (
        ort.InferenceSession(str(path), providers=providers),
        ort.InferenceSession(str(path), options, providers=providers),
    )


def reference_output(path: Path, x: np.ndarray) -> np.ndarray:
    return qdq_sessions(path)[1].run(None, {"x": x})[0]  # type: ignore[attr-defined]


def plan_and_compare(
    model: onnx.ModelProto, tmp_path: Path, inputs: int = 6, *, optimized_steps: float | None = 1.0
) -> GraphPlan:
    """Plan the model, run it untuned and check it within one step of onnxruntime, and to the step of
    ONNX's reference semantics on nearly every output (ties may round either way). ``optimized_steps=None``
    leaves onnxruntime's optimized graph out: on chains of quantized activations it is itself two steps
    from the reference, which is what Kiln computes. onnxruntime's optimized graph is compared with only
    where it is itself within ``optimized_steps`` of the reference (on CPUs without VNNI it is not)."""
    path = tmp_path / "qdq.onnx"
    onnx.save(model, path)
    plan = plan_graph(load_model(path).mod, TARGET)
    loaded = LoadedModel(build_untuned(plan.prepared, TARGET))
    step = output_step(model)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    optimized, reference = qdq_sessions(path)
    worst, differ, total = 0.0, 0, 0
    for seed in range(inputs):
        x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        got = loaded.run([x])[0]
        expected = reference.run(None, {"x": x})[0]  # type: ignore[attr-defined]
        if optimized_steps is not None:
            optimized_out = optimized.run(None, {"x": x})[0]  # type: ignore[attr-defined]
            # On a CPU without VNNI, onnxruntime's u8 x s8 kernels (vpmaddubsw) saturate their int16 sums:
            # its optimized graph is then itself steps from the reference (4 on the conv, 31 on the matmul
            # here, on a Zen 3), and only the reference below can tell whether Kiln is right.
            if float(np.abs(optimized_out - expected).max()) / step <= optimized_steps + 0.001:
                off = float(np.abs(got - optimized_out).max()) / step
                assert off <= optimized_steps + 0.001, f"{off:.2f} steps from onnxruntime"
        lsb = np.abs(got - expected) / step
        worst = max(worst, float(lsb.max()))
        differ, total = differ + int((lsb > 0.5).sum()), total + lsb.size
    assert worst <= 1.001, f"{worst:.2f} steps from ONNX's reference"
    assert differ <= 0.01 * total, f"{differ} of {total} outputs differ from ONNX's reference by a step"
    return plan


def quantized_by_onnxruntime(
    model: onnx.ModelProto, shape: tuple[int, ...], workdir: Path, name: str
) -> tuple[Path, Path]:
    """``model`` (one input ``x`` of ``shape``) saved as ``name``.onnx, and its QDQ twin ``name``_int8.onnx
    from onnxruntime's ``quantize_static`` (per-channel weights, 8 seeded calibration inputs): the way users
    quantize."""
    from onnxruntime import quantization

    fp32, int8 = workdir / f"{name}.onnx", workdir / f"{name}_int8.onnx"
    onnx.save(model, fp32)
    rng = np.random.default_rng(0)

    class Calibration(quantization.CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(8)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    quantization.quantize_static(
        str(fp32), str(int8), Calibration(), quant_format=quantization.QuantFormat.QDQ, per_channel=True
    )
    return fp32, int8
