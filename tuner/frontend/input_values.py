"""Inputs bound to values when a model is registered: the axes, sizes, scales, pads or shape a graph takes
as an input (``Reshape``'s shape, ``ReduceSum``'s axes, ``Resize``'s sizes, ``TopK``'s k …) fixed, as
OpenVINO's model conversion freezes an input, so that the graph folds around them and compiles with
static shapes.

A bound input becomes a constant of the stored model and leaves its signature: the compiled model no
longer takes it. Given as JSON (a number, or nested lists), ``--input-value NAME=JSON`` on the command line
or the ``input_values`` field of an upload.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from tuner.entities import BoundInput, TensorSpec
from tuner.errors import InvalidSpec
from tuner.frontend.shapes import UNKNOWN_RANK

#: The most elements a bound input may have: parameters, not weights (a weight belongs in the model).
MAX_BOUND_ELEMENTS = 65536
#: The element types an input can be bound with (what JSON numbers and booleans convert to exactly).
_BINDABLE = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "bfloat16",
)


def parse_input_values(items: Iterable[str]) -> dict[str, Any]:
    """Parse ``--input-value`` arguments such as ``axes=[0,1]`` or ``k=3`` (the value is JSON)."""
    values: dict[str, Any] = {}
    for raw in items:
        name, sep, text = raw.partition("=")
        name = name.strip()
        if not sep or not name or not text.strip():
            raise InvalidSpec(f"bad --input-value {raw!r}: expected NAME=JSON, e.g. --input-value axes=[0,1]")
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidSpec(f"bad --input-value {raw!r}: the value is not JSON ({exc.msg})") from None
        if name in values:
            raise InvalidSpec(f"--input-value is given twice for input '{name}'")
        values[name] = value
    return values


def parse_input_values_json(text: str | None) -> dict[str, Any] | None:
    """``{"axes": [0, 1], "k": 3}`` as given in an upload's form field (None when empty)."""
    if text is None or not text.strip():
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidSpec(f'input_values is not valid JSON ({exc.msg}); e.g. {{"axes": [0, 1]}}') from None
    if not isinstance(data, dict):
        raise InvalidSpec('input_values must map input names to values, e.g. {"axes": [0, 1], "k": 3}')
    return {str(k): v for k, v in data.items()}


def bound_array(spec: TensorSpec, value: Any) -> np.ndarray:
    """``value`` (JSON: a number, a boolean or nested lists) as an array of input ``spec``'s type, checked
    against its declared rank and static dimensions; :class:`InvalidSpec` says what does not fit."""
    where = f"input_values['{spec.name}']"
    if spec.dtype not in _BINDABLE:
        raise InvalidSpec(f"{where}: input '{spec.name}' is {spec.dtype}; Kiln binds numeric inputs only")
    try:
        raw = np.asarray(value)
    except ValueError as exc:  # ragged nested lists
        raise InvalidSpec(f"{where} is not a rectangular array: {exc}") from None
    if raw.dtype == object or raw.dtype.kind not in "biuf":
        raise InvalidSpec(
            f"{where} must be a number or nested lists of numbers, got {json.dumps(value)[:80]}"
        )
    if raw.size > MAX_BOUND_ELEMENTS:
        raise InvalidSpec(
            f"{where} has {raw.size} elements; a bound input is a parameter of at most {MAX_BOUND_ELEMENTS} "
            "(a weight belongs in the model)"
        )
    array = raw.astype(_numpy_dtype(spec.dtype))
    if raw.dtype.kind == "f" and not np.isfinite(raw).all():
        raise InvalidSpec(f"{where} must be finite numbers")
    if raw.dtype.kind == "f" and array.dtype.kind in "iu" and not np.array_equal(array, raw):
        raise InvalidSpec(f"{where}: input '{spec.name}' is {spec.dtype}, but the values are not integers")
    declared = spec.shape
    if declared != UNKNOWN_RANK:
        if len(declared) != array.ndim:
            raise InvalidSpec(
                f"{where} has shape {list(array.shape)}; input '{spec.name}' has rank {len(declared)} "
                f"({list(declared)})"
            )
        for axis, (want, got) in enumerate(zip(declared, array.shape, strict=True)):
            if isinstance(want, int) and want != got:
                raise InvalidSpec(
                    f"{where} has shape {list(array.shape)}; input '{spec.name}' is {list(declared)} "
                    f"(dimension {axis} must be {want})"
                )
    return array


def _numpy_dtype(dtype: str) -> np.dtype:
    """numpy's type for an element type name (bfloat16 from ml_dtypes: numpy has none)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def bind_arrays(inputs: Iterable[TensorSpec], values: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Each of ``values`` as an array of its input's type (:func:`bound_array`); an unknown name is an
    :class:`InvalidSpec` listing the model's inputs."""
    specs = {spec.name: spec for spec in inputs}
    unknown = [name for name in values if name not in specs]
    if unknown:
        have = ", ".join(f"'{n}'" for n in specs) or "none"
        raise InvalidSpec(
            f"input_values names {unknown}, which the model does not take; its inputs are: {have}"
        )
    return {name: bound_array(specs[name], value) for name, value in values.items()}


def bound_inputs(arrays: Mapping[str, np.ndarray]) -> tuple[BoundInput, ...]:
    """What the model's signature keeps of its bound inputs: name, type, shape and values."""
    return tuple(BoundInput(name, str(a.dtype), tuple(a.shape), a.tolist()) for name, a in arrays.items())
