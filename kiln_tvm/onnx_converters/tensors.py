"""What Kiln's converters read of a Relax value whose shape is static: its shape, its dtype; and the
reshaping of 3-D attention inputs into heads."""

from __future__ import annotations

from typing import Any

from kiln_tvm import relax


def static_shape(bb: Any, expr: Any) -> list[int]:
    """The shape of ``expr`` (normalized by ``bb``), every dimension an integer."""
    return [int(v.value) for v in bb.normalize(expr).ty.shape.values]


def dtype_of(bb: Any, expr: Any) -> str:
    """The element type of the tensor ``expr``."""
    return str(bb.normalize(expr).ty.dtype)


def heads_first(bb: Any, x: Any, heads: int) -> Any:
    """[batch, seq, heads * size] -> [batch, heads, seq, size]."""
    batch, seq, hidden = static_shape(bb, x)
    split = bb.normalize(relax.op.reshape(x, (batch, seq, heads, hidden // heads)))
    return bb.normalize(relax.op.permute_dims(split, [0, 2, 1, 3]))
