"""Static int8 quantization of a float ONNX model by onnxruntime's quantizer, in the QDQ form Kiln's integer
lowering consumes (:mod:`tuner.passes.qdq_lowering`).

Only the convolutions and matmuls over a constant weight (the cores) are quantized, in one of two forms:

* their outputs rounded to 8 bits too (with the activations, pooling and reshapes between the cores, so
  that quantized values flow from one to the next): the faster form, 8-bit tensors between the kernels;
* their outputs left in float (``float_outputs``), as the integer lowering computes them from the int32
  sums (:mod:`tuner.passes.qdq_lowering`). Rounding each core's output to 8 bits per tensor, before the
  bias and activation after it, is where much of a quantized network's error comes from: on PP-OCRv4's
  recognizer, one pointwise convolution quantized alone changed the output by 0.27 with its output
  rounded, by 0.02 without. It costs speed where the rounding did not matter: ResNet-18 ran 13.8 ms in
  the first form and 18.3 ms in this one on a Zen 3 (same trials, one run), at the same accuracy.

The accuracy control takes the first form and turns to the second only when the budget breaks. A matmul
of two activations (attention) stays in float, as Kiln's lowering would keep it.

Activations are u8 with per-tensor scales calibrated on the user's samples (MinMax, percentile or
entropy: onnxruntime's calibrators), weights s8 per output channel, the format onnxruntime recommends for
x86 (with 7-bit weights, ``reduce_range``, on CPUs without VNNI: there ``vpmaddubsw`` is exact on them and
twice as fast as the int16 products 8-bit weights need, :mod:`kiln_tvm.x86_vnni`). The activations'
ranges are computed once and kept in a cache file, so that the accuracy control
(:mod:`tuner.quantization.accuracy_control`) quantizes the model again with some operators left in float
without calibrating again.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from tuner.entities.job import CALIBRATION_METHODS as METHODS
from tuner.errors import InvalidSpec
from tuner.quantization.bf16_operands import with_bf16_operands

#: The calibration methods a job may ask for, by the name onnxruntime's ``CalibrationMethod`` gives them.
CALIBRATION_METHODS = dict(zip(METHODS, ("MinMax", "Percentile", "Entropy"), strict=True))
#: The operators whose weights are quantized (the cores Kiln computes in integers).
CORE_OPS = ("Conv", "MatMul", "Gemm")
#: With the cores' outputs quantized, the operators quantized along with them, so that quantized values
#: flow between the cores.
CARRIER_OPS = ("Relu", "Clip", "MaxPool", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze")


#: Per-channel DequantizeLinear (its ``axis``) needs opset 13: an older model is converted first (paddle2onnx
#: exports at 11, and onnxruntime's quantizer writes the axis whatever the opset, an invalid model).
PER_CHANNEL_OPSET = 13


def _with_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """``model`` at default-domain opset ``opset`` or later (ONNX's version converter where older)."""
    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), opset)
    if current >= opset:
        return model
    from onnx import version_converter

    return version_converter.convert_version(model, opset)


def check_calibration_method(method: str) -> None:
    """:class:`~tuner.errors.InvalidSpec` for a calibration method Kiln does not have."""
    if method not in CALIBRATION_METHODS:
        raise InvalidSpec(
            f"unknown calibration method {method!r}; choose one of {', '.join(CALIBRATION_METHODS)}"
        )


@dataclass(frozen=True)
class QuantizableNode:
    """A convolution or matmul over a constant weight: its node name (given one where the model had none)
    and how a report names it."""

    name: str
    op_type: str
    weight_shape: tuple[int, ...]

    def describe(self) -> str:
        return f"{self.name} ({self.op_type} {'x'.join(map(str, self.weight_shape))})"


def named_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose every node has a unique name: onnxruntime's quantizer selects nodes by
    name, and exporters leave some unnamed."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    seen: set[str] = set()
    for index, node in enumerate(copy.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{index}"
        seen.add(node.name)
    return copy


def softmax_outputs(model: onnx.ModelProto) -> set[str]:
    """The graph outputs a Softmax or LogSoftmax over the last axis produces, directly or through reshapes
    (PaddleOCR's recognizer reshapes ``[batch x steps, characters]`` scores back to ``[batch, steps,
    characters]``): class scores, whatever their rank."""
    producers = {out: node for node in model.graph.node for out in node.output}
    found = set()
    for output in model.graph.output:
        node = producers.get(output.name)
        while node is not None and node.op_type in _RESHAPES:
            node = producers.get(node.input[0])
        if node is not None and node.op_type in ("Softmax", "LogSoftmax"):
            axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
            rank = _output_rank(model, node.output[0])
            if axis == -1 or (rank is not None and axis == rank - 1) or node.output[0] != output.name:
                found.add(output.name)
    return found


#: Operators that only reshape what they pass on (a softmax's class axis stays last through them).
_RESHAPES = ("Reshape", "Identity", "Flatten", "Squeeze", "Unsqueeze")


def _output_rank(model: onnx.ModelProto, name: str) -> int | None:
    for output in model.graph.output:
        if output.name == name and output.type.tensor_type.HasField("shape"):
            return len(output.type.tensor_type.shape.dim)
    return None


def quantizable_nodes(model: onnx.ModelProto) -> list[QuantizableNode]:
    """The named ``model``'s convolutions and matmuls whose second operand is a constant weight."""
    weights = {init.name: tuple(init.dims) for init in model.graph.initializer}
    constants = {
        node.output[0]: tuple(attr.t.dims)
        for node in model.graph.node
        if node.op_type == "Constant"
        for attr in node.attribute
        if attr.name == "value"
    }
    found = []
    for node in model.graph.node:
        if node.op_type in CORE_OPS and len(node.input) >= 2:
            shape = weights.get(node.input[1], constants.get(node.input[1]))
            if shape is not None:
                found.append(QuantizableNode(node.name, node.op_type, shape))
    return found


class _Samples:
    """onnxruntime's ``CalibrationDataReader`` over a list of samples (made lazily: onnxruntime is imported
    only when a model is quantized)."""

    def __new__(cls, samples: Sequence[dict[str, np.ndarray]]) -> object:
        from onnxruntime.quantization import CalibrationDataReader

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.items = iter(samples)

            def get_next(self) -> dict[str, np.ndarray] | None:
                return next(self.items, None)

        return Reader()


class StaticQuantizer:
    """Quantizes one float model, with the activations' ranges calibrated once on ``samples`` by
    ``method`` and kept in ``workdir``."""

    def __init__(
        self,
        model: onnx.ModelProto,
        samples: Sequence[dict[str, np.ndarray]],
        method: str,
        workdir: Path,
        *,
        weight_bits: int = 8,
    ) -> None:
        from onnxruntime.quantization.shape_inference import quant_pre_process

        check_calibration_method(method)
        if weight_bits not in (7, 8):
            raise ValueError(f"weights are quantized to 7 or 8 bits, not {weight_bits}")
        self.samples, self.method, self.workdir = list(samples), method, workdir
        self.weight_bits = weight_bits
        workdir.mkdir(parents=True, exist_ok=True)
        named = workdir / "named.onnx"
        onnx.save(named_model(_with_opset(model, PER_CHANNEL_OPSET)), named)
        # onnxruntime's pre-processing: batch norms folded into the convolutions before them, shapes
        # inferred; the float model every quantized one is compared with.
        self.float_path = workdir / "float.onnx"
        with _quiet():
            quant_pre_process(str(named), str(self.float_path), skip_symbolic_shape=True)
        self.model = onnx.load(str(self.float_path))
        self.nodes = quantizable_nodes(self.model)
        self.class_scores = softmax_outputs(self.model)
        self.ranges = workdir / "ranges.json"
        #: Whether the cores' outputs stay float (else rounded to 8 bits, the faster form).
        self.float_outputs = False
        self._count = 0

    def quantize(self, keep_float: Sequence[str] = (), *, bf16: bool = False) -> Path:
        """The QDQ model with every quantizable node but those named in ``keep_float`` in int8 (a new
        file in the work directory); with ``bf16``, those are computed on bf16-rounded operands
        (:mod:`tuner.quantization.bf16_operands`), else in float32."""
        path = self._quantized(keep_float)
        if not (bf16 and keep_float):
            return path
        out = self.workdir / f"{path.stem}_bf16.onnx"
        onnx.save(with_bf16_operands(onnx.load(str(path)), set(keep_float)), out)
        return out

    def _quantized(self, keep_float: Sequence[str]) -> Path:
        from onnxruntime import quantization as q

        quantized = [n.name for n in self.nodes if n.name not in set(keep_float)]
        if not quantized:
            return self.float_path
        self._count += 1
        out = self.workdir / f"int8_{self._count}.onnx"
        carriers = (
            [] if self.float_outputs else [n.name for n in self.model.graph.node if n.op_type in CARRIER_OPS]
        )
        # With float outputs, Kiln's lowering computes each core's output from its int32 sums: a rounding
        # to 8 bits skipped per layer, before the bias and activation that follow it.
        extra = {"OpTypesToExcludeOutputQuantization": list(CORE_OPS)} if self.float_outputs else {}
        with _quiet():
            q.quantize_static(
                str(self.float_path),
                str(out),
                _Samples(self.samples) if not self.ranges.exists() else None,
                quant_format=q.QuantFormat.QDQ,
                per_channel=True,
                reduce_range=self.weight_bits == 7,
                activation_type=q.QuantType.QUInt8,
                weight_type=q.QuantType.QInt8,
                op_types_to_quantize=[*CORE_OPS, *(CARRIER_OPS if carriers else ())],
                nodes_to_quantize=[*quantized, *carriers],
                nodes_to_exclude=list(keep_float) or None,
                calibrate_method=getattr(q.CalibrationMethod, CALIBRATION_METHODS[self.method]),
                calibration_cache_path=self.ranges,
                extra_options=extra,
            )
        return out


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """onnxruntime's quantizer warns through the root logger ("consider pre-processing") on every call."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)
