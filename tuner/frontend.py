"""Model import: ONNX files and ``torch.export`` programs -> a Relax ``IRModule`` with static shapes.

Every failure a user can cause (a corrupt or truncated file, a wrong format, operators the importer
lacks, a dynamic dimension without a shape, a bad ``--input-shape``) is raised as a typed
:mod:`tuner.errors` error with a message that says what to do; no protobuf, torch or TVM traceback
leaves this module.

TVM is imported lazily (through :mod:`kiln_tvm`, which sets ``TVM_NUM_THREADS`` first), so
:func:`detect_format`, :func:`read_signature` of an ONNX file and :func:`parse_input_shapes` stay cheap.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import re
import warnings
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tuner.entities import Dim, ModelFormat, ModelSignature, TensorSpec
from tuner.errors import (
    InvalidModel,
    InvalidSpec,
    KilnError,
    MissingDependency,
    MissingInputShape,
    UnsupportedOperator,
)
from tuner.pt2_archive import check_archive, check_pickled_members, force_weights_only_load

if TYPE_CHECKING:
    import onnx

    from kiln_tvm import tvm

log = logging.getLogger(__name__)

#: Oldest ONNX opset accepted. TVM's converters handle the pre-13 forms of the operators whose inputs
#: changed at opset 13 (Softmax, Squeeze, ReduceSum, Split...; checked against onnxruntime at opsets 10
#: and 11), but below 11 some fail (Slice and Upsample at opset 9) or would read their inputs with
#: newer semantics (Resize at opset 10).
MIN_ONNX_OPSET = 11

#: Shape of a tensor whose rank the model does not declare.
UNKNOWN_RANK: tuple[Dim, ...] = ("...",)

TORCH_PIN = "torch==2.13.0"
#: Default bound on a .pt2 archive's total uncompressed size (``KILN_MAX_UNPACKED_MB`` sets it per call).
DEFAULT_MAX_UNPACKED_BYTES = 4096 << 20
_ZIP_MAGIC = b"PK\x03\x04"
_SUPPORTED = "Kiln imports ONNX models (.onnx) and torch.export programs (.pt2, from torch.export.save)"
_FOREIGN_FORMATS = {
    ".pt": "a PyTorch checkpoint or TorchScript file",
    ".pth": "a PyTorch checkpoint",
    ".pb": "a TensorFlow graph",
    ".tflite": "a TensorFlow Lite model",
    ".h5": "a Keras model",
    ".keras": "a Keras model",
    ".safetensors": "a weights-only file",
    ".mlmodel": "a Core ML model",
}


@dataclass(frozen=True)
class ImportedModel:
    """A model imported into Relax, with every input shape static."""

    mod: tvm.IRModule
    signature: ModelSignature  # concrete input shapes; outputs as the imported ``main`` returns them
    format: ModelFormat
    sha256: str  # of ``canonical_bytes``
    canonical_bytes: bytes  # the model as one blob: ONNX with external data inlined, or the .pt2 file


# --------------------------------------------------------------------------------------------------
# Public API


def detect_format(path: Path) -> ModelFormat:
    """Tell an ONNX file from a ``torch.export`` archive by its first bytes and its extension."""
    path = Path(path)
    head = _read_head(path, 16)
    suffix = path.suffix.lower()
    if not head:
        raise InvalidModel(f"'{path.name}' is empty (0 bytes); {_SUPPORTED}")
    if head.startswith(_ZIP_MAGIC):
        return _classify_zip(path)
    if suffix == ".pt2":
        raise InvalidModel(
            f"'{path.name}' is not a torch.export program: a .pt2 file is a zip archive written by "
            "torch.export.save, and this file is not a zip archive"
        )
    if suffix == ".onnx":
        return ModelFormat.ONNX
    if head[0] == 0x08:
        # An ONNX ModelProto starts with field 1 (ir_version, a varint): tag byte 0x08. This lets blobs
        # stored without an extension through.
        return ModelFormat.ONNX
    hint = _FOREIGN_FORMATS.get(suffix)
    what = f"looks like {hint}" if hint else "is not a model format Kiln knows"
    raise InvalidModel(f"'{path.name}' {what}; {_SUPPORTED}")


def read_signature(path: Path) -> ModelSignature:
    """The model's declared inputs and outputs; dynamic dimensions are kept as their names.

    An ONNX dimension without a name is called ``dim<i>``; a tensor of unknown rank has the shape
    :data:`UNKNOWN_RANK`. A torch.export program names its dynamic dimensions after its symbols (``s0``).
    Reading an ONNX signature does not import TVM; a .pt2 program needs PyTorch.
    """
    path = Path(path)
    fmt = detect_format(path)
    if fmt is ModelFormat.ONNX:
        model = _parse_onnx(path, path.read_bytes())
        return _onnx_signature(model, path.name)
    torch = _import_torch()
    return _torch_signature(_load_torch_program(torch, path, DEFAULT_MAX_UNPACKED_BYTES), path.name)


def warm_up() -> None:
    """Load TVM, its importers and Kiln's graph passes now, so that the first model is quick."""
    import tuner.tasks  # noqa: F401

    _tvm_frontends().onnx_importer()
    try:
        _import_torch()
    except MissingDependency:
        return
    _tvm_frontends().torch_importer()


def parse_input_shapes(items: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """Parse ``--input-shape`` values such as ``x=1x3x224x224`` (``,`` also separates dimensions)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for raw in items:
        item = raw.strip()
        name, sep, dims_text = item.rpartition("=")
        name = name.strip()
        if not sep or not name:
            raise InvalidSpec(
                f"bad --input-shape {raw!r}: expected NAME=DIMS, e.g. --input-shape x=1x3x224x224"
            )
        parts = [p.strip() for p in re.split(r"[xX,]", dims_text)]
        if not dims_text.strip():
            raise InvalidSpec(f"bad --input-shape {raw!r}: no dimensions after '='; e.g. {name}=1x3x224x224")
        dims: list[int] = []
        for part in parts:
            if not part.isdigit() or int(part) < 1:
                raise InvalidSpec(
                    f"bad --input-shape {raw!r}: dimension {part!r} is not a positive integer; "
                    f"e.g. {name}=1x3x224x224"
                )
            dims.append(int(part))
        if name in shapes:
            raise InvalidSpec(f"--input-shape is given twice for input '{name}'")
        shapes[name] = tuple(dims)
    return shapes


def load_model(
    path: Path,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    *,
    allow_external_data: bool = True,
    max_unpacked_bytes: int = DEFAULT_MAX_UNPACKED_BYTES,
) -> ImportedModel:
    """Import an ONNX model or a torch.export program into Relax with every input shape static.

    ``input_shapes`` gives shapes for inputs with dynamic dimensions (and may restate static ones).
    ``allow_external_data=False`` (an upload: one file, nothing beside it) refuses ONNX weights kept in
    other files without looking at the file system; ``max_unpacked_bytes`` bounds a .pt2 archive.
    """
    path = Path(path)
    try:
        given = {str(name): tuple(int(d) for d in dims) for name, dims in (input_shapes or {}).items()}
    except (TypeError, ValueError, AttributeError) as err:
        raise InvalidSpec(f"input shapes must map input names to tuples of integers: {err}") from None
    fmt = detect_format(path)
    if fmt is ModelFormat.ONNX:
        return _load_onnx(path, given, allow_external_data)
    return _load_torch(path, given, max_unpacked_bytes)


# --------------------------------------------------------------------------------------------------
# Shared helpers


def _read_head(path: Path, n: int) -> bytes:
    try:
        with path.open("rb") as f:
            return f.read(n)
    except FileNotFoundError:
        raise InvalidModel(f"model file '{path.name}' does not exist") from None
    except IsADirectoryError:
        raise InvalidModel(f"'{path.name}' is a directory, not a model file") from None
    except OSError as err:
        raise InvalidModel(f"could not read '{path.name}': {err.strerror or 'I/O error'}") from None


def _classify_zip(path: Path) -> ModelFormat:
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as err:
        if path.suffix.lower() == ".pt2":
            return ModelFormat.TORCH_EXPORT  # a truncated archive: loading says what is wrong
        raise InvalidModel(f"'{path.name}' is a damaged zip archive ({err}); {_SUPPORTED}") from None
    if any("/aotinductor/" in f"/{n}" for n in names):
        raise InvalidModel(
            f"'{path.name}' is an AOTInductor package (compiled code), not a torch.export program; "
            "save the program itself with torch.export.save(torch.export.export(model, args), 'model.pt2')"
        )
    if any(n.rsplit("/", 1)[-1] in ("archive_format", "serialized_exported_program.json") for n in names):
        return ModelFormat.TORCH_EXPORT
    if any(n.rsplit("/", 1)[-1] in ("data.pkl", "constants.pkl") for n in names):
        raise InvalidModel(
            f"'{path.name}' was written by torch.save or torch.jit.save, not torch.export.save; export "
            "the model with ep = torch.export.export(model, example_args) and save it with "
            "torch.export.save(ep, 'model.pt2')"
        )
    if path.suffix.lower() == ".pt2":
        return ModelFormat.TORCH_EXPORT
    raise InvalidModel(f"'{path.name}' is a zip archive but not a torch.export program; {_SUPPORTED}")


def _short(err: BaseException, limit: int = 600) -> str:
    """An exception as one short line of text (TVM errors can carry long backtraces)."""
    text = str(err).strip() or type(err).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    text = " ".join(lines[:4])
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _format_shape(shape: Iterable[Dim]) -> str:
    return "x".join(str(d) for d in shape)


def _resolve_input_shapes(
    inputs: tuple[TensorSpec, ...],
    given: Mapping[str, tuple[int, ...]],
    examples: Mapping[str, tuple[int, ...]] | None = None,
) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for all inputs: the declared static ones, or the user's for dynamic ones."""
    names = [spec.name for spec in inputs]
    unknown = [name for name in given if name not in names]
    if unknown:
        listed = ", ".join(f"'{n}'" for n in unknown)
        have = ", ".join(f"'{n}'" for n in names) or "none"
        noun = "is not an input" if len(unknown) == 1 else "are not inputs"
        raise InvalidSpec(f"--input-shape {listed} {noun} of the model; its inputs are: {have}")

    shapes: dict[str, tuple[int, ...]] = {}
    missing: list[str] = []
    suggestions: list[str] = []
    for spec in inputs:
        declared = spec.shape
        if spec.name in given:
            shapes[spec.name] = _check_given_shape(spec, given[spec.name])
            continue
        if declared != UNKNOWN_RANK and spec.is_static:
            shapes[spec.name] = tuple(int(d) for d in declared)
            continue
        if declared == UNKNOWN_RANK:
            missing.append(f"input '{spec.name}' has an unknown rank")
            example: tuple[Dim, ...] = (examples or {}).get(spec.name) or (1,)
        else:
            dyn = [(i, d) for i, d in enumerate(declared) if not isinstance(d, int)]
            listed = ", ".join(f"{i} ('{d}')" for i, d in dyn)
            noun = "a dynamic dimension" if len(dyn) == 1 else "dynamic dimensions"
            missing.append(f"input '{spec.name}' has {noun} {listed}")
            example = (examples or {}).get(spec.name) or tuple(
                d if isinstance(d, int) else 1 for d in declared
            )
        suggestions.append(f"--input-shape {spec.name}={_format_shape(example)}")
    if missing:
        which = "its shape" if len(missing) == 1 else "their shapes"
        raise MissingInputShape(f"{'; '.join(missing)}; give {which}, e.g. {' '.join(suggestions)}")
    return shapes


def check_given_shape(spec: TensorSpec, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` for the input ``spec`` declares, checked (rank, fixed dimensions); InvalidSpec otherwise."""
    return _check_given_shape(spec, shape)


def _check_given_shape(spec: TensorSpec, shape: tuple[int, ...]) -> tuple[int, ...]:
    flag = f"--input-shape {spec.name}={_format_shape(shape)}"
    if any(d < 1 for d in shape):
        raise InvalidSpec(f"{flag}: every dimension must be a positive integer")
    if spec.shape == UNKNOWN_RANK:
        return shape
    if len(shape) != len(spec.shape):
        raise InvalidSpec(
            f"{flag} has {len(shape)} dimensions, but input '{spec.name}' has rank {len(spec.shape)} "
            f"(declared shape {_format_shape(spec.shape)})"
        )
    for i, (want, got) in enumerate(zip(spec.shape, shape, strict=True)):
        if isinstance(want, int) and want != got:
            raise InvalidSpec(
                f"{flag}: dimension {i} of input '{spec.name}' is fixed to {want} by the model, "
                f"not {got} (declared shape {_format_shape(spec.shape)})"
            )
    return shape


def _tvm_frontends() -> ModuleType:
    """TVM's importers, through the gate (imported on first use: reading a signature needs no TVM)."""
    from kiln_tvm import frontends

    return frontends


def _conversion_error(
    err: Exception, importer: str, model_name: str, op: str | None, node_name: str | None
) -> KilnError:
    """Map an exception of a TVM importer to UnsupportedOperator (a form of an operator it lacks) or
    InvalidModel (anything else), keeping TVM's message."""
    detail = _short(err)
    if op is None:
        return InvalidModel(f"the {importer} importer could not convert '{model_name}': {detail}")
    if isinstance(err, NotImplementedError):  # includes tvm.error.OpNotImplemented
        typed = UnsupportedOperator(operators=[op], importer=importer)
        typed.message = f"{typed.message} as node '{node_name}' uses it: {detail}"
        typed.args = (typed.message,)
        return typed
    return InvalidModel(
        f"the {importer} importer could not convert node '{node_name}' ({op}) of '{model_name}': {detail}"
    )


@contextlib.contextmanager
def _quiet_importer(what: str) -> Iterator[None]:
    """Keep an importer's prints and warnings out of the user's terminal; log them at debug level."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for w in caught:
                log.debug("%s: %s", what, w.message)
            if out.getvalue().strip():
                log.debug("%s printed: %s", what, out.getvalue().strip()[:2000])


def _static_int(value: Any) -> int | None:
    from kiln_tvm import tvm

    return int(value.value) if isinstance(value, tvm.tirx.IntImm) else None


def _type_specs(name: str, ty: Any) -> list[TensorSpec]:
    """TensorSpecs of a Relax value's type (a tuple is flattened)."""
    from kiln_tvm import relax

    if isinstance(ty, relax.TensorType):
        shape = ty.shape
        if isinstance(shape, relax.ShapeExpr):
            dims: tuple[Dim, ...] = tuple(
                d if (d := _static_int(v)) is not None else str(v) for v in shape.values
            )
        elif ty.ndim >= 0:
            dims = tuple(f"dim{i}" for i in range(ty.ndim))
        else:
            dims = UNKNOWN_RANK
        return [TensorSpec(name=name, shape=dims, dtype=str(ty.dtype))]
    if isinstance(ty, relax.ShapeType):
        return [TensorSpec(name=name, shape=(int(ty.ndim),) if ty.ndim >= 0 else UNKNOWN_RANK, dtype="int64")]
    if isinstance(ty, relax.PrimType):
        return [TensorSpec(name=name, shape=(), dtype=str(ty.dtype))]
    if isinstance(ty, relax.TupleType):
        specs: list[TensorSpec] = []
        for i, field in enumerate(ty.fields):
            specs.extend(_type_specs(f"{name}.{i}", field))
        return specs
    return [TensorSpec(name=name, shape=(), dtype=type(ty).__name__)]


def _output_specs(mod: tvm.IRModule, names: list[str]) -> tuple[TensorSpec, ...]:
    """Outputs of ``main`` named after ``names`` (one per top-level result)."""
    from kiln_tvm import relax

    ret = mod["main"].ret_ty
    fields = list(ret.fields) if isinstance(ret, relax.TupleType) and len(names) != 1 else [ret]
    specs: list[TensorSpec] = []
    for i, ty in enumerate(fields):
        specs.extend(_type_specs(names[i] if i < len(names) else f"output_{i}", ty))
    return tuple(specs)


def _check_param_count(mod: tvm.IRModule, model_name: str, inputs: tuple[TensorSpec, ...]) -> None:
    params = mod["main"].params
    if len(params) != len(inputs):
        raise InvalidModel(
            f"importing '{model_name}' gave a function of {len(params)} inputs, but the model declares "
            f"{len(inputs)}: {', '.join(s.name for s in inputs)}"
        )


def _check_static_params(mod: tvm.IRModule, model_name: str, inputs: tuple[TensorSpec, ...]) -> None:
    from kiln_tvm import relax

    _check_param_count(mod, model_name, inputs)
    for param in mod["main"].params:
        ty = param.ty
        if (
            isinstance(ty, relax.TensorType)
            and isinstance(ty.shape, relax.ShapeExpr)
            and all(_static_int(v) is not None for v in ty.shape.values)
        ):
            continue
        raise InvalidModel(
            f"importing '{model_name}' left input '{param.name}' without a static shape ({ty}); "
            "give every input's shape with --input-shape"
        )


# --------------------------------------------------------------------------------------------------
# ONNX


_ONNX_HANDLED_OUTSIDE_MAP = frozenset({"If", "Constant"})  # converted by the importer's own loop
_ONNX_DTYPE_NAMES = {"object": "string"}


def _parse_onnx(path: Path, data: bytes) -> onnx.ModelProto:
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
            f"{what}: the file is truncated or corrupt ({len(data)} bytes; protobuf says: {_short(err)})"
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


def _check_onnx_opset(model: onnx.ModelProto, name: str) -> None:
    opset = _onnx_opset(model)
    if opset is None:
        raise InvalidModel(f"'{name}' does not declare an opset for the default ONNX domain")
    if opset < MIN_ONNX_OPSET:
        raise InvalidModel(
            f"'{name}' uses ONNX opset {opset}; Kiln imports opset {MIN_ONNX_OPSET} or newer. Convert it "
            'first: python -c "import onnx, onnx.version_converter as vc; '
            f"onnx.save(vc.convert_version(onnx.load('{name}'), 17), 'opset17.onnx')\""
        )


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
    kind = value.type.WhichOneof("value")
    if kind is None:
        return TensorSpec(name=value.name, shape=UNKNOWN_RANK, dtype="unknown")
    if kind != "tensor_type":
        what = kind.removesuffix("_type")
        raise InvalidModel(
            f"'{model_name}': '{value.name}' is a {what}, not a tensor; Kiln imports models whose inputs "
            "and outputs are tensors"
        )
    tensor = value.type.tensor_type
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


def _onnx_signature(model: onnx.ModelProto, model_name: str) -> ModelSignature:
    graph = model.graph
    initializers = {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}
    inputs = tuple(_onnx_value_spec(v, model_name) for v in graph.input if v.name not in initializers)
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
                f"'{path.name}': {_short(err)}"
            ) from None
        # load_external_data_for_tensor sets data_location=DEFAULT explicitly; clear it so the model
        # serializes to the same bytes as one saved with its weights inline.
        tensor.ClearField("data_location")
    return bool(tensors)


def _unsupported_onnx_ops(model: onnx.ModelProto) -> list[str]:
    supported = _tvm_frontends().onnx_convert_map().keys() | _ONNX_HANDLED_OUTSIDE_MAP
    return sorted({node.op_type for node in _onnx_nodes(model.graph) if node.op_type not in supported})


def _load_onnx(path: Path, given: dict[str, tuple[int, ...]], allow_external_data: bool) -> ImportedModel:
    import onnx

    data = path.read_bytes()
    model = _parse_onnx(path, data)
    _check_onnx_opset(model, path.name)
    if _inline_external_data(model, path, allow_external_data):
        try:
            canonical = model.SerializeToString()
        except ValueError as err:
            raise InvalidModel(
                f"'{path.name}' with its external data inlined is too large for one ONNX file "
                f"(protobuf's limit is 2 GiB): {_short(err)}"
            ) from None
    else:
        canonical = data

    if model.functions:
        try:
            import onnx.inliner

            model = onnx.inliner.inline_local_functions(model)
        except Exception as err:  # noqa: BLE001
            raise InvalidModel(
                f"could not inline the local functions of '{path.name}': {_short(err)}"
            ) from None

    unsupported = _unsupported_onnx_ops(model)
    if unsupported:
        raise UnsupportedOperator(operators=unsupported, importer="ONNX")

    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError) as err:
        raise InvalidModel(f"'{path.name}' is not a valid ONNX model: {_short(err)}") from None

    declared = _onnx_signature(model, path.name)
    shapes = _resolve_input_shapes(declared.inputs, given)
    dtypes = {spec.name: spec.dtype for spec in declared.inputs}
    bad = {n: d for n, d in dtypes.items() if d in ("unknown", "string")}
    if bad:
        name, dtype = next(iter(bad.items()))
        raise InvalidModel(
            f"'{path.name}': input '{name}' has element type '{dtype}', which Kiln cannot feed"
        )

    tvm_onnx = _tvm_frontends().onnx_importer()
    try:
        with _quiet_importer("ONNX importer"):
            mod = tvm_onnx.from_onnx(
                model,
                shape_dict={n: list(s) for n, s in shapes.items()},
                dtype_dict=dtypes,
                keep_params_in_input=False,
            )
    except Exception as err:  # noqa: BLE001 - every importer failure becomes a typed error
        node = _tvm_frontends().failed_onnx_node(err.__traceback__)
        op = getattr(node, "op_type", None)
        raise _conversion_error(err, "ONNX", path.name, op, getattr(node, "name", None)) from None

    _check_static_params(mod, path.name, declared.inputs)
    inputs = tuple(
        TensorSpec(name=spec.name, shape=shapes[spec.name], dtype=spec.dtype) for spec in declared.inputs
    )
    outputs = _output_specs(mod, [o.name for o in model.graph.output])
    return ImportedModel(
        mod=mod,
        signature=ModelSignature(inputs=inputs, outputs=outputs, declared_inputs=declared.inputs),
        format=ModelFormat.ONNX,
        sha256=hashlib.sha256(canonical).hexdigest(),
        canonical_bytes=canonical,
    )


# --------------------------------------------------------------------------------------------------
# PyTorch (torch.export)


def _import_torch() -> ModuleType:
    force_weights_only_load()  # before torch reads anything: its loaders' fallbacks stay restricted
    try:
        import torch
    except ImportError:
        raise MissingDependency(
            f"loading .pt2 programs needs PyTorch: pip install 'kiln[torch]' ({TORCH_PIN})"
        ) from None
    except OSError as err:  # a broken install (missing shared libraries)
        raise MissingDependency(
            f"loading .pt2 programs needs a working PyTorch ({TORCH_PIN}); importing it failed: {_short(err)}"
        ) from None
    return torch


def _load_torch_program(torch: ModuleType, path: Path, max_unpacked_bytes: int) -> Any:
    """``torch.export.load`` of an archive that passed :mod:`tuner.pt2_archive`'s checks, pickle disabled."""
    check_archive(path, max_unpacked_bytes)
    check_pickled_members(torch, path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.export.load(str(path))
    except Exception as err:  # noqa: BLE001 - zip, json, pickle and torch errors alike
        reason = "the zip archive is truncated or damaged" if isinstance(err, zipfile.BadZipFile) else ""
        detail = f"{reason} ({_short(err)})" if reason else _short(err)
        raise InvalidModel(
            f"could not read '{path.name}' as a torch.export program (torch.export.save): {detail}"
        ) from None


def _torch_output_names(count: int) -> list[str]:
    return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]


def _torch_tensor_spec(torch: ModuleType, name: str, value: Any, model_name: str) -> TensorSpec:
    if not isinstance(value, torch.Tensor):
        raise InvalidModel(
            f"'{model_name}': '{name}' is a {type(value).__name__}, not a tensor; Kiln imports programs "
            "whose inputs and outputs are tensors"
        )
    dims = tuple(int(d) if isinstance(d, int) else str(d) for d in value.shape)
    return TensorSpec(name=name, shape=dims, dtype=str(value.dtype).removeprefix("torch."))


def _torch_signature(program: Any, model_name: str) -> ModelSignature:
    torch = _import_torch()
    sig = program.graph_signature
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    inputs = tuple(
        _torch_tensor_spec(torch, name, placeholders[name].meta.get("val"), model_name)
        for name in sig.user_inputs
    )
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    values = (
        list(output_node.args[0]) if isinstance(output_node.args[0], tuple | list) else [output_node.args[0]]
    )
    kind = torch.export.graph_signature.OutputKind
    user = [
        v
        for v, spec in zip(values, sig.output_specs, strict=False)
        if spec.kind in (kind.USER_OUTPUT, kind.LOSS_OUTPUT)
    ]
    metas = [v.meta.get("val") if hasattr(v, "meta") else v for v in user]
    tensors = [m for m in metas if isinstance(m, torch.Tensor)]
    names = _torch_output_names(len(tensors))
    outputs = tuple(_torch_tensor_spec(torch, n, m, model_name) for n, m in zip(names, tensors, strict=True))
    return ModelSignature(inputs=inputs, outputs=outputs)


def _torch_example_shapes(
    torch: ModuleType, program: Any, names: tuple[str, ...]
) -> dict[str, tuple[int, ...]]:
    """Shapes of the sample inputs saved with the program (used only to suggest a --input-shape)."""
    try:
        args, kwargs = program.example_inputs
        flat = [*args, *kwargs.values()]
    except Exception:  # noqa: BLE001 - programs saved without sample inputs
        return {}
    if len(flat) != len(names) or not all(isinstance(t, torch.Tensor) for t in flat):
        return {}
    return {name: tuple(int(d) for d in t.shape) for name, t in zip(names, flat, strict=True)}


def _unsupported_torch_ops(torch: ModuleType, program: Any, convert_map: Mapping[str, Any]) -> list[str]:
    """Qualified names of every call_function target (in all graphs, cond branches included) that the
    importer's convert map lacks; the importer looks targets up by ``__name__``."""
    missing: set[str] = set()
    for module in program.graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            if node.op != "call_function":
                continue
            key = getattr(node.target, "__name__", str(node.target))
            if key not in convert_map:
                missing.add(str(node.target) if isinstance(node.target, torch._ops.OpOverload) else key)
    return sorted(missing)


def _bind_torch_shapes(
    mod: tvm.IRModule, inputs: tuple[TensorSpec, ...], shapes: Mapping[str, tuple[int, ...]]
) -> tvm.IRModule:
    """Replace the symbolic sizes of ``main``'s inputs by the given ones (BindSymbolicVars)."""
    from kiln_tvm import relax, tvm

    func = mod["main"]
    attrs = dict(func.attrs) if func.attrs is not None else {}
    lower = {str(k): int(v) for k, v in dict(attrs.get("tir_var_lower_bound", {})).items()}
    upper = {str(k): int(v) for k, v in dict(attrs.get("tir_var_upper_bound", {})).items()}
    binding: dict[Any, int] = {}
    origin: dict[str, str] = {}
    for param, spec in zip(func.params, inputs, strict=True):
        shape = shapes[spec.name]
        for i, (dim, size) in enumerate(zip(param.ty.shape.values, shape, strict=True)):
            if not isinstance(dim, tvm.tirx.Var):
                continue
            here = f"dimension {i} of input '{spec.name}'"
            if dim in binding and binding[dim] != size:
                raise InvalidSpec(
                    f"{origin[dim.name]} and {here} are the same size ('{dim.name}') in the program, but "
                    f"--input-shape gives {binding[dim]} and {size}"
                )
            lo, hi = lower.get(dim.name), upper.get(dim.name)
            if (lo is not None and size < lo) or (hi is not None and size > hi):
                bounds = f"{lo if lo is not None else 0}..{hi if hi is not None else 'inf'}"
                raise InvalidSpec(
                    f"--input-shape {spec.name}={_format_shape(shape)}: {here} ('{dim.name}') must be in "
                    f"{bounds}, the range the program was exported for"
                )
            binding[dim] = size
            origin.setdefault(dim.name, here)
    if binding:
        mod = relax.transform.BindSymbolicVars(binding, "main")(mod)
        func = mod["main"]
        for key in ("tir_var_lower_bound", "tir_var_upper_bound"):
            if func.attrs is not None and key in func.attrs:
                func = func.without_attr(key)
        mod["main"] = func
    for param, spec in zip(mod["main"].params, inputs, strict=True):
        got = tuple(_static_int(v) for v in param.ty.shape.values)
        if got != shapes[spec.name]:
            raise InvalidSpec(
                f"--input-shape {spec.name}={_format_shape(shapes[spec.name])} does not fit the program: "
                f"with the sizes given, input '{spec.name}' has shape "
                f"{_format_shape(d if d is not None else '?' for d in got)}"
            )
    return mod


def _load_torch(path: Path, given: dict[str, tuple[int, ...]], max_unpacked_bytes: int) -> ImportedModel:
    torch = _import_torch()
    program = _load_torch_program(torch, path, max_unpacked_bytes)
    data = path.read_bytes()
    declared = _torch_signature(program, path.name)

    tvm_torch = _tvm_frontends().torch_importer()
    try:
        with _quiet_importer("torch.export decomposition"):
            program = program.run_decompositions()
    except Exception as err:  # noqa: BLE001
        raise InvalidModel(
            f"could not decompose the program in '{path.name}' to core ATen: {_short(err)}"
        ) from None

    unsupported = _unsupported_torch_ops(torch, program, _tvm_frontends().torch_convert_map())
    if unsupported:
        raise UnsupportedOperator(operators=unsupported, importer="PyTorch")

    examples = _torch_example_shapes(torch, program, tuple(s.name for s in declared.inputs))
    shapes = _resolve_input_shapes(declared.inputs, given, examples)

    try:
        with _quiet_importer("PyTorch importer"):
            mod = tvm_torch.from_exported_program(
                program,
                keep_params_as_input=False,
                unwrap_unit_return_tuple=True,
                run_ep_decomposition=False,  # done above, so the operator check saw what gets converted
            )
    except Exception as err:  # noqa: BLE001 - every importer failure becomes a typed error
        node = _tvm_frontends().failed_torch_node(err.__traceback__)
        target = getattr(node, "target", None)
        op = str(target) if target is not None else None
        raise _conversion_error(err, "PyTorch", path.name, op, getattr(node, "name", None)) from None

    _check_param_count(mod, path.name, declared.inputs)
    mod = _bind_torch_shapes(mod, declared.inputs, shapes)
    _check_static_params(mod, path.name, declared.inputs)
    inputs = tuple(
        TensorSpec(name=spec.name, shape=shapes[spec.name], dtype=spec.dtype) for spec in declared.inputs
    )
    outputs = _output_specs(mod, _torch_output_names(len(declared.outputs)))
    return ImportedModel(
        mod=mod,
        signature=ModelSignature(inputs=inputs, outputs=outputs, declared_inputs=declared.inputs),
        format=ModelFormat.TORCH_EXPORT,
        sha256=hashlib.sha256(data).hexdigest(),
        canonical_bytes=data,
    )


__all__ = [
    "MIN_ONNX_OPSET",
    "check_given_shape",
    "UNKNOWN_RANK",
    "ImportedModel",
    "detect_format",
    "load_model",
    "parse_input_shapes",
    "read_signature",
]
