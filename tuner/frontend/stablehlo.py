"""JAX programs: StableHLO (from ``jax.export``) converted to a Relax ``main`` by Kiln's own importer.

TVM 0.27's StableHLO frontend does not run with current jaxlib, reads only the first function and one
result, and knows ~22 operations. This one reads the module with jaxlib's MLIR bindings
(:mod:`tuner.frontend.stablehlo_reader`), inlines ``func.call``, keeps constants as arrays (weights, bound
as Relax constants as ONNX initializers are) and every result, and converts the operations an MLP, a CNN
and a transformer block lower to. Operations it lacks are listed all at once before anything is
converted; a form of an operation it lacks (a transposed convolution, a gather that is not a row
lookup) is named with the node's source location.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tuner.entities import ModelFormat, ModelSignature, TensorSpec
from tuner.errors import InvalidSpec, UnsupportedOperator
from tuner.frontend.imported import ImportedModel, imported_model, output_names
from tuner.frontend.stablehlo_reader import Function, Op, Program, mlir_of_exported, read_program

IMPORTER = "StableHLO"
Converter = Callable[[Any, Op, list[Any]], Any]

_UNARY = {
    "stablehlo.exponential": "exp",
    "stablehlo.tanh": "tanh",
    "stablehlo.logistic": "sigmoid",
    "stablehlo.rsqrt": "rsqrt",
    "stablehlo.sqrt": "sqrt",
    "stablehlo.log": "log",
    "stablehlo.negate": "negative",
    "stablehlo.abs": "abs",
    "stablehlo.floor": "floor",
    "stablehlo.ceil": "ceil",
    "stablehlo.sign": "sign",
    "stablehlo.sine": "sin",
    "stablehlo.cosine": "cos",
    "stablehlo.round_nearest_even": "round",
    "stablehlo.is_finite": "isfinite",
}
_BINARY = {
    "stablehlo.add": "add",
    "stablehlo.subtract": "subtract",
    "stablehlo.multiply": "multiply",
    "stablehlo.divide": "divide",
    "stablehlo.maximum": "maximum",
    "stablehlo.minimum": "minimum",
    "stablehlo.power": "power",
}
_LOGICAL = {"stablehlo.and": "logical_and", "stablehlo.or": "logical_or", "stablehlo.xor": "logical_xor"}
_COMPARE = {
    "EQ": "equal",
    "NE": "not_equal",
    "LT": "less",
    "LE": "less_equal",
    "GT": "greater",
    "GE": "greater_equal",
}
#: A reduction's combiner -> (Relax reduction, Relax binary op to combine with a non-identity init).
_REDUCTIONS = {
    "stablehlo.add": ("sum", "add", 0.0),
    "stablehlo.maximum": ("max", "maximum", -math.inf),
    "stablehlo.minimum": ("min", "minimum", math.inf),
    "stablehlo.multiply": ("prod", "multiply", 1.0),
}


def load_jax(path: Path, fmt: ModelFormat, given: Mapping[str, tuple[int, ...]]) -> ImportedModel:
    """Import a ``.jax`` file (``jax.export`` serialized) or StableHLO MLIR (text or bytecode)."""
    data = path.read_bytes()
    program = read_jax_program(path, fmt, data)
    mod = convert_program(program, path.name)
    declared = program_signature(program)
    for name, shape in given.items():
        spec = next((s for s in declared.inputs if s.name == name), None)
        if spec is None:
            known = [s.name for s in declared.inputs]
            raise InvalidSpec(f"'{path.name}' has no input '{name}'; its inputs are {known}")
        if tuple(shape) != tuple(spec.shape):
            raise InvalidSpec(
                f"input '{name}' of '{path.name}' has the static shape {list(spec.shape)}; a JAX program is "
                "exported for one shape: export it again for another"
            )
    shapes = {s.name: tuple(int(d) for d in s.shape) for s in declared.inputs}
    outputs = [s.name for s in declared.outputs]
    return imported_model(
        mod, path.name, declared=declared, shapes=shapes, output_names=outputs, fmt=fmt, canonical=data
    )


def read_jax_program(path: Path, fmt: ModelFormat, data: bytes | None = None) -> Program:
    """The StableHLO program of a ``.jax`` or ``.mlir`` file, read (:mod:`tuner.frontend.stablehlo_reader`)."""
    data = path.read_bytes() if data is None else data
    mlir = mlir_of_exported(data, path.name) if fmt is ModelFormat.JAX_EXPORT else data
    return read_program(mlir, path.name)


def program_signature(program: Program) -> ModelSignature:
    """``main``'s inputs (named as jax named them: ``x``, else ``arg<i>``) and outputs."""
    main = program.functions[program.main]
    inputs = tuple(
        TensorSpec(name=n, shape=t.shape, dtype=t.dtype)
        for n, t in zip(_unique(main.param_names), main.param_types, strict=True)
    )
    names = output_names(len(main.result_types))
    outputs = tuple(
        TensorSpec(name=n, shape=t.shape, dtype=t.dtype)
        for n, t in zip(names, main.result_types, strict=True)
    )
    return ModelSignature(inputs=inputs, outputs=outputs)


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for i, name in enumerate(names):
        name = name if name and name.isidentifier() else f"arg{i}"
        out.append(name if name not in seen else f"{name}_{i}")
        seen[name] = i
    return out


def unsupported_ops(program: Program) -> list[str]:
    """Every operation of ``main`` and the functions it calls that Kiln does not convert."""
    missing: set[str] = set()
    for function in program.reachable():
        for op in function.ops:
            if op.name == "func.call":
                if op.attrs["callee"] not in program.functions:
                    missing.add(f"func.call of an undefined @{op.attrs['callee']}")
            elif op.name == "stablehlo.custom_call":
                missing.add(f"stablehlo.custom_call @{op.attrs.get('call_target_name', '?')}")
            elif op.name not in CONVERTERS:
                missing.add(op.name)
    return sorted(missing)


def convert_program(program: Program, model_name: str) -> Any:
    """Relax ``main`` of the program: calls inlined, constants bound, every result returned."""
    from kiln_tvm import relax

    missing = unsupported_ops(program)
    if missing:
        raise UnsupportedOperator(operators=missing, importer=IMPORTER)
    main = program.functions[program.main]
    names = [s.name for s in program_signature(program).inputs]
    params = [
        relax.Var(name, relax.TensorType(t.shape, t.dtype))
        for name, t in zip(names, main.param_types, strict=True)
    ]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            results = _inline(bb, program, main, params, model_name)
            output = bb.emit_output(results[0] if len(results) == 1 else relax.Tuple(results))
        bb.emit_func_output(output)
    return bb.get()


def _inline(bb: Any, program: Program, function: Function, args: list[Any], model_name: str) -> list[Any]:
    env: dict[int, Any] = dict(zip(function.params, args, strict=True))
    for op in function.ops:
        operands = [env[i] for i in op.operands]
        if op.name == "func.call":
            outs = _inline(bb, program, program.functions[op.attrs["callee"]], operands, model_name)
        else:
            try:
                out = CONVERTERS[op.name](bb, op, operands)
            except UnsupportedForm as err:
                where = f" at {op.location}" if op.location else ""
                reason = f": the form{where} in '{model_name}' is not supported: {err}"
                raise UnsupportedOperator(operators=[op.name], importer=IMPORTER, reason=reason) from None
            outs = list(out) if isinstance(out, list) else [out]
        for rid, value in zip(op.results, outs, strict=True):
            env[rid] = value
    return [env[i] for i in function.returns]


class UnsupportedForm(Exception):
    """An operation Kiln converts, in a form it does not (the message says which)."""


# ---- converters ------------------------------------------------------------------------------------


def _shape(x: Any) -> list[int]:
    return [int(d) for d in x.ty.shape]


def _emit(bb: Any, expr: Any) -> Any:
    return bb.emit(expr)


def _op() -> Any:
    from kiln_tvm import relax

    return relax.op


def _constant(bb: Any, op: Op, _: list[Any]) -> Any:
    from kiln_tvm import relax

    value: np.ndarray = op.attrs["value"]
    if value.dtype.name == "bfloat16":
        return bb.emit(_op().astype(relax.const(value.astype(np.float32)), "bfloat16"))
    return relax.const(value)


def _unary(name: str) -> Converter:
    return lambda bb, op, xs: _emit(bb, getattr(_op(), name)(xs[0]))


def _binary(name: str) -> Converter:
    return lambda bb, op, xs: _emit(bb, getattr(_op(), name)(xs[0], xs[1]))


def _logical(name: str) -> Converter:
    def convert(bb: Any, op: Op, xs: list[Any]) -> Any:
        if op.result_types[0].dtype != "bool":
            bitwise = {"logical_and": "bitwise_and", "logical_or": "bitwise_or", "logical_xor": "bitwise_xor"}
            return _emit(bb, getattr(_op(), bitwise[name])(xs[0], xs[1]))
        return _emit(bb, getattr(_op(), name)(xs[0], xs[1]))

    return convert


def _not(bb: Any, op: Op, xs: list[Any]) -> Any:
    if op.result_types[0].dtype == "bool":
        return _emit(bb, _op().logical_not(xs[0]))
    return _emit(bb, _op().bitwise_not(xs[0]))


def _compare(bb: Any, op: Op, xs: list[Any]) -> Any:
    return _emit(bb, getattr(_op(), _COMPARE[op.attrs["comparison_direction"]])(xs[0], xs[1]))


def _select(bb: Any, op: Op, xs: list[Any]) -> Any:
    return _emit(bb, _op().where(xs[0], xs[1], xs[2]))


def _clamp(bb: Any, op: Op, xs: list[Any]) -> Any:
    low, x, high = xs
    return _emit(bb, _op().minimum(_emit(bb, _op().maximum(x, low)), high))


def _expm1(bb: Any, op: Op, xs: list[Any]) -> Any:
    from kiln_tvm import relax

    one = relax.const(1.0, op.result_types[0].dtype)
    return _emit(bb, _op().subtract(_emit(bb, _op().exp(xs[0])), one))


def _log1p(bb: Any, op: Op, xs: list[Any]) -> Any:
    from kiln_tvm import relax

    one = relax.const(1.0, op.result_types[0].dtype)
    return _emit(bb, _op().log(_emit(bb, _op().add(xs[0], one))))


def _convert(bb: Any, op: Op, xs: list[Any]) -> Any:
    return _emit(bb, _op().astype(xs[0], op.result_types[0].dtype))


def _reshape(bb: Any, op: Op, xs: list[Any]) -> Any:
    return _emit(bb, _op().reshape(xs[0], op.result_types[0].shape))


def _transpose(bb: Any, op: Op, xs: list[Any]) -> Any:
    return _emit(bb, _op().permute_dims(xs[0], op.attrs["permutation"]))


def _broadcast_in_dim(bb: Any, op: Op, xs: list[Any]) -> Any:
    dims: list[int] = op.attrs["broadcast_dimensions"]
    out_shape = op.result_types[0].shape
    x = xs[0]
    in_shape = tuple(_shape(x))
    if dims != sorted(dims):  # put the operand's axes in the order of the result's first
        order = sorted(range(len(dims)), key=lambda i: dims[i])
        x = _emit(bb, _op().permute_dims(x, order))
        in_shape = tuple(in_shape[i] for i in order)
        dims = sorted(dims)
    expanded = [1] * len(out_shape)
    for size, dim in zip(in_shape, dims, strict=True):
        expanded[dim] = size
    if tuple(expanded) != in_shape:
        x = _emit(bb, _op().reshape(x, expanded))
    if tuple(expanded) == tuple(out_shape):
        return x
    return _emit(bb, _op().broadcast_to(x, out_shape))


def _concatenate(bb: Any, op: Op, xs: list[Any]) -> Any:
    from kiln_tvm import relax

    return _emit(bb, _op().concat(relax.Tuple(xs), axis=op.attrs["dimension"]))


def _slice(bb: Any, op: Op, xs: list[Any]) -> Any:
    start, limit = op.attrs["start_indices"], op.attrs["limit_indices"]
    strides = op.attrs.get("strides") or [1] * len(start)
    axes = list(range(len(start)))
    return _emit(bb, _op().strided_slice(xs[0], axes, start, limit, strides))


def _iota(bb: Any, op: Op, xs: list[Any]) -> Any:
    ty = op.result_types[0]
    dim = op.attrs["iota_dimension"]
    ramp = _emit(bb, _op().arange(0, ty.shape[dim], 1, ty.dtype))
    shape = [1] * len(ty.shape)
    shape[dim] = ty.shape[dim]
    ramp = _emit(bb, _op().reshape(ramp, shape))
    return ramp if tuple(shape) == ty.shape else _emit(bb, _op().broadcast_to(ramp, ty.shape))


def _dot_general(bb: Any, op: Op, xs: list[Any]) -> Any:
    """``dot_general`` as a matmul: each side permuted to (batch, free, contracted) / (batch, contracted,
    free) and flattened to 3-D where it is not already a plain matmul operand."""
    d = op.attrs["dot_dimension_numbers"]
    lhs, rhs = xs
    ls = _shape(lhs)
    rs = _shape(rhs)
    lb, rb, lc, rc = d["lhs_batch"], d["rhs_batch"], d["lhs_contract"], d["rhs_contract"]
    lf = [i for i in range(len(ls)) if i not in lb and i not in lc]
    rf = [i for i in range(len(rs)) if i not in rb and i not in rc]
    out = op.result_types[0]
    dtype = out.dtype
    if not lb and lc == [len(ls) - 1] and len(rs) == 2 and rf:
        # x[..., K] @ w[K, N] (or w[N, K]): a matmul over the leading dimensions, as ONNX models have it.
        w = rhs if rc == [0] else _emit(bb, _op().permute_dims(rhs, [1, 0]))
        return _emit(bb, _op().matmul(lhs, w, out_dtype=dtype))
    batch = [ls[i] for i in lb]
    m, k, n = math.prod(ls[i] for i in lf), math.prod(ls[i] for i in lc), math.prod(rs[i] for i in rf)
    left = _arranged(bb, lhs, lb + lf + lc, [*batch, m, k])
    right = _arranged(bb, rhs, rb + rc + rf, [*batch, k, n])
    product = _emit(bb, _op().matmul(left, right, out_dtype=dtype))
    return product if [*batch, m, n] == list(out.shape) else _emit(bb, _op().reshape(product, out.shape))


def _arranged(bb: Any, x: Any, order: list[int], shape: list[int]) -> Any:
    if order != sorted(order):
        x = _emit(bb, _op().permute_dims(x, order))
    if _shape(x) != shape:
        x = _emit(bb, _op().reshape(x, shape))
    return x


def _convolution(bb: Any, op: Op, xs: list[Any]) -> Any:
    d = op.attrs["dimension_numbers"]
    if len(d["input_spatial"]) != 2:
        raise UnsupportedForm(f"{len(d['input_spatial'])}-D convolution (Kiln converts 2-D ones)")
    if any(v != 1 for v in op.attrs.get("lhs_dilation") or []):
        raise UnsupportedForm("input dilation (a transposed convolution)")
    if op.attrs.get("batch_group_count", 1) != 1:
        raise UnsupportedForm("batch_group_count > 1")
    data_layout = _layout(4, {d["input_batch"]: "N", d["input_feature"]: "C"}, d["input_spatial"])
    kernel_layout = _layout(4, {d["kernel_output"]: "O", d["kernel_input"]: "I"}, d["kernel_spatial"])
    out_layout = _layout(4, {d["output_batch"]: "N", d["output_feature"]: "C"}, d["output_spatial"])
    padding = op.attrs.get("padding")
    pads = np.zeros((2, 2), dtype=int) if padding is None else np.asarray(padding).reshape(2, 2)
    data, weight = xs
    if data_layout not in ("NCHW", "NHWC"):
        raise UnsupportedForm(f"input layout {data_layout}")
    if kernel_layout not in ("OIHW", "HWIO", "OHWI"):
        weight = _emit(bb, _op().permute_dims(weight, [kernel_layout.index(c) for c in "OIHW"]))
        kernel_layout = "OIHW"
    return _emit(
        bb,
        _op().nn.conv2d(
            data,
            weight,
            strides=tuple(op.attrs.get("window_strides") or (1, 1)),
            padding=(int(pads[0][0]), int(pads[1][0]), int(pads[0][1]), int(pads[1][1])),
            dilation=tuple(op.attrs.get("rhs_dilation") or (1, 1)),
            groups=int(op.attrs.get("feature_group_count", 1)),
            data_layout=data_layout,
            kernel_layout=kernel_layout,
            out_layout=out_layout,
            out_dtype=op.result_types[0].dtype,
        ),
    )


def _layout(rank: int, named: dict[int, str], spatial: list[int]) -> str:
    letters = dict(named)
    letters.update({spatial[0]: "H", spatial[1]: "W"})
    return "".join(letters[i] for i in range(rank))


def _combiner(op: Op) -> str:
    body = [name for name in op.body if name != "stablehlo.return"]
    if len(body) != 1 or body[0] not in _REDUCTIONS:
        raise UnsupportedForm(f"a reduction whose body is {body} (Kiln converts add, max, min and multiply)")
    return body[0]


def _identity_init(init: Any, identity: float) -> bool:
    from kiln_tvm import tvm

    if not isinstance(init, tvm.ir.expr.Constant):
        return False
    value = init.value.numpy()
    return value.size == 1 and float(value.reshape(-1)[0]) == identity


def _reduce(bb: Any, op: Op, xs: list[Any]) -> Any:
    if len(xs) != 2:
        raise UnsupportedForm(f"a reduction of {len(xs) // 2} operands together (argmax-like)")
    reduction, combine, identity = _REDUCTIONS[_combiner(op)]
    x, init = xs
    axes = list(op.attrs["dimensions"])
    if op.result_types[0].dtype == "bool":
        x = _emit(bb, _op().astype(x, "int8"))
    reduced = _emit(bb, getattr(_op(), reduction)(x, axis=axes))
    if op.result_types[0].dtype == "bool":
        reduced = _emit(bb, _op().astype(reduced, "bool"))
    elif not _identity_init(init, identity):
        reduced = _emit(bb, getattr(_op(), combine)(reduced, init))
    return reduced


def _reduce_window(bb: Any, op: Op, xs: list[Any]) -> Any:
    """Max and sum pooling over two dimensions of a 4-D tensor."""
    combiner = _combiner(op)
    if combiner not in ("stablehlo.maximum", "stablehlo.add") or len(xs) != 2:
        raise UnsupportedForm("a window reduction other than max or sum pooling")
    x, init = xs
    window: list[int] = op.attrs["window_dimensions"]
    rank = len(window)
    strides = op.attrs.get("window_strides") or [1] * rank
    for key in ("base_dilations", "window_dilations"):
        if any(v != 1 for v in op.attrs.get(key) or []):
            raise UnsupportedForm(f"{key} other than 1")
    pooled = [i for i in range(rank) if window[i] != 1 or strides[i] != 1]
    padding = np.asarray(op.attrs.get("padding", np.zeros((rank, 2), dtype=int))).reshape(rank, 2)
    pooled = sorted(set(pooled) | {i for i in range(rank) if padding[i].any()})
    if rank != 4 or len(pooled) > 2:
        raise UnsupportedForm(f"pooling over dimensions {pooled} of a {rank}-D tensor")
    if len(pooled) == 2:
        spatial = pooled
    elif set(pooled) <= {1, 2}:
        spatial = [1, 2]
    else:
        spatial = [2, 3]
    rest = [i for i in range(rank) if i not in spatial]
    layout = _layout(4, {rest[0]: "N", rest[1]: "C"}, spatial)
    if layout not in ("NCHW", "NHWC"):
        raise UnsupportedForm(f"pooling in layout {layout}")
    size = tuple(window[i] for i in spatial)
    step = tuple(strides[i] for i in spatial)
    pads = (
        int(padding[spatial[0]][0]),
        int(padding[spatial[1]][0]),
        int(padding[spatial[0]][1]),
        int(padding[spatial[1]][1]),
    )
    if combiner == "stablehlo.maximum":
        if not _identity_init(init, -math.inf):
            raise UnsupportedForm("max pooling whose initial value is not -inf")
        return _emit(bb, _op().nn.max_pool2d(x, size, step, pads, layout=layout))
    if not _identity_init(init, 0.0):
        raise UnsupportedForm("sum pooling whose initial value is not 0")
    from kiln_tvm import relax

    mean = _emit(bb, _op().nn.avg_pool2d(x, size, step, pads, layout=layout, count_include_pad=True))
    return _emit(bb, _op().multiply(mean, relax.const(float(math.prod(size)), op.result_types[0].dtype)))


def _gather(bb: Any, op: Op, xs: list[Any]) -> Any:
    """A row lookup (``table[ids]``, ``jnp.take(table, ids, axis=0)``): an embedding."""
    d = op.attrs["dimension_numbers"]
    table, indices = xs
    ts = _shape(table)
    ids = _shape(indices)
    sizes = list(op.attrs["slice_sizes"])
    lookup = (
        d["collapsed_slice_dims"] == [0]
        and d["start_index_map"] == [0]
        and not d["operand_batching_dims"]
        and sizes == [1, *ts[1:]]
        and d["index_vector_dim"] == len(ids) - 1
        and ids[-1] == 1
        and d["offset_dims"] == list(range(len(ids) - 1, len(ids) - 1 + len(ts) - 1))
    )
    if not lookup:
        raise UnsupportedForm("a gather that is not a row lookup of a table")
    rows = _emit(bb, _op().reshape(indices, ids[:-1]))
    # StableHLO clamps start indices into the table, as "clip" does.
    return _emit(bb, _op().take(table, rows, axis=0, mode="clip"))


CONVERTERS: dict[str, Converter] = {
    "stablehlo.constant": _constant,
    **{name: _unary(relax_name) for name, relax_name in _UNARY.items()},
    **{name: _binary(relax_name) for name, relax_name in _BINARY.items()},
    **{name: _logical(relax_name) for name, relax_name in _LOGICAL.items()},
    "stablehlo.not": _not,
    "stablehlo.compare": _compare,
    "stablehlo.select": _select,
    "stablehlo.clamp": _clamp,
    "stablehlo.exponential_minus_one": _expm1,
    "stablehlo.log_plus_one": _log1p,
    "stablehlo.convert": _convert,
    "stablehlo.reshape": _reshape,
    "stablehlo.transpose": _transpose,
    "stablehlo.broadcast_in_dim": _broadcast_in_dim,
    "stablehlo.concatenate": _concatenate,
    "stablehlo.slice": _slice,
    "stablehlo.iota": _iota,
    "stablehlo.dot_general": _dot_general,
    "stablehlo.convolution": _convolution,
    "stablehlo.reduce": _reduce,
    "stablehlo.reduce_window": _reduce_window,
    "stablehlo.gather": _gather,
}
