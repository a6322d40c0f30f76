"""ONNX import: parse and check the file, inline external data, refuse operators TVM lacks, convert."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.entities import BoundInput, Dim, ModelFormat, ModelSignature, TensorSpec
from tuner.errors import InvalidModel, UnsupportedOperator
from tuner.frontend.imported import (
    ImportedModel,
    conversion_error,
    imported_model,
    quiet_importer,
    short_error,
    tvm_frontends,
)
from tuner.frontend.input_values import bind_arrays, bound_inputs
from tuner.frontend.onnx_qoperator import qoperator_to_qdq
from tuner.frontend.onnx_simplify import simplify, skeleton
from tuner.frontend.onnx_unroll import unroll_loops
from tuner.frontend.shapes import UNKNOWN_RANK, resolve_input_shapes

if TYPE_CHECKING:
    import onnx

#: Oldest ONNX opset converted as it is. TVM's converters handle the pre-13 forms of the operators whose
#: inputs changed at opset 13 (Softmax, Squeeze, ReduceSum, Split...; checked against onnxruntime at opsets
#: 10 and 11), but below 11 some fail (Slice and Upsample at opset 9) or would read their inputs with
#: newer semantics (Resize at opset 10): an older model is converted to :data:`CONVERTED_OPSET` first.
MIN_ONNX_OPSET = 11
#: The opset ``onnx.version_converter`` brings a model older than :data:`MIN_ONNX_OPSET` to.
CONVERTED_OPSET = 17

_ONNX_HANDLED_OUTSIDE_MAP = frozenset({"If", "Constant"})  # converted by the importer's own loop
_UNROLLED = frozenset({"Scan", "Loop"})  # written out by Kiln when their trip count is static
_ONNX_DTYPE_NAMES = {"object": "string"}


def parse_model(path: Path, data: bytes) -> onnx.ModelProto:
    """Parse the bytes of an ONNX file and check it has the parts of a model."""
    import onnx
    from google.protobuf.message import DecodeError

    what = f"could not parse '{path.name}' as an ONNX model"
    if not data:
        raise InvalidModel(f"{what}: the file is empty (0 bytes)")
    try:
        model = onnx.load_model_from_string(data)
    except (DecodeError, RuntimeError, ValueError) as err:
        raise InvalidModel(
            f"{what}: the file is truncated or corrupt ({len(data)} bytes; protobuf says: {short_error(err)})"
        ) from None
    if model.ir_version <= 0:
        raise InvalidModel(f"{what}: it has no IR version, so it is not an ONNX file (or it is corrupt)")
    if not model.HasField("graph") or not model.graph.output:
        raise InvalidModel(f"{what}: it has no graph with outputs (truncated or corrupt file?)")
    if model.ir_version < 3:
        raise InvalidModel(f"'{path.name}' uses ONNX IR version {model.ir_version}; Kiln needs 3 or newer")
    return model


def _onnx_opset(model: onnx.ModelProto) -> int | None:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return None


def _in_importable_opset(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """``model``, converted to opset :data:`CONVERTED_OPSET` by ONNX's version converter when it is older
    than :data:`MIN_ONNX_OPSET`; refused with a clear message when it declares no opset or does not
    convert."""
    opset = _onnx_opset(model)
    if opset is None:
        _refuse_unsupported(model)  # a graph of training or contrib operators only: say which
        raise InvalidModel(f"'{name}' does not declare an opset for the default ONNX domain")
    if opset >= MIN_ONNX_OPSET:
        return model
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, CONVERTED_OPSET)
    except Exception as err:  # noqa: BLE001 - the converter raises RuntimeError, ValueError, its own types
        _refuse_unsupported(model)  # the likelier reason, and the one a user can act on
        raise InvalidModel(
            f"'{name}' uses ONNX opset {opset}; Kiln converts models older than opset {MIN_ONNX_OPSET} to "
            f"opset {CONVERTED_OPSET} with onnx.version_converter, which failed: {short_error(err)}"
        ) from None


def _onnx_dtype(elem_type: int) -> str:
    import onnx

    if elem_type == onnx.TensorProto.UNDEFINED:
        return "unknown"
    try:
        name = onnx.helper.tensor_dtype_to_np_dtype(elem_type).name
    except (KeyError, ValueError, TypeError):
        return onnx.TensorProto.DataType.Name(elem_type).lower()
    return _ONNX_DTYPE_NAMES.get(name, name)


def _onnx_value_spec(value: onnx.ValueInfoProto, model_name: str) -> TensorSpec:
    value_type = value.type
    kind = value_type.WhichOneof("value")
    if kind is None:
        return TensorSpec(name=value.name, shape=UNKNOWN_RANK, dtype="unknown")
    if kind == "optional_type" and value_type.optional_type.elem_type.WhichOneof("value") == "tensor_type":
        value_type, kind = value_type.optional_type.elem_type, "tensor_type"  # fed, it is that tensor
    if kind != "tensor_type":
        what = kind.removesuffix("_type")
        raise InvalidModel(
            f"'{model_name}': '{value.name}' is a {what}, not a tensor; Kiln imports models whose inputs "
            "and outputs are tensors"
        )
    tensor = value_type.tensor_type
    dtype = _onnx_dtype(tensor.elem_type)
    if not tensor.HasField("shape"):
        return TensorSpec(name=value.name, shape=UNKNOWN_RANK, dtype=dtype)
    dims: list[Dim] = []
    for i, dim in enumerate(tensor.shape.dim):
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        elif dim.HasField("dim_param") and dim.dim_param:
            dims.append(dim.dim_param)
        else:
            dims.append(f"dim{i}")
    return TensorSpec(name=value.name, shape=tuple(dims), dtype=dtype)


def model_signature(model: onnx.ModelProto, model_name: str) -> ModelSignature:
    graph = model.graph
    initializers = {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}
    inputs = tuple(_onnx_value_spec(v, model_name) for v in graph.input if v.name not in initializers)
    for spec in inputs:
        for axis, dim in enumerate(spec.shape):
            if isinstance(dim, int) and dim < 0:  # 0 is a size: an empty tensor (CastLike's model input)
                raise InvalidModel(
                    f"'{model_name}': input '{spec.name}' declares size {dim} for axis {axis}; a dimension is a "
                    "size (0 or more), or a name for one given when a job is submitted (input_shapes): export "
                    "the model with a named (dynamic) dimension there"
                )
    outputs = tuple(_onnx_value_spec(v, model_name) for v in graph.output)
    return ModelSignature(inputs=inputs, outputs=outputs)


def _onnx_subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.g
        yield from attr.graphs


def _onnx_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of a graph, including those in subgraphs of If, Loop and Scan."""
    for node in graph.node:
        yield node
        for sub in _onnx_subgraphs(node):
            yield from _onnx_nodes(sub)


def _onnx_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Initializers and attribute tensors of a graph and its subgraphs."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
        for sub in _onnx_subgraphs(node):
            yield from _onnx_tensors(sub)


def _inline_external_data(model: onnx.ModelProto, path: Path, allowed: bool) -> bool:
    """Load tensors stored beside the file into the model; True when there were any.

    Only relative locations inside the model's folder are read; when ``allowed`` is False (an upload)
    any external tensor is refused with the same message, whatever the file system holds.
    """
    from onnx import external_data_helper as ext

    tensors = [t for t in _onnx_tensors(model.graph) if ext.uses_external_data(t)]
    for fn in model.functions:
        for node in fn.node:
            for attr in node.attribute:
                if attr.HasField("t") and ext.uses_external_data(attr.t):
                    tensors.append(attr.t)
    for tensor in tensors:
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        if not allowed:
            raise InvalidModel(
                f"'{path.name}' keeps tensor '{tensor.name}' in an external data file; an upload is one "
                "file, so save the model with its weights inline: onnx.save(model, 'model.onnx', "
                "save_as_external_data=False) (up to protobuf's 2 GiB)"
            )
        parts = Path(location).parts
        if not location or Path(location).is_absolute() or ".." in parts or "\\" in location:
            raise InvalidModel(
                f"'{path.name}' keeps tensor '{tensor.name}' in external data at {location!r}, which is not "
                "a relative path inside the model's folder"
            )
        if not (path.parent / location).is_file():
            raise InvalidModel(
                f"'{path.name}' keeps tensor '{tensor.name}' in an external data file '{location}', which "
                "is not next to it"
            )
        try:
            # onnx refuses locations outside the model's directory (and symbolic links)
            ext.load_external_data_for_tensor(tensor, str(path.parent))
        except Exception as err:  # noqa: BLE001 - onnx raises several types for bad locations/offsets
            raise InvalidModel(
                f"could not load external data '{location}' of tensor '{tensor.name}' for "
                f"'{path.name}': {short_error(err)}"
            ) from None
        # load_external_data_for_tensor sets data_location=DEFAULT explicitly; clear it so the model
        # serializes to the same bytes as one saved with its weights inline.
        tensor.ClearField("data_location")
    return bool(tensors)


def _unsupported_onnx_ops(model: onnx.ModelProto, unrolled: frozenset[str] = _UNROLLED) -> list[str]:
    """The operators of ``model`` no converter handles (``unrolled``: those counted as handled because
    Kiln writes them out)."""
    supported = tvm_frontends().onnx_convert_map().keys() | _ONNX_HANDLED_OUTSIDE_MAP | unrolled
    return sorted({node.op_type for node in _onnx_nodes(model.graph) if node.op_type not in supported})


def _refuse_unsupported(model: onnx.ModelProto) -> None:
    """Raise UnsupportedOperator naming every operator of ``model`` no converter handles; a training
    operator (an optimizer, a loss, a gradient) is named as such."""
    unsupported = _unsupported_onnx_ops(model)
    if not unsupported:
        return
    training = sorted(set(unsupported) & tvm_frontends().onnx_training_operators())
    reason = (
        f"; {', '.join(training)} {'is a training operator' if len(training) == 1 else 'are training operators'}"
        ": Kiln compiles models for inference, so export the model without its training graph"
        if training
        else ""
    )
    raise UnsupportedOperator(operators=unsupported, importer="ONNX", reason=reason)


def bind_inputs(model: onnx.ModelProto, values: Mapping[str, Any], model_name: str) -> tuple[BoundInput, ...]:
    """Make each input named in ``values`` a constant of ``model`` (an initializer; no longer an input
    from IR version 4, where an initializer need not be one), in place."""
    from onnx import numpy_helper

    arrays = bind_arrays(model_signature(model, model_name).inputs, values)
    for name, array in arrays.items():
        model.graph.initializer.append(numpy_helper.from_array(array, name))
    if model.ir_version >= 4:
        kept = [v for v in model.graph.input if v.name not in arrays]
        del model.graph.input[:]
        model.graph.input.extend(kept)
    return bound_inputs(arrays)


def load_onnx(
    path: Path,
    given: dict[str, tuple[int, ...]],
    allow_external_data: bool,
    input_values: Mapping[str, Any] | None = None,
) -> ImportedModel:
    import onnx

    model = parse_model(path, path.read_bytes())
    inlined = _inline_external_data(model, path, allow_external_data)
    bound = bind_inputs(model, input_values, path.name) if input_values else ()
    canonical: bytes | Path = path  # the file as it is, read again when asked for
    if inlined or bound:
        try:
            canonical = model.SerializeToString()
        except ValueError as err:
            raise InvalidModel(
                f"'{path.name}' with its external data inlined is too large for one ONNX file "
                f"(protobuf's limit is 2 GiB): {short_error(err)}"
            ) from None
    model = _in_importable_opset(model, path.name)

    if model.functions:
        try:
            import onnx.inliner

            model = onnx.inliner.inline_local_functions(model)
        except Exception as err:  # noqa: BLE001
            raise InvalidModel(
                f"could not inline the local functions of '{path.name}': {short_error(err)}"
            ) from None

    qdq, _ = qoperator_to_qdq(model)
    _refuse_unsupported(qdq)

    try:
        # The model as given (the QDQ form may use axis before opset 13), without its weights: the checker
        # serializes what it checks, a copy of every weight (a third of a large model's import memory).
        onnx.checker.check_model(skeleton(model, {})[0])
    except (onnx.checker.ValidationError, ValueError) as err:
        raise InvalidModel(f"'{path.name}' is not a valid ONNX model: {short_error(err)}") from None
    model = qdq

    declared = model_signature(model, path.name)
    shapes = resolve_input_shapes(declared.inputs, given)
    dtypes = {spec.name: spec.dtype for spec in declared.inputs}
    bad = {n: d for n, d in dtypes.items() if d in ("unknown", "string")}
    if bad:
        name, dtype = next(iter(bad.items()))
        raise InvalidModel(
            f"'{path.name}': input '{name}' has element type '{dtype}', which Kiln cannot feed"
        )

    # Operators no converter handles, Scan and Loop included (written out below when they can be).
    unconverted = functools.partial(_unsupported_onnx_ops, unrolled=frozenset())
    before = set(unconverted(model))
    model = simplify(model, shapes, lambda folded: sorted(set(unconverted(folded)) - before)).model
    unroll_loops(model, shapes)
    left = unconverted(model)
    if left:
        raise UnsupportedOperator(
            operators=left,
            importer="ONNX",
            reason=" (Kiln writes out a Scan, and a Loop whose trip count is a constant and whose condition "
            "stays true)",
        )

    tvm_onnx = tvm_frontends().onnx_importer()
    try:
        with quiet_importer("ONNX importer"):
            mod = tvm_onnx.from_onnx(
                model,
                shape_dict={n: list(s) for n, s in shapes.items()},
                dtype_dict=dtypes,
                keep_params_in_input=False,
            )
    except Exception as err:  # noqa: BLE001 - every importer failure becomes a typed error
        node = tvm_frontends().failed_onnx_node(err.__traceback__)
        op = getattr(node, "op_type", None)
        raise conversion_error(err, "ONNX", path.name, op, getattr(node, "name", None)) from None

    outputs = [o.name for o in model.graph.output]
    return imported_model(
        mod,
        path.name,
        declared=declared,
        shapes=shapes,
        output_names=outputs,
        fmt=ModelFormat.ONNX,
        canonical=canonical,
        bound=bound,
    )
