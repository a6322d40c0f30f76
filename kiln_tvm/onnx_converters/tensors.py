"""What Kiln's converters read of a Relax value: its static shape, its dtype, a constant's value; and the
reshaping of 3-D attention inputs into heads."""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln_tvm import relax


def static_shape(bb: Any, expr: Any) -> list[int]:
    """The shape of ``expr`` (normalized by ``bb``), every dimension an integer."""
    return [int(v.value) for v in bb.normalize(expr).ty.shape.values]


def constant(array: np.ndarray) -> Any:
    """A Relax constant of ``array`` in its own dtype (``relax.const`` makes a float64 array float32)."""
    return relax.const(array, str(array.dtype))


def constant_array(expr: Any) -> np.ndarray | None:
    """The value of a constant tensor (``tvm.ir.GenericConst``, what ``relax.const`` and the importer's
    initializers are), or None for a value computed at run time."""
    from kiln_tvm import tvm

    if isinstance(expr, tvm.ir.GenericConst):
        return expr.value.numpy()
    return None


def constant_int(expr: Any, what: str) -> int:
    """The integer a constant scalar (or one-element) input holds; a value computed at run time is refused
    with ``what`` named (bind it with ``--input-value``)."""
    value = constant_array(expr)
    if value is None or value.size != 1:
        raise ValueError(f"{what} computed at run time: Kiln needs it constant (bind it with --input-value)")
    return int(value.reshape(-1)[0])  # a float depth (OneHot) counts as its integer part


def dtype_of(bb: Any, expr: Any) -> str:
    """The element type of the tensor ``expr``."""
    return str(bb.normalize(expr).ty.dtype)


def heads_first(bb: Any, x: Any, heads: int) -> Any:
    """[batch, seq, heads * size] -> [batch, heads, seq, size]."""
    batch, seq, hidden = static_shape(bb, x)
    split = bb.normalize(relax.op.reshape(x, (batch, seq, heads, hidden // heads)))
    return bb.normalize(relax.op.permute_dims(split, [0, 2, 1, 3]))
