"""QOperator ONNX models rewritten into the QDQ form, so that one integer lowering serves both formats.

onnxruntime writes a quantized model either as QDQ (``DequantizeLinear -> Conv -> QuantizeLinear``) or
as QOperator nodes that take and return integers (``QLinearConv``, ``QLinearMatMul``, ``ConvInteger``,
and in its ``com.microsoft`` domain ``QGemm``, ``QLinearAdd``, ``QLinearGlobalAveragePool``...). TVM's
importer knows only the first form, so each QOperator node becomes the QDQ nodes with the meaning ONNX
gives it: dequantize its inputs, run the float operator, quantize its output. Kiln's Relax pass
(:mod:`tuner.passes.qdq_lowering`) then computes the convolutions and matmuls in integers again.

``ConvInteger`` (int32 out, no output scale) becomes a convolution of its inputs widened to int32 minus
their zero points, which the importer takes and which is exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

_MS_DOMAIN = "com.microsoft"


@dataclass(frozen=True)
class _Simple:
    """A ``QLinear<Op>`` node: quantized inputs as (x, scale, zero point) triples, then the output's scale
    and zero point, computing the float operator ``op`` (attributes copied, minus ``drop``)."""

    op: str
    inputs: int  # how many quantized inputs
    output_first: bool = False  # QLinearConcat: (y_scale, y_zp) come first
    drop: tuple[str, ...] = ()


_SIMPLE = {
    ("", "QLinearMatMul"): _Simple("MatMul", 2),
    (_MS_DOMAIN, "QLinearAdd"): _Simple("Add", 2),
    (_MS_DOMAIN, "QLinearMul"): _Simple("Mul", 2),
    (_MS_DOMAIN, "QLinearGlobalAveragePool"): _Simple("GlobalAveragePool", 1, drop=("channels_last",)),
    (_MS_DOMAIN, "QLinearAveragePool"): _Simple("AveragePool", 1, drop=("channels_last",)),
    (_MS_DOMAIN, "QLinearLeakyRelu"): _Simple("LeakyRelu", 1),
    (_MS_DOMAIN, "QLinearSigmoid"): _Simple("Sigmoid", 1),
    (_MS_DOMAIN, "QLinearConcat"): _Simple("Concat", -1, output_first=True),
}

#: Operators this module rewrites (``op_type``); the importer's unsupported-operator check skips them.
QOPERATOR_OPS = frozenset({op for _, op in _SIMPLE} | {"QLinearConv", "ConvInteger", "QGemm"})


class _Rewriter:
    def __init__(self, graph: onnx.GraphProto) -> None:
        from onnx import numpy_helper

        self.graph = graph
        self.values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.nodes: list[onnx.NodeProto] = []
        self.count = 0
        self.taken = (
            {o for n in graph.node for o in n.output} | set(self.values) | {i.name for i in graph.input}
        )

    def fresh(self, stem: str) -> str:
        while True:
            self.count += 1
            name = f"{stem}__kiln{self.count}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def const(self, stem: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self.fresh(stem)
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        self.values[name] = np.asarray(value)
        return name

    def emit(self, op: str, inputs: list[str], stem: str, output: str | None = None, **attrs: object) -> str:
        from onnx import helper

        out = output or self.fresh(stem)
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.fresh(f"{stem}_{op}"), **attrs))
        return out

    def dequantize(self, x: str, scale: str, zero: str | None, axis: int | None = None) -> str:
        inputs = [x, scale] + ([zero] if zero else [])
        attrs = {"axis": axis} if axis is not None else {}
        return self.emit("DequantizeLinear", inputs, x, **attrs)

    def quantize(self, y: str, scale: str, zero: str | None, output: str) -> str:
        inputs = [y, scale] + ([zero] if zero else [])
        return self.emit("QuantizeLinear", inputs, output, output=output)

    def channel_axis(self, scale: str, axis: int) -> int | None:
        """The axis of a per-channel scale, or None for a per-tensor one."""
        value = self.values.get(scale)
        return axis if value is not None and value.size > 1 else (None if value is not None else axis)

    def dequantize_bias(self, bias: str, x_scale: str, w_scale: str) -> str:
        """An int32 bias dequantized with the input scale times the weight scale(s), as ONNX defines it."""
        zero = self.const(f"{bias}_zero", np.zeros(1, np.int32)[0])
        return self.dequantize(bias, self.product(x_scale, w_scale, f"{bias}_scale"), zero, axis=0)

    def product(self, a: str, b: str, stem: str) -> str:
        """``a * b`` (two scales): a constant when both are, else a Mul node."""
        if a in self.values and b in self.values:
            return self.const(stem, (self.values[a].astype(np.float32) * self.values[b].astype(np.float32)))
        return self.emit("Mul", [a, b], stem)


def _attrs(node: onnx.NodeProto, drop: tuple[str, ...] = ()) -> dict[str, object]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name not in drop}


def _input(node: onnx.NodeProto, index: int) -> str | None:
    return node.input[index] if len(node.input) > index and node.input[index] else None


def _qlinear_conv(r: _Rewriter, node: onnx.NodeProto) -> None:
    x, xs, xz, w, ws, wz, ys, yz = (_input(node, i) for i in range(8))
    bias = _input(node, 8)
    assert x and xs and w and ws and ys
    inputs = [r.dequantize(x, xs, xz), r.dequantize(w, ws, wz, axis=0)]
    if bias:
        inputs.append(r.dequantize_bias(bias, xs, ws))
    y = r.emit("Conv", inputs, node.output[0], **_attrs(node))
    r.quantize(y, ys, yz, node.output[0])


def _qgemm(r: _Rewriter, node: onnx.NodeProto) -> None:
    a, as_, az, b, bs, bz = (_input(node, i) for i in range(6))
    c, ys, yz = _input(node, 6), _input(node, 7), _input(node, 8)
    assert a and as_ and b and bs
    attrs = _attrs(node)
    b_axis = 0 if attrs.get("transB", 0) else 1
    inputs = [r.dequantize(a, as_, az), r.dequantize(b, bs, bz, axis=b_axis)]
    if c:
        inputs.append(r.dequantize_bias(c, as_, bs))
    if ys:
        y = r.emit("Gemm", inputs, node.output[0], **attrs)
        r.quantize(y, ys, yz, node.output[0])
    else:  # float output
        r.emit("Gemm", inputs, node.output[0], output=node.output[0], **attrs)


def _conv_integer(r: _Rewriter, node: onnx.NodeProto) -> None:
    x, w, xz, wz = (_input(node, i) for i in range(4))
    assert x and w

    def widened(value: str, zero: str | None, axis_shape: int) -> str:
        from onnx import TensorProto

        wide = r.emit("Cast", [value], value, to=TensorProto.INT32)
        if not zero:
            return wide
        zero_wide = r.emit("Cast", [zero], zero, to=TensorProto.INT32)
        if zero in r.values and r.values[zero].size > 1:  # per output channel: [C, 1, 1, 1]
            shape = r.const(f"{zero}_shape", np.array([-1] + [1] * axis_shape, np.int64))
            zero_wide = r.emit("Reshape", [zero_wide, shape], zero)
        return r.emit("Sub", [wide, zero_wide], value)

    attrs = _attrs(node)
    spatial = len(attrs.get("kernel_shape", [])) or 2
    r.emit(
        "Conv",
        [widened(x, xz, spatial), widened(w, wz, spatial)],
        node.output[0],
        output=node.output[0],
        **attrs,
    )


def _simple(r: _Rewriter, node: onnx.NodeProto, spec: _Simple) -> None:
    names = list(node.input)
    if spec.output_first:
        ys, yz, triples = names[0], names[1], names[2:]
    else:
        count = 3 * spec.inputs
        triples, ys, yz = names[:count], names[count], (names[count + 1] if len(names) > count + 1 else None)
    inputs = []
    for i in range(0, len(triples), 3):
        x, scale, zero = triples[i], triples[i + 1], triples[i + 2] if i + 2 < len(triples) else None
        axis = r.channel_axis(scale, -1) if spec.op == "MatMul" and i == 3 else None
        inputs.append(r.dequantize(x, scale, zero or None, axis=axis))
    y = r.emit(spec.op, inputs, node.output[0], **_attrs(node, spec.drop))
    r.quantize(y, ys, yz or None, node.output[0])


_REWRITES: dict[tuple[str, str], Callable[[_Rewriter, onnx.NodeProto], None]] = {
    ("", "QLinearConv"): _qlinear_conv,
    ("", "ConvInteger"): _conv_integer,
    (_MS_DOMAIN, "QGemm"): _qgemm,
}


def qoperator_to_qdq(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """The model with its QOperator nodes rewritten into QDQ form, and how many were rewritten (the model
    itself, unchanged, when there are none). Subgraphs are left as they are.

    Per-channel parameters give the new DequantizeLinear nodes an ``axis``, which ONNX defines from opset
    13; TVM's importer reads it at any opset, so older models are not re-versioned (that would change
    the meaning of their other operators)."""

    def domain(node: onnx.NodeProto) -> str:
        return "" if node.domain in ("", "ai.onnx") else node.domain

    targets = [
        n
        for n in model.graph.node
        if (domain(n), n.op_type) in _SIMPLE or (domain(n), n.op_type) in _REWRITES
    ]
    if not targets:
        return model, 0
    rewritten = type(model)()
    rewritten.CopyFrom(model)
    graph = rewritten.graph
    r = _Rewriter(graph)
    for node in graph.node:
        key = (domain(node), node.op_type)
        if key in _REWRITES:
            _REWRITES[key](r, node)
        elif key in _SIMPLE:
            _simple(r, node, _SIMPLE[key])
        else:
            r.nodes.append(node)
    del graph.node[:]
    graph.node.extend(r.nodes)
    if not any(n.domain == _MS_DOMAIN for n in graph.node):
        kept = [o for o in rewritten.opset_import if o.domain != _MS_DOMAIN]
        del rewritten.opset_import[:]
        rewritten.opset_import.extend(kept)
    return rewritten, len(targets)


def dequantized_output_steps(data: bytes) -> list[float | None]:
    """Per graph output of an ONNX model, the quantization step when it comes straight from a
    per-tensor DequantizeLinear (through Identity nodes), else None: two correct integer computations
    of such an output may differ by a step where a value lies on a rounding tie."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load_model_from_string(data)
    graph = model.graph
    produced = {o: n for n in graph.node for o in n.output}
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].HasField("t"):
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    steps: list[float | None] = []
    for output in graph.output:
        node = produced.get(output.name)
        while node is not None and node.op_type == "Identity":
            node = produced.get(node.input[0])
        scale = values.get(node.input[1]) if node is not None and node.op_type == "DequantizeLinear" else None
        steps.append(float(scale.reshape(-1)[0]) if scale is not None and scale.size == 1 else None)
    return steps
