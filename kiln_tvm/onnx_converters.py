"""ONNX operators TVM 0.27's importer lacks (or converts only in another form), added to its conversion
table without forking it.

TVM's ONNX importer looks each node's converter up in ``onnx_frontend._get_convert_map()``, a function it
calls per model; :func:`install` wraps that function so the table it returns also holds Kiln's
converters. They are ordinary ``OnnxOpConverter`` classes over Relax operators, and every model has static
shapes by the time it is converted (Kiln fixes them first), so masks and index tables are built as
constants.

* ``Attention`` (opset 23, 24): ONNX's own scaled dot-product attention, with grouped-query heads, 3-D or
  4-D inputs, boolean or additive masks, causal masking aligned to the end of a key cache, a past cache
  and the present outputs, softcap, and the optional fourth output. TVM's table holds the converter of
  Microsoft's contrib ``Attention`` (an input projection, a ``num_heads`` attribute) under the same name;
  a node with ``num_heads`` still goes there.
* ``LSTM``, ``GRU``, ``RNN``: unrolled over the static sequence, every direction and layout, peepholes,
  ``linear_before_reset``, ONNX's activations and ``clip``.
* ``DFT`` with a constant axis (a matmul with the DFT matrix: forward, inverse, one-sided, and back).
* ``RotaryEmbedding`` (opset 23): halves or interleaved pairs, partial rotation, position ids.
* ``RMSNormalization`` where TVM's legalization fails (every axis normalized, a broadcast scale).
* ``Swish``, ``SwiGLU``, ``Celu``, ``LpNormalization``, ``CumProd``, ``ReverseSequence``, ``BitCast``.

The training-only operators are not converted: :data:`TRAINING_OPERATORS` names them, so that a model
using one is refused as a training graph rather than as an importer gap.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from kiln_tvm import relax, tvm

#: Operators of ONNX's training domain and its loss functions: a model for inference does not use them.
TRAINING_OPERATORS = frozenset(
    {
        "Adagrad",
        "Adam",
        "Momentum",
        "Gradient",
        "NegativeLogLikelihoodLoss",
        "SoftmaxCrossEntropyLoss",
    }
)


def _static_shape(bb: Any, expr: Any) -> list[int]:
    return [int(v.value) for v in bb.normalize(expr).ty.shape.values]


def _dtype(bb: Any, expr: Any) -> str:
    return str(bb.normalize(expr).ty.dtype)


def _heads_first(bb: Any, x: Any, heads: int) -> Any:
    """[batch, seq, heads * size] -> [batch, heads, seq, size]."""
    batch, seq, hidden = _static_shape(bb, x)
    split = bb.normalize(relax.op.reshape(x, (batch, seq, heads, hidden // heads)))
    return bb.normalize(relax.op.permute_dims(split, [0, 2, 1, 3]))


def _base_converter() -> type:
    import importlib

    return importlib.import_module("tvm.relax.frontend.onnx").onnx_frontend.OnnxOpConverter


def _converters(tvm_map: dict[str, Any]) -> dict[str, type]:
    base = _base_converter()
    contrib_attention = tvm_map.get("Attention")

    class Attention(base):  # type: ignore[misc, valid-type]
        """ONNX ``Attention`` (opset 23+), as ``onnx.reference``'s implementation computes it."""

        @classmethod
        def _impl_v1(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            if contrib_attention is None:
                raise NotImplementedError("Microsoft's contrib Attention")
            return contrib_attention.get_converter(1)(bb, inputs, attr, params)

        @classmethod
        def _impl_v23(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            if "num_heads" in attr:  # Microsoft's contrib operator of the same name
                return cls._impl_v1(bb, inputs, attr, params)
            return _attention(bb, inputs, attr)

    class Swish(base):  # type: ignore[misc, valid-type]
        """``x * sigmoid(alpha * x)``."""

        @classmethod
        def _impl_v24(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            x = inputs[0]
            alpha = relax.const(float(attr.get("alpha", 1.0)), _dtype(bb, x))
            return relax.op.multiply(x, relax.op.sigmoid(relax.op.multiply(x, alpha)))

    class Celu(base):  # type: ignore[misc, valid-type]
        """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``."""

        @classmethod
        def _impl_v12(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            x = inputs[0]
            dtype = _dtype(bb, x)
            alpha = relax.const(float(attr.get("alpha", 1.0)), dtype)
            zero, one = relax.const(0.0, dtype), relax.const(1.0, dtype)
            negative = relax.op.multiply(
                alpha, relax.op.subtract(relax.op.exp(relax.op.divide(x, alpha)), one)
            )
            return relax.op.add(relax.op.maximum(x, zero), relax.op.minimum(negative, zero))

    class LpNormalization(base):  # type: ignore[misc, valid-type]
        """``x / ||x||_p`` along ``axis`` (p is 1 or 2); a zero norm gives 0, as onnxruntime does."""

        @classmethod
        def _impl_v1(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            x = inputs[0]
            axis, p = int(attr.get("axis", -1)), int(attr.get("p", 2))
            if p not in (1, 2):
                raise ValueError(f"LpNormalization with p={p}: ONNX allows 1 or 2")
            dtype = _dtype(bb, x)
            if p == 1:
                norm = relax.op.sum(relax.op.abs(x), axis=[axis], keepdims=True)
            else:
                norm = relax.op.sqrt(relax.op.sum(relax.op.multiply(x, x), axis=[axis], keepdims=True))
            norm = bb.normalize(norm)
            zero = relax.const(0.0, dtype)
            safe = relax.op.where(relax.op.equal(norm, zero), relax.const(1.0, dtype), norm)
            return relax.op.divide(x, safe)

    class CumProd(base):  # type: ignore[misc, valid-type]
        """Cumulative product along a constant axis, ``exclusive`` and ``reverse`` as ONNX defines them."""

        @classmethod
        def _impl_v26(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            x, axis_expr = inputs[0], inputs[1]
            if not isinstance(axis_expr, tvm.ir.expr.Constant):
                raise ValueError("CumProd with an axis computed at run time: Kiln needs it constant")
            shape = _static_shape(bb, x)
            axis = int(axis_expr.data.numpy().reshape(-1)[0]) % len(shape)
            out = relax.op.flip(x, axis) if attr.get("reverse", 0) else x
            out = bb.normalize(relax.op.cumprod(out, axis=axis, dtype=_dtype(bb, x)))
            if attr.get("exclusive", 0):
                ones = relax.const(np.ones([*shape[:axis], 1, *shape[axis + 1 :]], dtype=_dtype(bb, x)))
                kept = relax.op.strided_slice(out, axes=[axis], begin=[0], end=[shape[axis] - 1])
                out = relax.op.concat([ones, kept], axis=axis)
            return relax.op.flip(out, axis) if attr.get("reverse", 0) else out

    class ReverseSequence(base):  # type: ignore[misc, valid-type]
        """Each batch entry's first ``sequence_lens[b]`` steps reversed (the lengths as a tensor input)."""

        @classmethod
        def _impl_v10(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            x, lens = inputs[0], inputs[1]
            time_axis, batch_axis = int(attr.get("time_axis", 0)), int(attr.get("batch_axis", 1))
            shape = _static_shape(bb, x)
            steps, batch = shape[time_axis], shape[batch_axis]
            # index[t, b] = lens[b] - 1 - t where t < lens[b], else t: gathered along the time axis.
            t = relax.const(np.arange(steps).reshape(steps, 1), "int64")
            lens64 = bb.normalize(relax.op.reshape(relax.op.astype(lens, "int64"), (1, batch)))
            reversed_index = relax.op.subtract(relax.op.subtract(lens64, relax.const(1, "int64")), t)
            index = bb.normalize(
                relax.op.where(relax.op.less(t, lens64), reversed_index, t)
            )  # [steps, batch]
            if time_axis > batch_axis:
                index = bb.normalize(relax.op.permute_dims(index, [1, 0]))
            index_shape = [1] * len(shape)
            index_shape[time_axis], index_shape[batch_axis] = steps, batch
            index = relax.op.broadcast_to(bb.normalize(relax.op.reshape(index, index_shape)), shape)
            return relax.op.gather_elements(x, index, axis=time_axis)

    tvm_rms_norm = tvm_map.get("RMSNormalization")

    class RMSNormalization(base):  # type: ignore[misc, valid-type]
        """TVM's converter (``relax.nn.rms_norm``) where the scale has the normalized axes' shape; else
        (a scale that broadcasts, or every axis normalized: TVM's legalization fails on both), the formula:
        ``x / sqrt(mean(x^2 over axis..) + epsilon) * scale``, in float32 when ``stash_type`` asks."""

        @classmethod
        def _impl_v23(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            x, scale = bb.normalize(inputs[0]), bb.normalize(inputs[1])
            shape, scale_shape = _static_shape(bb, x), _static_shape(bb, scale)
            axis = int(attr.get("axis", -1)) % len(shape)
            if axis > 0 and scale_shape == shape[axis:] and tvm_rms_norm is not None:
                return tvm_rms_norm.get_converter(23)(bb, inputs, attr, params)
            dtype = _dtype(bb, x)
            wide = "float32" if int(attr.get("stash_type", 1)) == 1 and dtype != "float32" else dtype
            xw = bb.normalize(relax.op.astype(x, wide)) if wide != dtype else x
            mean_square = relax.op.mean(
                relax.op.multiply(xw, xw), axis=list(range(axis, len(shape))), keepdims=True
            )
            eps = relax.const(float(attr.get("epsilon", 1e-5)), wide)
            normed = relax.op.divide(xw, relax.op.sqrt(relax.op.add(mean_square, eps)))
            scale_w = relax.op.astype(scale, wide) if wide != dtype else scale
            out = relax.op.multiply(normed, scale_w)
            return relax.op.astype(out, dtype) if wide != dtype else out

    class LSTM(base):  # type: ignore[misc, valid-type]
        """ONNX ``LSTM``, unrolled over the static sequence (see :func:`_recurrent`)."""

        @classmethod
        def _impl_v7(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            return _recurrent(bb, "LSTM", inputs, attr)

    class GRU(base):  # type: ignore[misc, valid-type]
        """ONNX ``GRU``, unrolled over the static sequence (see :func:`_recurrent`)."""

        @classmethod
        def _impl_v7(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            return _recurrent(bb, "GRU", inputs, attr)

    class RNN(base):  # type: ignore[misc, valid-type]
        """ONNX ``RNN``, unrolled over the static sequence (see :func:`_recurrent`)."""

        @classmethod
        def _impl_v7(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            return _recurrent(bb, "RNN", inputs, attr)

    class RotaryEmbedding(base):  # type: ignore[misc, valid-type]
        """ONNX ``RotaryEmbedding`` (opset 23), as ``onnx.reference`` computes it: the first
        ``rotary_embedding_dim`` features of each head rotated by the cached angles (gathered by
        ``position_ids`` when given), in halves or interleaved pairs."""

        @classmethod
        def _impl_v23(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            return _rotary_embedding(bb, inputs, attr)

    class SwiGLU(base):  # type: ignore[misc, valid-type]
        """``a * sigmoid(alpha * a) * b`` (inputs of one shape)."""

        @classmethod
        def _impl_v1(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            a, b = inputs[0], inputs[1]
            alpha = relax.const(float(attr.get("alpha", 1.0)), _dtype(bb, a))
            return relax.op.multiply(relax.op.multiply(a, relax.op.sigmoid(relax.op.multiply(alpha, a))), b)

    class BitCast(base):  # type: ignore[misc, valid-type]
        """The same bits read as another type of the same width (``topi.reinterpret``)."""

        @classmethod
        def _impl_v1(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            from onnx import helper

            x = inputs[0]
            to = str(np.dtype(helper.tensor_dtype_to_np_dtype(int(attr["to"]))))
            if to == "bool":
                raise ValueError("BitCast to bool")
            if _dtype(bb, x) == "bool":  # one byte holding 0 or 1, as numpy stores it
                x = bb.normalize(relax.op.astype(x, "uint8"))
            if np.dtype(_dtype(bb, x)).itemsize != np.dtype(to).itemsize:
                raise ValueError(f"BitCast from {_dtype(bb, x)} to {to}: the widths differ")
            return bb.emit_te(tvm.topi.reinterpret, x, to)

    class DFT(base):  # type: ignore[misc, valid-type]
        """ONNX ``DFT`` with its axis an attribute (opset 17-19) or a constant, and no ``dft_length``: a
        matmul with the (static) DFT matrix, see :func:`_dft`."""

        @classmethod
        def _impl_v17(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            if inputs[1] is not None:
                raise ValueError("DFT with a dft_length input")
            return _dft(bb, inputs[0], int(attr.get("axis", 1)), attr)

        @classmethod
        def _impl_v20(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            axis = inputs[2]
            if inputs[1] is not None or (axis is not None and not isinstance(axis, tvm.ir.expr.Constant)):
                raise ValueError("DFT with a dft_length input, or an axis computed at run time")
            value = int(axis.data.numpy().reshape(-1)[0]) if axis is not None else -2
            return _dft(bb, inputs[0], value, attr)

    return {
        "DFT": DFT,
        "SwiGLU": SwiGLU,
        "BitCast": BitCast,
        "RotaryEmbedding": RotaryEmbedding,
        "LSTM": LSTM,
        "GRU": GRU,
        "RNN": RNN,
        "RMSNormalization": RMSNormalization,
        "Attention": Attention,
        "Swish": Swish,
        "Celu": Celu,
        "LpNormalization": LpNormalization,
        "CumProd": CumProd,
        "ReverseSequence": ReverseSequence,
    }


def _dft(bb: Any, x: Any, axis: int, attr: dict[str, Any]) -> Any:
    """The DFT of ``x`` [..., n, ..., 1 or 2] (real, or real and imaginary parts) along ``axis``: forward,
    inverse (divided by n), one-sided (the first n // 2 + 1 frequencies) and the inverse of a one-sided
    spectrum (a real signal of 2 (m - 1) samples, as ``numpy.fft.irfft``)."""
    op = relax.op
    x = bb.normalize(x)
    shape, dtype = _static_shape(bb, x), _dtype(bb, x)
    rank = len(shape)
    axis %= rank
    inverse, onesided = bool(attr.get("inverse", 0)), bool(attr.get("onesided", 0))

    def component(index: int) -> Any:
        part = op.strided_slice(x, axes=[rank - 1], begin=[index], end=[index + 1])
        return bb.normalize(op.squeeze(part, [rank - 1]))

    real = component(0)
    imag = component(1) if shape[-1] == 2 else None
    order = [i for i in range(rank - 1) if i != axis] + [axis]  # the signal axis last, for a matmul
    back = list(np.argsort(order))
    real = bb.normalize(op.permute_dims(real, order))
    imag = bb.normalize(op.permute_dims(imag, order)) if imag is not None else None
    n = shape[axis]
    if inverse and onesided:  # one-sided spectrum of m bins -> 2 (m - 1) real samples
        size = 2 * (n - 1)
        angle = 2 * np.pi * np.outer(np.arange(n), np.arange(size)) / size
        weight = np.full((n, 1), 2.0)
        weight[0] = weight[-1] = 1.0
        cos_m, sin_m = weight * np.cos(angle) / size, weight * np.sin(angle) / size
        out = op.matmul(real, relax.const(cos_m.astype(dtype)))
        if imag is not None:
            out = op.subtract(out, op.matmul(imag, relax.const(sin_m.astype(dtype))))
        parts = [bb.normalize(out)]
    else:
        bins = n // 2 + 1 if onesided else n
        angle = 2 * np.pi * np.outer(np.arange(n), np.arange(bins)) / n
        scale = 1.0 / n if inverse else 1.0
        cos_m = relax.const((np.cos(angle) * scale).astype(dtype))
        sin_m = relax.const((np.sin(angle) * scale).astype(dtype))
        sign = 1.0 if inverse else -1.0  # e^{-i angle} forward, e^{+i angle} inverse
        out_real = op.matmul(real, cos_m)
        out_imag = op.multiply(relax.const(sign, dtype), op.matmul(real, sin_m))
        if imag is not None:
            out_real = op.subtract(out_real, op.multiply(relax.const(sign, dtype), op.matmul(imag, sin_m)))
            out_imag = op.add(out_imag, op.matmul(imag, cos_m))
        parts = [bb.normalize(out_real), bb.normalize(out_imag)]
    parts = [bb.normalize(op.permute_dims(p, [int(i) for i in back])) for p in parts]
    return op.stack(parts, axis=rank - 1)


def _rotary_embedding(bb: Any, inputs: Any, attr: dict[str, Any]) -> Any:
    op = relax.op
    x, cos, sin, positions = (bb.normalize(v) if v is not None else None for v in inputs[:4])
    shape = _static_shape(bb, x)
    if len(shape) == 4:  # [batch, heads, seq, head] -> [batch, seq, heads, head]
        x = bb.normalize(op.permute_dims(x, [0, 2, 1, 3]))
    else:
        heads = int(attr["num_heads"])
        x = bb.normalize(op.reshape(x, (shape[0], shape[1], heads, shape[2] // heads)))
    batch, seq, heads, head = _static_shape(bb, x)
    dim = int(attr.get("rotary_embedding_dim", 0)) or head
    if positions is not None:  # caches [max_position, dim / 2] gathered to [batch, seq, dim / 2]
        cos, sin = op.take(cos, positions, axis=0), op.take(sin, positions, axis=0)
    cos = bb.normalize(op.expand_dims(cos, 2))
    sin = bb.normalize(op.expand_dims(sin, 2))
    rotate = bb.normalize(op.strided_slice(x, axes=[3], begin=[0], end=[dim]))
    if int(attr.get("interleaved", 0)):
        pairs = bb.normalize(op.reshape(rotate, (batch, seq, heads, dim // 2, 2)))
        x1 = bb.normalize(op.squeeze(op.strided_slice(pairs, axes=[4], begin=[0], end=[1]), [4]))
        x2 = bb.normalize(op.squeeze(op.strided_slice(pairs, axes=[4], begin=[1], end=[2]), [4]))
    else:
        x1 = bb.normalize(op.strided_slice(rotate, axes=[3], begin=[0], end=[dim // 2]))
        x2 = bb.normalize(op.strided_slice(rotate, axes=[3], begin=[dim // 2], end=[dim]))
    real = bb.normalize(op.subtract(op.multiply(cos, x1), op.multiply(sin, x2)))
    imag = bb.normalize(op.add(op.multiply(sin, x1), op.multiply(cos, x2)))
    if int(attr.get("interleaved", 0)):
        rotated = op.reshape(op.stack([real, imag], axis=4), (batch, seq, heads, dim))
    else:
        rotated = op.concat([real, imag], axis=3)
    rotated = bb.normalize(rotated)
    if dim < head:
        rotated = bb.normalize(
            op.concat([rotated, op.strided_slice(x, axes=[3], begin=[dim], end=[head])], axis=3)
        )
    if len(shape) == 4:
        return op.permute_dims(rotated, [0, 2, 1, 3])
    return op.reshape(rotated, shape)


#: Gates per cell, and the default activations of one direction (ONNX's operator definitions).
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
#: Activations that take alpha (and beta), with ONNX's defaults for them.
_ACTIVATION_PARAMS = {
    "Affine": (1.0, 0.0),
    "LeakyRelu": (0.01, None),
    "ThresholdedRelu": (1.0, None),
    "ScaledTanh": (1.0, 1.0),
    "HardSigmoid": (0.2, 0.5),
    "Elu": (1.0, None),
}


def _activation(name: str, alpha: float | None, beta: float | None, dtype: str) -> Any:
    def c(value: float) -> Any:
        return relax.const(value, dtype)

    def f(x: Any) -> Any:
        op = relax.op
        if name == "Sigmoid":
            return op.sigmoid(x)
        if name == "Tanh":
            return op.tanh(x)
        if name == "Relu":
            return op.nn.relu(x)
        if name == "Affine":
            return op.add(op.multiply(c(alpha), x), c(beta))
        if name == "LeakyRelu":
            return op.where(op.less(x, c(0.0)), op.multiply(c(alpha), x), x)
        if name == "ThresholdedRelu":
            return op.where(op.greater(x, c(alpha)), x, c(0.0))
        if name == "ScaledTanh":
            return op.multiply(c(alpha), op.tanh(op.multiply(c(beta), x)))
        if name == "HardSigmoid":
            return op.clip(op.add(op.multiply(c(alpha), x), c(beta)), 0.0, 1.0)
        if name == "Elu":
            return op.where(op.less(x, c(0.0)), op.multiply(c(alpha), op.subtract(op.exp(x), c(1.0))), x)
        if name == "Softsign":
            return op.divide(x, op.add(op.abs(x), c(1.0)))
        if name == "Softplus":
            return op.log(op.add(op.exp(x), c(1.0)))
        raise ValueError(f"activation {name!r} of a recurrent operator")

    return f


def _recurrent(bb: Any, kind: str, inputs: Any, attr: dict[str, Any]) -> Any:
    """``LSTM``, ``GRU`` or ``RNN`` as ONNX defines them, unrolled over the (static) sequence: the input
    projections of every step in one matmul per direction, then per step the recurrent matmul and the
    gates. Outputs ``Y`` [seq, directions, batch, hidden], ``Y_h`` (and ``Y_c``), in ``layout`` 0 or 1.
    ``sequence_lens`` given at run time is honoured for the forward direction (a step past an entry's length
    keeps its state and outputs zeros); for the reverse one it is refused."""
    op = relax.op
    x, w, r, b, lens = (bb.normalize(v) if v is not None else None for v in inputs[:5])
    h0 = inputs[5]
    c0, peep = (inputs[6], inputs[7]) if kind == "LSTM" else (None, None)
    batch_first = int(attr.get("layout", 0)) == 1
    if batch_first:
        x = bb.normalize(op.permute_dims(x, [1, 0, 2]))
        h0 = bb.normalize(op.permute_dims(h0, [1, 0, 2])) if h0 is not None else None
        c0 = bb.normalize(op.permute_dims(c0, [1, 0, 2])) if c0 is not None else None
    seq, batch, _ = _static_shape(bb, x)
    dtype = _dtype(bb, x)
    gates = _GATES[kind]
    direction = attr.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else str(direction)
    directions = ["forward", "reverse"] if direction == "bidirectional" else [direction]
    hidden = int(attr.get("hidden_size") or _static_shape(bb, w)[1] // gates)
    names = [a.decode() if isinstance(a, bytes) else str(a) for a in attr.get("activations", ())]
    names = names or list(_DEFAULT_ACTIVATIONS[kind]) * len(directions)
    alphas, betas = list(attr.get("activation_alpha", ())), list(attr.get("activation_beta", ()))
    acts = []
    for name in names:
        alpha, beta = _ACTIVATION_PARAMS.get(name, (None, None))
        if name in _ACTIVATION_PARAMS:
            alpha = float(alphas.pop(0)) if alphas else alpha
            if beta is not None:
                beta = float(betas.pop(0)) if betas else beta
        acts.append(_activation(name, alpha, beta, dtype))
    per_direction = len(_DEFAULT_ACTIVATIONS[kind])
    clip = attr.get("clip")
    linear_before_reset = int(attr.get("linear_before_reset", 0))
    if lens is not None and "reverse" in directions:
        raise ValueError(f"{kind} in reverse with sequence_lens given at run time")
    lens64 = bb.normalize(op.reshape(op.astype(lens, "int64"), (batch, 1))) if lens is not None else None

    def part(expr: Any, index: int, count: int = hidden, axis: int = 1) -> Any:
        return bb.normalize(
            op.strided_slice(expr, axes=[axis], begin=[index * count], end=[(index + 1) * count])
        )

    def pre(expr: Any) -> Any:  # the clip ONNX applies to an activation's input
        return op.clip(expr, -float(clip), float(clip)) if clip is not None else expr

    ys, last_h, last_c = [], [], []
    for d, way in enumerate(directions):
        f, g, h_act = (acts[d * per_direction + i] if i < per_direction else None for i in range(3))
        w_t = bb.normalize(op.permute_dims(op.take(w, relax.const(d, "int64"), axis=0), [1, 0]))  # [in, G*h]
        r_d = bb.normalize(op.take(r, relax.const(d, "int64"), axis=0))  # [G*h, h]
        b_d = bb.normalize(op.take(b, relax.const(d, "int64"), axis=0)) if b is not None else None
        w_bias = part(b_d, 0, gates * hidden, 0) if b_d is not None else None
        r_bias = part(b_d, 1, gates * hidden, 0) if b_d is not None else None
        projected = bb.normalize(op.matmul(x, w_t))  # [seq, batch, G*h]
        if w_bias is not None:
            projected = bb.normalize(op.add(projected, w_bias))
        zeros = relax.const(np.zeros((batch, hidden), dtype=dtype))
        h = bb.normalize(op.take(h0, relax.const(d, "int64"), axis=0)) if h0 is not None else zeros
        c = bb.normalize(op.take(c0, relax.const(d, "int64"), axis=0)) if c0 is not None else zeros
        p_d = bb.normalize(op.take(peep, relax.const(d, "int64"), axis=0)) if peep is not None else None
        out: list[Any] = [None] * seq
        for t in range(seq) if way == "forward" else reversed(range(seq)):
            x_t = bb.normalize(op.squeeze(op.strided_slice(projected, axes=[0], begin=[t], end=[t + 1]), [0]))
            if kind == "GRU":
                z_r = bb.normalize(
                    op.add(
                        part(x_t, 0, 2 * hidden),
                        op.matmul(h, op.permute_dims(part(r_d, 0, 2 * hidden, 0), [1, 0])),
                    )
                )
                if r_bias is not None:
                    z_r = bb.normalize(op.add(z_r, part(r_bias, 0, 2 * hidden, 0)))
                z, reset = f(pre(part(z_r, 0))), f(pre(part(z_r, 1)))
                r_h = op.permute_dims(part(r_d, 2, hidden, 0), [1, 0])
                rb_h = part(r_bias, 2, hidden, 0) if r_bias is not None else None
                if linear_before_reset:
                    recur = op.matmul(h, r_h)
                    recur = op.add(recur, rb_h) if rb_h is not None else recur
                    cand_in = op.add(part(x_t, 2), op.multiply(reset, recur))
                else:
                    cand_in = op.add(part(x_t, 2), op.matmul(op.multiply(reset, h), r_h))
                    cand_in = op.add(cand_in, rb_h) if rb_h is not None else cand_in
                cand = g(pre(cand_in))
                new_h = bb.normalize(
                    op.add(op.multiply(op.subtract(relax.const(1.0, dtype), z), cand), op.multiply(z, h))
                )
                new_c = c
            else:
                all_gates = op.add(x_t, op.matmul(h, op.permute_dims(r_d, [1, 0])))
                all_gates = bb.normalize(op.add(all_gates, r_bias) if r_bias is not None else all_gates)
                if kind == "RNN":
                    new_h, new_c = bb.normalize(f(pre(all_gates))), c
                else:  # gates in ONNX's order i, o, f, c; peepholes i, o, f
                    i_in, o_in, f_in, c_in = (part(all_gates, k) for k in range(4))
                    if p_d is not None:
                        i_in = op.add(i_in, op.multiply(part(p_d, 0, hidden, 0), c))
                        f_in = op.add(f_in, op.multiply(part(p_d, 2, hidden, 0), c))
                    if int(attr.get("input_forget", 0)):
                        forget = op.subtract(relax.const(1.0, dtype), f(pre(i_in)))
                    else:
                        forget = f(pre(f_in))
                    new_c = bb.normalize(
                        op.add(op.multiply(forget, c), op.multiply(f(pre(i_in)), g(pre(c_in))))
                    )
                    if p_d is not None:
                        o_in = op.add(o_in, op.multiply(part(p_d, 1, hidden, 0), new_c))
                    new_h = bb.normalize(op.multiply(f(pre(o_in)), h_act(new_c)))
            if lens64 is not None:  # past an entry's length: its state held, its output zero
                live = op.less(relax.const(t, "int64"), lens64)
                out[t] = bb.normalize(op.where(live, new_h, zeros))
                h, c = bb.normalize(op.where(live, new_h, h)), bb.normalize(op.where(live, new_c, c))
            else:
                out[t] = h = new_h
                c = new_c
        ys.append(bb.normalize(op.stack(out, axis=0)))  # [seq, batch, h]
        last_h.append(h)
        last_c.append(c)
    y = bb.normalize(op.stack(ys, axis=1))  # [seq, directions, batch, h]
    y_h = bb.normalize(op.stack(last_h, axis=0))
    y_c = bb.normalize(op.stack(last_c, axis=0))
    if batch_first:
        y = op.permute_dims(y, [2, 0, 1, 3])
        y_h, y_c = op.permute_dims(y_h, [1, 0, 2]), op.permute_dims(y_c, [1, 0, 2])
    results = [bb.normalize(y), bb.normalize(y_h)]
    if kind == "LSTM":
        results.append(bb.normalize(y_c))
    return relax.Tuple(results)


def _attention(bb: Any, inputs: Any, attr: dict[str, Any]) -> Any:
    q, k, v = (bb.normalize(x) for x in inputs[:3])
    mask, past_key, past_value, nonpad = inputs[3], inputs[4], inputs[5], inputs[6]
    dtype = _dtype(bb, q)
    three_d = len(_static_shape(bb, q)) == 3
    if three_d:
        q_heads, kv_heads = int(attr["q_num_heads"]), int(attr["kv_num_heads"])
        q, k, v = _heads_first(bb, q, q_heads), _heads_first(bb, k, kv_heads), _heads_first(bb, v, kv_heads)
    batch, q_heads, q_len, head_size = _static_shape(bb, q)
    kv_heads = _static_shape(bb, k)[1]

    scale = attr.get("scale")
    scale = math.sqrt(float(scale) if scale is not None else 1.0 / math.sqrt(head_size))
    if past_key is not None:
        k = bb.normalize(relax.op.concat([past_key, k], axis=2))
        v = bb.normalize(relax.op.concat([past_value, v], axis=2))
    present_key, present_value = k, v
    kv_len = _static_shape(bb, k)[2]
    past_len = _static_shape(bb, past_key)[2] if past_key is not None else 0

    neg_inf = relax.const(-np.inf, dtype)
    zero = relax.const(0.0, dtype)
    bias: Any = None  # additive, broadcast to [batch, heads, q_len, kv_len]
    if mask is not None:
        mask = bb.normalize(mask)
        width = _static_shape(bb, mask)[-1]
        if _dtype(bb, mask) == "bool":
            mask = relax.op.where(mask, zero, neg_inf)
        if width < kv_len:  # a mask shorter than the keys: the rest masked out
            pad = [(0, 0)] * (len(_static_shape(bb, mask)) - 1) + [(0, kv_len - width)]
            mask = relax.op.nn.pad(mask, [p for pair in pad for p in pair], pad_value=-np.inf)
        bias = bb.normalize(mask)
    i = np.arange(q_len).reshape(q_len, 1)
    j = np.arange(kv_len).reshape(1, kv_len)
    if int(attr.get("is_causal", 0)):
        if nonpad is not None and past_key is None:  # the frontier of each batch entry's valid keys
            offset = relax.op.subtract(relax.op.astype(nonpad, "int64"), relax.const(q_len, "int64"))
            offset = relax.op.reshape(offset, (batch, 1, 1, 1))
            causal = relax.op.where(relax.op.less_equal(relax.const(j - i, "int64"), offset), zero, neg_inf)
        else:
            causal = relax.const(np.where(j <= i + past_len, 0.0, -np.inf).astype(dtype))
        bias = causal if bias is None else relax.op.add(bias, causal)
    left, right = int(attr.get("left_window_size", -1)), int(attr.get("right_window_size", -1))
    if left >= 0 or right >= 0:
        if nonpad is not None and past_key is None:
            raise ValueError("Attention with a sliding window over an external key cache")
        diff = i + past_len - j
        allowed = np.ones_like(diff, dtype=bool)
        if left >= 0:
            allowed &= diff <= left
        if right >= 0:
            allowed &= -diff <= right
        window = relax.const(np.where(allowed, 0.0, -np.inf).astype(dtype))
        bias = window if bias is None else relax.op.add(bias, window)
    if nonpad is not None:
        valid = relax.op.less(
            relax.const(np.arange(kv_len).reshape(1, kv_len), "int64"),
            relax.op.reshape(relax.op.astype(nonpad, "int64"), (batch, 1)),
        )
        padding = relax.op.reshape(relax.op.where(valid, zero, neg_inf), (batch, 1, 1, kv_len))
        bias = padding if bias is None else relax.op.add(bias, padding)

    if q_heads != kv_heads:  # grouped-query attention: each key/value head serves q_heads / kv_heads
        k = relax.op.repeat(k, q_heads // kv_heads, axis=1)
        v = relax.op.repeat(v, q_heads // kv_heads, axis=1)
    scale_c = relax.const(scale, dtype)
    scores = bb.normalize(
        relax.op.matmul(
            relax.op.multiply(q, scale_c), relax.op.permute_dims(relax.op.multiply(k, scale_c), [0, 1, 3, 2])
        )
    )
    softcap = float(attr.get("softcap", 0.0))
    if softcap > 0:
        cap = relax.const(softcap, dtype)
        scores = bb.normalize(relax.op.multiply(relax.op.tanh(relax.op.divide(scores, cap)), cap))
    qk_output = scores
    with_bias = bb.normalize(relax.op.add(scores, bias)) if bias is not None else scores
    mode = int(attr.get("qk_matmul_output_mode", 0))
    if mode == 2:
        qk_output = with_bias
    precision = attr.get("softmax_precision")
    if precision is not None:
        from onnx import helper

        wide = str(np.dtype(helper.tensor_dtype_to_np_dtype(int(precision))))
        probs = relax.op.astype(relax.op.nn.softmax(relax.op.astype(with_bias, wide), axis=-1), dtype)
    else:
        probs = relax.op.nn.softmax(with_bias, axis=-1)
    if bias is not None:  # a row with no key to attend: probabilities 0 (softmax alone gives NaN)
        full_bias = bb.normalize(relax.op.add(relax.op.zeros((batch, q_heads, q_len, kv_len), dtype), bias))
        # every key -inf (TVM's max starts from the lowest finite value, so count rather than take the max)
        is_masked = relax.op.astype(relax.op.equal(full_bias, neg_inf), "int32")
        masked_row = relax.op.equal(
            relax.op.min(is_masked, axis=[-1], keepdims=True), relax.const(1, "int32")
        )
        probs = relax.op.where(masked_row, zero, probs)
    probs = bb.normalize(probs)
    if mode == 3:
        qk_output = probs
    y = bb.normalize(relax.op.matmul(probs, v))
    if three_d:
        y = relax.op.reshape(bb.normalize(relax.op.permute_dims(y, [0, 2, 1, 3])), (batch, q_len, -1))
    return relax.Tuple([bb.normalize(y), present_key, present_value, qk_output])


def install() -> None:
    """Make TVM's ONNX importer see Kiln's converters (once; later calls do nothing)."""
    import importlib

    frontend = importlib.import_module("tvm.relax.frontend.onnx").onnx_frontend
    original = frontend._get_convert_map
    if getattr(original, "kiln_converters", False):
        return
    kiln = _converters(original())  # the importer asks for the table once per node: made once

    def convert_map() -> dict[str, Any]:
        table = original()
        table.update(kiln)
        return table

    convert_map.kiln_converters = True  # type: ignore[attr-defined]
    convert_map.tvm_table = original  # type: ignore[attr-defined]
    frontend._get_convert_map = convert_map


@contextlib.contextmanager
def tvm_table_only() -> Iterator[None]:
    """TVM's own conversion table while inside (what plain TVM converts: ``bench/conformance.py``)."""
    import importlib

    install()
    frontend = importlib.import_module("tvm.relax.frontend.onnx").onnx_frontend
    kiln = frontend._get_convert_map
    frontend._get_convert_map = kiln.tvm_table
    try:
        yield
    finally:
        frontend._get_convert_map = kiln
