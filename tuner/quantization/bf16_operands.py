"""Operators returned from int8 to bf16, written into the ONNX model as ONNX can say it: each of their two
operands rounded to bf16 and widened back (a ``Cast`` pair), their products and sums in float32.

That is what Kiln's bf16 kernels compute (bf16 operands, float32 accumulation: :mod:`tuner.passes.precision`
reads such a round trip as a bf16 operand), so the model the accuracy control judges on onnxruntime (whose
``Cast`` rounds to nearest even, as TVM's does) is the model Kiln compiles, and verification compares the
compiled model with this one as written.
"""

from __future__ import annotations

from collections.abc import Collection

import onnx
from onnx import TensorProto, helper


def with_bf16_operands(model: onnx.ModelProto, nodes: Collection[str]) -> onnx.ModelProto:
    """A copy of ``model`` in which the named nodes' first two inputs (a convolution's or matmul's data and
    weight) are rounded to bf16 before them; ``KeyError`` for a name the graph lacks."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    missing = set(nodes) - {n.name for n in copy.graph.node}
    if missing:
        raise KeyError(f"no node named {', '.join(sorted(missing))} in the model")
    rewritten: list[onnx.NodeProto] = []
    for node in copy.graph.node:
        if node.name in nodes:
            for index in range(min(2, len(node.input))):
                source = node.input[index]
                narrow, wide = f"{node.name}_in{index}_bf16", f"{node.name}_in{index}_bf16_f32"
                rewritten.append(
                    helper.make_node("Cast", [source], [narrow], name=narrow, to=TensorProto.BFLOAT16)
                )
                rewritten.append(helper.make_node("Cast", [narrow], [wide], name=wide, to=TensorProto.FLOAT))
                node.input[index] = wide
        rewritten.append(node)
    del copy.graph.node[:]
    copy.graph.node.extend(rewritten)
    return copy
