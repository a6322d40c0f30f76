"""Read a StableHLO module (MLIR text, MLIR bytecode, or a serialized ``jax.export.Exported``) into plain
Python: functions of operations over numbered values, attributes as ints, lists and numpy arrays.

jaxlib's MLIR bindings parse the module; nothing else of them leaves this file, so the converter
(:mod:`tuner.frontend.stablehlo`) is plain code over :class:`Program`. jaxlib publishes no way to get a
context with the ``func`` dialect registered: :func:`_context` does what ``jax`` does itself, through
jaxlib's ``_jax_mlir_ext`` (the one private name used here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tuner.errors import InvalidModel, MissingDependency

JAX_PIN = "jax==0.10.2"

#: MLIR element types -> numpy dtype names.
_DTYPES = {
    "f64": "float64",
    "f32": "float32",
    "f16": "float16",
    "bf16": "bfloat16",
    "i64": "int64",
    "i32": "int32",
    "i16": "int16",
    "i8": "int8",
    "ui64": "uint64",
    "ui32": "uint32",
    "ui16": "uint16",
    "ui8": "uint8",
    "i1": "bool",
}


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str


@dataclass
class Op:
    """One operation: its name (``stablehlo.add``), operand and result value ids, attributes."""

    name: str
    operands: list[int]
    results: list[int]
    result_types: list[TensorType]
    attrs: dict[str, Any] = field(default_factory=dict)
    #: reduce / reduce_window: the operation names of the combiner region (``stablehlo.add``...).
    body: list[str] = field(default_factory=list)
    location: str = ""


@dataclass
class Function:
    name: str
    params: list[int]
    param_types: list[TensorType]
    param_names: list[str]
    ops: list[Op]
    returns: list[int]
    result_types: list[TensorType]


@dataclass
class Program:
    functions: dict[str, Function]
    main: str = "main"

    def reachable(self) -> list[Function]:
        """``main`` and every function it calls, directly or not."""
        seen: dict[str, Function] = {}
        todo = [self.main]
        while todo:
            name = todo.pop()
            if name in seen or name not in self.functions:
                continue
            seen[name] = self.functions[name]
            todo.extend(op.attrs["callee"] for op in self.functions[name].ops if op.name == "func.call")
        return list(seen.values())


def import_jax() -> Any:
    """jaxlib's MLIR modules (the ``jax`` extra)."""
    try:
        from jaxlib.mlir import ir  # noqa: F401
        from jaxlib.mlir.dialects import chlo, stablehlo  # noqa: F401
    except ImportError:
        raise MissingDependency(
            f"importing JAX programs needs JAX: pip install 'kiln-autotune[jax]' ({JAX_PIN})"
        ) from None
    import jaxlib.mlir

    return jaxlib.mlir


def _context() -> Any:
    from jaxlib.mlir import ir
    from jaxlib.mlir._mlir_libs import _jax_mlir_ext
    from jaxlib.mlir.dialects import chlo, stablehlo

    registry = ir.DialectRegistry()
    _jax_mlir_ext.register_dialects(registry)  # func and the other upstream dialects, as jax registers them
    context = ir.Context()
    context.append_dialect_registry(registry)
    context.load_all_available_dialects()
    stablehlo.register_dialect(context)
    chlo.register_dialect(context)
    # Attributes of other dialects (Shardy's sharding rules on custom calls...) are read as opaque ones:
    # an operation Kiln does not convert is then listed by name, not refused by the parser.
    context.allow_unregistered_dialects = True
    return context


def mlir_of_exported(data: bytes, model_name: str) -> str:
    """The StableHLO module (text) of a serialized ``jax.export.Exported`` (it keeps a versioned, portable
    form: ``mlir_module()`` turns it back into StableHLO)."""
    import_jax()
    try:
        from jax import export
    except ImportError:
        raise MissingDependency(
            f"reading .jax files needs JAX: pip install 'kiln-autotune[jax]' ({JAX_PIN})"
        ) from None
    try:
        exported = export.deserialize(bytearray(data))
    except Exception as err:  # noqa: BLE001 - flatbuffer and version errors alike
        raise InvalidModel(
            f"could not read '{model_name}' as a serialized jax.export program "
            f"(jax.export.export(jax.jit(f))(*specs).serialize()): {_first_line(err)}"
        ) from None
    if exported.nr_devices != 1:
        raise InvalidModel(f"'{model_name}' was exported for {exported.nr_devices} devices; Kiln takes one")
    if len(exported.platforms) != 1:
        # main then takes the platform's index as a first argument, and branches on it.
        raise InvalidModel(
            f"'{model_name}' was exported for the platforms {list(exported.platforms)}; export it for one "
            "(jax.export.export(f, platforms=['cpu']))"
        )
    return str(exported.mlir_module())


def read_program(data: bytes | str, model_name: str) -> Program:
    """Parse StableHLO (MLIR text or bytecode) into a :class:`Program`."""
    mlir = import_jax()
    ir = mlir.ir
    with _context():
        try:
            module = ir.Module.parse(data)
        except Exception as err:  # noqa: BLE001 - MLIRError with the parser's diagnostics
            raise InvalidModel(
                f"could not parse '{model_name}' as StableHLO MLIR: {_first_line(err)}"
            ) from None
        functions: dict[str, Function] = {}
        for op in module.body.operations:
            if op.operation.name == "func.func":
                function = _read_function(op, ir)
                functions[function.name] = function
    if "main" not in functions:
        raise InvalidModel(
            f"'{model_name}' has no function 'main' (it has {list(functions) or 'no functions'})"
        )
    return Program(functions)


def _first_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return " ".join(lines[:3])[:500] or type(err).__name__


def _read_function(func_op: Any, ir: Any) -> Function:
    name = str(func_op.attributes["sym_name"].value)
    block = func_op.regions[0].blocks[0]
    ids: dict[Any, int] = {}

    def value_id(value: Any) -> int:
        return ids.setdefault(value, len(ids))

    params = [value_id(a) for a in block.arguments]
    param_types = [_tensor_type(a.type, ir) for a in block.arguments]
    names = [_arg_name(i, a) for i, a in enumerate(block.arguments)]
    ops: list[Op] = []
    returns: list[int] = []
    for op in block.operations:
        name_ = op.operation.name
        if name_ == "func.return":
            returns = [value_id(v) for v in op.operands]
            continue
        ops.append(
            Op(
                name=name_,
                operands=[value_id(v) for v in op.operands],
                results=[value_id(r) for r in op.results],
                result_types=[_tensor_type(r.type, ir) for r in op.results],
                attrs=_attributes(op, ir),
                body=_region_ops(op),
                location=_location(op),
            )
        )
    function_type = func_op.attributes["function_type"].value
    results = [_tensor_type(t, ir) for t in function_type.results]
    return Function(name, params, param_types, names, ops, returns, results)


def _arg_name(index: int, arg: Any) -> str:
    """A parameter's name: the location jax gives it (``loc("x")``: the Python argument's name), else
    ``arg<index>``."""
    location = str(arg.location)
    if location.startswith('loc("') and location.endswith('")'):
        return location[5:-2]
    return f"arg{index}"


def _location(op: Any) -> str:
    text = str(op.location)
    return text[5:-2] if text.startswith('loc("') and text.endswith('")') else ""


def _tensor_type(ty: Any, ir: Any) -> TensorType:
    if not isinstance(ty, ir.RankedTensorType):
        raise InvalidModel(f"Kiln imports ranked tensors with static shapes; found {ty}")
    if not ty.has_static_shape:
        raise InvalidModel(f"Kiln imports static shapes; found {ty} (export with concrete shapes)")
    element = str(ty.element_type)
    if element not in _DTYPES:
        raise InvalidModel(f"element type {element} of {ty} is not one Kiln imports")
    return TensorType(tuple(int(d) for d in ty.shape), _DTYPES[element])


def _region_ops(op: Any) -> list[str]:
    names: list[str] = []
    for region in op.regions:
        for block in region.blocks:
            names.extend(o.operation.name for o in block.operations)
    return names


def _attributes(op: Any, ir: Any) -> dict[str, Any]:
    from jaxlib.mlir.dialects import stablehlo

    attrs: dict[str, Any] = {}
    for key in op.attributes:
        attr = op.attributes[key]
        if key == "value" and op.operation.name == "stablehlo.constant":
            attrs[key] = _dense_array(attr, _tensor_type(op.results[0].type, ir))
        elif (op.operation.name, key) in _DIMENSION_NUMBERS:
            kind, fields = _DIMENSION_NUMBERS[op.operation.name, key]
            numbers = getattr(stablehlo, kind)(attr)
            attrs[key] = {name: _plain_value(getattr(numbers, field)) for name, field in fields.items()}
        elif key == "comparison_direction":
            attrs[key] = str(stablehlo.ComparisonDirectionAttr(attr).value)
        elif key == "callee":
            attrs[key] = str(attr.value)
        else:
            attrs[key] = _plain(attr, ir)
    return attrs


#: (operation, attribute) -> jaxlib's class for it, and the fields Kiln reads (Kiln's name -> jaxlib's).
_DIMENSION_NUMBERS: dict[tuple[str, str], tuple[str, dict[str, str]]] = {
    ("stablehlo.convolution", "dimension_numbers"): (
        "ConvDimensionNumbers",
        {
            "input_batch": "input_batch_dimension",
            "input_feature": "input_feature_dimension",
            "input_spatial": "input_spatial_dimensions",
            "kernel_input": "kernel_input_feature_dimension",
            "kernel_output": "kernel_output_feature_dimension",
            "kernel_spatial": "kernel_spatial_dimensions",
            "output_batch": "output_batch_dimension",
            "output_feature": "output_feature_dimension",
            "output_spatial": "output_spatial_dimensions",
        },
    ),
    ("stablehlo.dot_general", "dot_dimension_numbers"): (
        "DotDimensionNumbers",
        {
            "lhs_batch": "lhs_batching_dimensions",
            "rhs_batch": "rhs_batching_dimensions",
            "lhs_contract": "lhs_contracting_dimensions",
            "rhs_contract": "rhs_contracting_dimensions",
        },
    ),
    ("stablehlo.gather", "dimension_numbers"): (
        "GatherDimensionNumbers",
        {
            "offset_dims": "offset_dims",
            "collapsed_slice_dims": "collapsed_slice_dims",
            "operand_batching_dims": "operand_batching_dims",
            "start_index_map": "start_index_map",
            "index_vector_dim": "index_vector_dim",
        },
    ),
}


def _plain_value(value: Any) -> Any:
    """An int, or a list of ints, from a dimension-numbers field."""
    return int(value) if isinstance(value, int) else [int(v) for v in value]


def _plain(attr: Any, ir: Any) -> Any:
    if isinstance(attr, ir.DenseI64ArrayAttr | ir.DenseBoolArrayAttr):
        return [v for v in attr]
    if isinstance(attr, ir.BoolAttr):
        return bool(attr.value)
    if isinstance(attr, ir.IntegerAttr):
        return int(attr.value)
    if isinstance(attr, ir.FloatAttr):
        return float(attr.value)
    if isinstance(attr, ir.StringAttr):
        return str(attr.value)
    if isinstance(attr, ir.DenseIntElementsAttr):
        return np.array(attr)
    return str(attr)


def _dense_array(attr: Any, ty: TensorType) -> np.ndarray:
    """A constant's value as a numpy array of its type."""
    dtype = _numpy_dtype(ty.dtype)
    if attr.is_splat:
        value = attr.get_splat_value()
        scalar = bool(value.value) if ty.dtype == "bool" else value.value
        return np.full(ty.shape, scalar, dtype=dtype)
    if ty.dtype in ("bfloat16", "bool"):
        # No buffer view for these: read the elements one by one (Kiln's models keep weights in f32).
        values = [float(v.value) if ty.dtype != "bool" else bool(v.value) for v in _elements(attr)]
        return np.array(values, dtype=dtype).reshape(ty.shape)
    return np.array(attr).astype(dtype, copy=False).reshape(ty.shape)


def _elements(attr: Any) -> list[Any]:
    return [attr[i] for i in range(len(attr))]


def _numpy_dtype(name: str) -> Any:
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(name)
