"""An ONNX model made simpler before TVM's importer sees it: its input shapes fixed, its ``Constant``
nodes in the tensor form the importer reads, and the values it computes from constants and shapes
(``Shape -> Gather -> Concat -> Reshape``, axes and sizes computed in the graph) folded into constants.

TVM's ONNX importer wants shapes, axes, pads, sizes and scales as constants: "Node cannot handle
ShapeExpr inputs", "Only constant axes currently supported". Exporters write them as small subgraphs over
``Shape`` (torch.export's dynamic-shape code, TensorFlow's SAME padding, ONNX's own function
expansions); once the input shapes are fixed every such value is a constant. onnxruntime's offline
optimizer at its basic level (already a dependency: it is the peer a job is measured against) folds them:
its constant folding evaluates every node whose inputs are constants, ``Shape`` of a tensor of static
shape included, and removes identities and dropouts. Its other rewrites are turned off
(:data:`_NOT_FOLDING`): Kiln lowers QDQ pairs itself (:mod:`tuner.passes.qdq_lowering`) and fuses operators itself.
The weights stay out of onnxruntime's copy (:func:`skeleton`): they are graph inputs there, so it neither
copies nor folds them.

The folding is skipped for a model with nothing to fold; when onnxruntime cannot load the model (an
operator it lacks, a form it refuses), the model goes to TVM's importer as it is, and the reason is
logged.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.frontend.imported import short_error

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

#: onnxruntime's basic-level rewrites other than folding, turned off: those that change quantize/dequantize
#: pairs (Kiln reads them as exported), and the fusions into other operators (MatMul + Add into a Gemm
#: between two Reshapes, Conv + BatchNormalization...), which would change the kernels Kiln tunes (and the
#: records a model's earlier jobs stored) for nothing TVM's own fusion does not do; a chain of casts is
#: kept for its rounding.
_NOT_FOLDING = (
    "QDQPropagationTransformer",
    "QDQS8ToU8Transformer",
    "QDQSelectorActionTransformer",
    "QDQFinalCleanupTransformer",
    "DoubleQDQPairsRemover",
    "EnsureUniqueDQForNodeUnit",
    "WeightBiasQuantization",
    "MatMulAddFusion",
    "MatMulScaleFusion",
    "MatmulTransposeFusion",
    "GemmActivationFusion",
    "GemmTransposeFusion",
    "GemmSumFusion",
    "ConvActivationFusion",
    "ConvAddFusion",
    "ConvMulFusion",
    "ConvBNFusion",
    "PadFusion",
    "NotWhereFusion",
    "DivMulFusion",
    "FuseReluClip",
    "CastChainElimination",
)

#: Initializers larger than this (bytes, at 4 a value) are weights: kept out of onnxruntime's copy.
WEIGHT_BYTES = 1 << 16

#: Operators whose value is a shape or a count: a graph that has one has something to fold.
_SHAPE_OPS = frozenset({"Shape", "Size", "ConstantOfShape", "Range", "NonZero"})

_REDUCTIONS = ("L1", "L2", "LogSum", "LogSumExp", "Max", "Mean", "Min", "Prod", "Sum", "SumSquare")
#: Per operator, the positions of its inputs that parameterize it (its output's shape, the axes it works
#: on, its quantization) rather than carry its data: TVM's importer and Kiln's converters need them
#: constant, and a user binds them with ``--input-value`` when the graph takes them as inputs.
PARAMETER_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Expand": (1,),
    "Tile": (1,),
    "Slice": (1, 2, 3, 4),
    "Pad": (1, 2, 3),
    "Resize": (1, 2, 3),
    "Upsample": (1,),
    **{f"Reduce{r}": (1,) for r in _REDUCTIONS},
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "Split": (1,),
    "TopK": (1,),
    "OneHot": (1, 2),
    "CumSum": (1,),
    "CumProd": (1,),
    "Clip": (1, 2),
    "ConstantOfShape": (0,),
    "Range": (0, 1, 2),
    "CenterCropPad": (1,),
    "Trilu": (1,),
    "Col2Im": (1, 2),
    "DFT": (1, 2),
    "STFT": (1, 2, 3),
    "HannWindow": (0,),
    "HammingWindow": (0,),
    "BlackmanWindow": (0,),
    "MelWeightMatrix": (0, 1, 2, 3, 4),
    "Dropout": (1, 2),
    "AffineGrid": (1,),
    "NonMaxSuppression": (2, 3, 4),
    "QuantizeLinear": (1, 2),
    "DequantizeLinear": (1, 2),
    "QLinearConv": (1, 2, 4, 5, 6, 7),
    "QLinearMatMul": (1, 2, 4, 5, 6, 7),
    "MatMulInteger": (2, 3),
    "ConvInteger": (2, 3),
}


#: ``Constant``'s attribute forms other than a tensor: their element type, and whether they hold one value.
_CONSTANT_FORMS: dict[str, tuple[int, bool]] = {
    "value_float": (1, True),  # TensorProto.FLOAT
    "value_floats": (1, False),
    "value_int": (7, True),  # TensorProto.INT64
    "value_ints": (7, False),
    "value_string": (8, True),  # TensorProto.STRING
    "value_strings": (8, False),
}


@dataclass(frozen=True)
class Simplified:
    """The model to convert, and what simplifying it did (for the log and the tests)."""

    model: onnx.ModelProto
    folded: bool  # onnxruntime's optimizer ran and its model is the one returned
    nodes_before: int
    nodes_after: int
    skipped_reason: str = ""


def _fixed_shape(value: onnx.ValueInfoProto, shape: tuple[int, ...]) -> None:
    dims = value.type.tensor_type.shape.dim
    del dims[:]
    for size in shape:
        dims.add().dim_value = int(size)


def skeleton(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` without its weights, for the optimizer and the checker: its inputs of the
    static ``shapes``, and its initializers over :data:`WEIGHT_BYTES` turned into graph inputs of their
    type and shape (so they are neither copied into onnxruntime nor folded: what the importer needs
    folded is computed from shapes and small constants); returns it and the names of the initializers it
    left out."""
    import onnx
    from onnx import helper

    graph = model.graph
    weights = [t for t in graph.initializer if _tensor_bytes(t) > WEIGHT_BYTES]
    left_out = {t.name for t in weights}
    out = onnx.ModelProto(
        ir_version=model.ir_version,
        opset_import=model.opset_import,
        producer_name=model.producer_name,
        functions=model.functions,
    )
    out.graph.name = graph.name
    out.graph.node.extend(graph.node)
    out.graph.input.extend(graph.input)
    out.graph.output.extend(graph.output)
    out.graph.value_info.extend(graph.value_info)
    out.graph.initializer.extend(t for t in graph.initializer if t.name not in left_out)
    out.graph.sparse_initializer.extend(graph.sparse_initializer)
    declared = {v.name for v in out.graph.input}
    for value in out.graph.input:
        if value.name in shapes and value.type.WhichOneof("value") == "tensor_type":
            _fixed_shape(value, shapes[value.name])
    out.graph.input.extend(
        helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
        for t in weights
        if t.name not in declared
    )
    return out, sorted(left_out)


def _tensor_bytes(tensor: onnx.TensorProto) -> int:
    count = 1
    for d in tensor.dims:
        count *= int(d)
    return count * 4  # an estimate: what matters is whether it is a weight, not its exact size


def _with_weights(folded: onnx.ModelProto, model: onnx.ModelProto, weights: list[str]) -> onnx.ModelProto:
    """``model`` (in place) turned into ``folded`` around its own weights: the graph's nodes, inputs,
    outputs, small initializers and opsets are ``folded``'s, and the weights :func:`skeleton` left out stay
    where they are (not copied: a large model's weights exist once), less those the folded graph no
    longer reads."""
    graph, names = model.graph, set(weights)
    used = {name for node in folded.graph.node for name in node.input} | {v.name for v in folded.graph.output}
    for index in reversed(range(len(graph.initializer))):
        name = graph.initializer[index].name
        if name not in names or name not in used:
            del graph.initializer[index]
    graph.initializer.extend(folded.graph.initializer)
    declared = {v.name for v in graph.input}
    inputs = [v for v in folded.graph.input if v.name not in names or v.name in declared]
    for field, values in (
        (graph.input, inputs),
        (graph.node, folded.graph.node),
        (graph.output, folded.graph.output),
        (graph.value_info, folded.graph.value_info),
        (model.opset_import, folded.opset_import),
    ):
        del field[:]
        field.extend(values)
    return model


def constants_as_tensors(model: onnx.ModelProto) -> int:
    """Rewrite, in place, the ``Constant`` nodes of the main graph that hold a number or a list
    (``value_float``, ``value_ints``...) to hold the same value as a tensor (``value``), the one form TVM's
    importer reads; return how many were rewritten."""
    from onnx import helper

    rewritten = 0
    for node in model.graph.node:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
            continue
        attrs = {a.name: a for a in node.attribute}
        name = next((n for n in _CONSTANT_FORMS if n in attrs), None)
        if name is None:
            continue
        dtype, scalar = _CONSTANT_FORMS[name]
        value = helper.get_attribute_value(attrs[name])
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, list):
            value = [v.decode() if isinstance(v, bytes) else v for v in value]
        dims: list[int] = [] if scalar else [len(value)]
        values = [value] if scalar else value
        tensor = helper.make_tensor(node.output[0], dtype, dims, values)
        del node.attribute[:]
        node.attribute.append(helper.make_attribute("value", tensor))
        rewritten += 1
    return rewritten


def has_foldable_values(model: onnx.ModelProto) -> bool:
    """Whether the main graph computes a shape, or computes (rather than holds) an input TVM's importer
    needs as a constant."""
    graph = model.graph
    held = {t.name for t in graph.initializer}
    held |= {out for node in graph.node if node.op_type == "Constant" for out in node.output}
    for node in graph.node:
        if node.op_type in _SHAPE_OPS:
            return True
        for index in PARAMETER_INPUTS.get(node.op_type, ()):
            if index < len(node.input) and node.input[index] and node.input[index] not in held:
                return True
    return False


def simplify(
    model: onnx.ModelProto,
    shapes: dict[str, tuple[int, ...]],
    unconvertible: Callable[[onnx.ModelProto], list[str]] = lambda _: [],
) -> Simplified:
    """``model`` with its ``Constant`` nodes rewritten (in place) and, when it has any, the values it
    computes from shapes and constants folded by onnxruntime for the input ``shapes`` (see the module);
    ``model`` itself when there was nothing to fold, the folding failed, or ``unconvertible`` names
    operators of the folded graph (those the folding brought in: onnxruntime expands an operator it has no
    kernel for, such as a float16 ``Range``, into its function body, a ``Loop``)."""
    constants_as_tensors(model)
    before = len(model.graph.node)
    if not has_foldable_values(model):
        return Simplified(model, False, before, before, "nothing to fold")
    try:
        light, weights = skeleton(model, shapes)
        folded = _fold_with_onnxruntime(light)
    except Exception as err:  # noqa: BLE001 - onnxruntime raises its own exception types per failure
        reason = short_error(err, limit=300)
        log.info("onnxruntime could not fold the model's constants; converting it as it is: %s", reason)
        return Simplified(model, False, before, before, reason)
    lacking = unconvertible(folded)
    if lacking:
        return Simplified(model, False, before, before, f"folding brought in {', '.join(lacking)}")
    folded = _with_weights(folded, model, weights)
    return Simplified(folded, True, before, len(folded.graph.node))


def _fold_with_onnxruntime(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only: its warnings name every initializer it drops
    with tempfile.TemporaryDirectory(prefix="kiln-onnx-fold-") as tmp:
        out = Path(tmp) / "folded.onnx"
        options.optimized_model_filepath = str(out)
        ort.InferenceSession(
            model.SerializeToString(),
            options,
            providers=["CPUExecutionProvider"],
            disabled_optimizers=list(_NOT_FOLDING),
        )
        folded = onnx.load_model(str(out))
    # onnxruntime writes the opsets its rewrites may use; the model keeps the default-domain one it had.
    return folded
