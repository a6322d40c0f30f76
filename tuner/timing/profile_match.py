"""Matching onnxruntime's profiled nodes to the Kiln kernel calls that compute the same part of the model.

Both runtimes execute the same graph in a topological order, but each fuses differently and names its
work its own way: onnxruntime profiles ONNX nodes (``/layer1/Conv``, op ``FusedConv``), Kiln calls fused
TIR kernels (``fused_conv2d_add_relu``). The match walks onnxruntime's nodes in the order they ran and
Kiln's calls in program order, never backwards:

* an **anchor** node (a convolution, a matrix product, a pooling, a softmax, a normalization) matches the
  next Kiln call of the same kind; convolutions and products must also agree on their FLOPs within
  :data:`FLOP_TOLERANCE` (onnxruntime's from its recorded shapes, Kiln's from the TIR), so a kernel is
  never matched to a different layer of the same kind;
* any other node (an activation, an addition, a reshape) matches the last matched call when that kernel's
  name says it computes that operator too (Kiln fused it into the anchor), else the next call before the
  next anchor that does; otherwise it stays unmatched (onnxruntime spent that time where Kiln has no
  kernel of its own, e.g. a reshape the VM does without one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Relative FLOP difference within which an onnxruntime product matches a Kiln kernel (Kiln counts the
#: fused epilogue's operations too: a bias and an activation add ~10 % to a depthwise convolution's).
FLOP_TOLERANCE = 0.25

#: onnxruntime operators -> the kind of work Kiln's kernel names say.
_ANCHOR_OPS: dict[str, str] = {
    "Conv": "conv",
    "FusedConv": "conv",
    "NhwcConv": "conv",
    "QLinearConv": "conv",
    "ConvInteger": "conv",
    "ConvTranspose": "conv",
    "MatMul": "matmul",
    "FusedMatMul": "matmul",
    "Gemm": "matmul",
    "FusedGemm": "matmul",
    "MatMulInteger": "matmul",
    "QLinearMatMul": "matmul",
    "MatMulIntegerToFloat": "matmul",
    "DynamicQuantizeMatMul": "matmul",
    "MaxPool": "max_pool",
    "AveragePool": "avg_pool",
    "GlobalAveragePool": "avg_pool",
    "GlobalMaxPool": "max_pool",
    "Softmax": "softmax",
    "LayerNormalization": "layer_norm",
    "SkipLayerNormalization": "layer_norm",
    "SimplifiedLayerNormalization": "layer_norm",
}
_KERNEL_KINDS: dict[str, re.Pattern[str]] = {
    "conv": re.compile(r"conv\d?d"),
    "matmul": re.compile(r"matmul|dense|linear"),
    "max_pool": re.compile(r"max_pool"),
    "avg_pool": re.compile(r"avg_pool|(^|_)mean"),
    "softmax": re.compile(r"softmax"),
    "layer_norm": re.compile(r"layer_norm"),
}
#: Other onnxruntime operators -> the Relax operator a Kiln kernel's name carries when it computes it.
_OTHER_OPS: dict[str, str] = {
    "Add": "add",
    "Sub": "subtract",
    "Mul": "multiply",
    "Div": "divide",
    "Relu": "relu",
    "Clip": "clip",
    "Sigmoid": "sigmoid",
    "Tanh": "tanh",
    "Erf": "erf",
    "Gelu": "gelu",
    "FastGelu": "gelu",
    "BiasGelu": "gelu",
    "Sqrt": "sqrt",
    "Pow": "power",
    "Exp": "exp",
    "Transpose": "transpose",
    "Reshape": "reshape",
    "Flatten": "reshape",
    "Concat": "concat",
    "Split": "split",
    "Gather": "take",
    "Where": "where",
    "ReduceMean": "mean",
    "ReduceSum": "sum",
    "BatchNormalization": "batch_norm",
    "QuantizeLinear": "quantize",
    "DequantizeLinear": "dequantize",
    "Cast": "astype",
}


@dataclass(frozen=True)
class KilnCall:
    """One kernel call of Kiln's compiled model, in program order."""

    kernel: str
    flops: float | None = None


@dataclass(frozen=True)
class OrtNode:
    """One node of onnxruntime's profile, in the order it ran."""

    name: str
    op: str
    us: float
    flops: float | None = None


def kernel_kind(kernel: str) -> str | None:
    """The anchor kind a Kiln kernel's name says it computes (None: none)."""
    lowered = kernel.lower()
    for kind, pattern in _KERNEL_KINDS.items():
        if pattern.search(lowered):
            return kind
    return None


def _names_op(kernel: str, relax_op: str) -> bool:
    return re.search(rf"(^|_){re.escape(relax_op)}\d*(_|$)", kernel.lower()) is not None


def _flops_agree(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return True
    return abs(a - b) <= FLOP_TOLERANCE * max(a, b)


def match_nodes(calls: list[KilnCall], nodes: list[OrtNode]) -> list[int | None]:
    """For each onnxruntime node, the index of the Kiln call it matches (None: unmatched)."""
    kinds = [kernel_kind(c.kernel) for c in calls]
    matched: list[int | None] = []
    last: int | None = None  # the last call an anchor matched
    cursor = 0  # no node matches a call before this one
    for node in nodes:
        found: int | None = None
        anchor = _ANCHOR_OPS.get(node.op)
        if anchor is not None:
            for i in range(cursor, len(calls)):
                if kinds[i] == anchor and _flops_agree(node.flops, calls[i].flops):
                    found = i
                    break
            if found is not None:
                last, cursor = found, found + 1
        elif (relax_op := _OTHER_OPS.get(node.op)) is not None:
            if last is not None and _names_op(calls[last].kernel, relax_op):
                found = last
            else:
                for i in range(cursor, len(calls)):
                    if kinds[i] is not None:
                        break  # the next anchor's: this node belongs before it
                    if _names_op(calls[i].kernel, relax_op):
                        found = cursor = i
                        cursor += 1
                        last = i
                        break
        matched.append(found)
    return matched
