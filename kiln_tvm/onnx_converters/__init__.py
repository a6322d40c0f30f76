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
* ``DFT`` with a constant axis and length (a matmul with the DFT matrix: forward, inverse, one-sided, and
  back); ``STFT`` with a constant frame step and length (its frames gathered, windowed, transformed).
* ``RotaryEmbedding`` (opset 23): halves or interleaved pairs, partial rotation, position ids.
* ``RMSNormalization`` where TVM's legalization fails (every axis normalized, a broadcast scale).
* ``Swish``, ``SwiGLU``, ``Celu``, ``LpNormalization``, ``CumProd``, ``ReverseSequence``, ``BitCast``.
* In place of TVM's where it gets a form wrong (:mod:`kiln_tvm.onnx_converters.corrections`):
  ``LayerNormalization``'s statistics outputs, ``Pow`` of mixed types, ``OneHot``'s value types,
  ``EyeLike``'s ``dtype``, boolean ``ReduceMax``/``ReduceMin``; and the window functions and
  ``MelWeightMatrix`` of a constant size.

The training-only operators are not converted: :data:`TRAINING_OPERATORS` names them, so that a model
using one is refused as a training graph rather than as an importer gap.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from kiln_tvm import relax, tvm
from kiln_tvm.onnx_converters.attention import attention, rotary_embedding
from kiln_tvm.onnx_converters.corrections import corrections
from kiln_tvm.onnx_converters.recurrent import recurrent
from kiln_tvm.onnx_converters.spectral import dft, stft, with_length
from kiln_tvm.onnx_converters.tensors import constant, constant_int, dtype_of, static_shape

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
            return attention(bb, inputs, attr)

    class Swish(base):  # type: ignore[misc, valid-type]
        """``x * sigmoid(alpha * x)``."""

        @classmethod
        def _impl_v24(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            x = inputs[0]
            alpha = relax.const(float(attr.get("alpha", 1.0)), dtype_of(bb, x))
            return relax.op.multiply(x, relax.op.sigmoid(relax.op.multiply(x, alpha)))

    class Celu(base):  # type: ignore[misc, valid-type]
        """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``."""

        @classmethod
        def _impl_v12(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            x = inputs[0]
            dtype = dtype_of(bb, x)
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
            dtype = dtype_of(bb, x)
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
            x = inputs[0]
            shape = static_shape(bb, x)
            axis = constant_int(inputs[1], "CumProd's axis") % len(shape)
            out = relax.op.flip(x, axis) if attr.get("reverse", 0) else x
            out = bb.normalize(relax.op.cumprod(out, axis=axis, dtype=dtype_of(bb, x)))
            if attr.get("exclusive", 0):
                ones = constant(np.ones([*shape[:axis], 1, *shape[axis + 1 :]], dtype=dtype_of(bb, x)))
                kept = relax.op.strided_slice(out, axes=[axis], begin=[0], end=[shape[axis] - 1])
                out = relax.op.concat([ones, kept], axis=axis)
            return relax.op.flip(out, axis) if attr.get("reverse", 0) else out

    class ReverseSequence(base):  # type: ignore[misc, valid-type]
        """Each batch entry's first ``sequence_lens[b]`` steps reversed (the lengths as a tensor input)."""

        @classmethod
        def _impl_v10(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            x, lens = inputs[0], inputs[1]
            time_axis, batch_axis = int(attr.get("time_axis", 0)), int(attr.get("batch_axis", 1))
            shape = static_shape(bb, x)
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
            shape, scale_shape = static_shape(bb, x), static_shape(bb, scale)
            axis = int(attr.get("axis", -1)) % len(shape)
            if axis > 0 and scale_shape == shape[axis:] and tvm_rms_norm is not None:
                return tvm_rms_norm.get_converter(23)(bb, inputs, attr, params)
            dtype = dtype_of(bb, x)
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
        """ONNX ``LSTM``, unrolled over the static sequence (see :func:`kiln_tvm.onnx_converters.recurrent.recurrent`)."""

        @classmethod
        def _impl_v7(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            return recurrent(bb, "LSTM", inputs, attr)

    class GRU(base):  # type: ignore[misc, valid-type]
        """ONNX ``GRU``, unrolled over the static sequence (see :func:`kiln_tvm.onnx_converters.recurrent.recurrent`)."""

        @classmethod
        def _impl_v7(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            return recurrent(bb, "GRU", inputs, attr)

    class RNN(base):  # type: ignore[misc, valid-type]
        """ONNX ``RNN``, unrolled over the static sequence (see :func:`kiln_tvm.onnx_converters.recurrent.recurrent`)."""

        @classmethod
        def _impl_v7(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            return recurrent(bb, "RNN", inputs, attr)

    class RotaryEmbedding(base):  # type: ignore[misc, valid-type]
        """ONNX ``RotaryEmbedding`` (opset 23), as ``onnx.reference`` computes it: the first
        ``rotary_embedding_dim`` features of each head rotated by the cached angles (gathered by
        ``position_ids`` when given), in halves or interleaved pairs."""

        @classmethod
        def _impl_v23(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            return rotary_embedding(bb, inputs, attr)

    class SwiGLU(base):  # type: ignore[misc, valid-type]
        """``a * sigmoid(alpha * a) * b`` (inputs of one shape)."""

        @classmethod
        def _impl_v1(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            a, b = inputs[0], inputs[1]
            alpha = relax.const(float(attr.get("alpha", 1.0)), dtype_of(bb, a))
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
            if dtype_of(bb, x) == "bool":  # one byte holding 0 or 1, as numpy stores it
                x = bb.normalize(relax.op.astype(x, "uint8"))
            if np.dtype(dtype_of(bb, x)).itemsize != np.dtype(to).itemsize:
                raise ValueError(f"BitCast from {dtype_of(bb, x)} to {to}: the widths differ")
            return bb.emit_te(tvm.topi.reinterpret, x, to)

    class DFT(base):  # type: ignore[misc, valid-type]
        """ONNX ``DFT`` with its axis an attribute (opset 17-19) or a constant, and a constant
        ``dft_length`` when given: a matmul with the (static) DFT matrix, see
        :func:`kiln_tvm.onnx_converters.spectral.dft`."""

        @classmethod
        def _transform(cls, bb: Any, inputs: Any, axis: int, attr: dict[str, Any]) -> Any:
            x = inputs[0]
            if len(inputs) > 1 and inputs[1] is not None:
                x = with_length(bb, x, axis, constant_int(inputs[1], "DFT's dft_length"))
            return dft(bb, x, axis, attr)

        @classmethod
        def _impl_v17(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            return cls._transform(bb, inputs, int(attr.get("axis", 1)), attr)

        @classmethod
        def _impl_v20(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            axis = inputs[2] if len(inputs) > 2 else None
            value = constant_int(axis, "DFT's axis") if axis is not None else -2
            return cls._transform(bb, inputs, value, attr)

    class STFT(base):  # type: ignore[misc, valid-type]
        """ONNX ``STFT`` with a constant frame step and frame length: the signal's frames gathered by a
        constant index, windowed, and transformed (:func:`kiln_tvm.onnx_converters.spectral.stft`)."""

        @classmethod
        def _impl_v17(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            window = inputs[2] if len(inputs) > 2 else None
            length = inputs[3] if len(inputs) > 3 else None
            return stft(
                bb,
                inputs[0],
                step=constant_int(inputs[1], "STFT's frame_step"),
                window=window,
                frame_length=constant_int(length, "STFT's frame_length") if length is not None else None,
                onesided=bool(attr.get("onesided", 1)),
            )

    return {
        **corrections(base, tvm_map),
        "DFT": DFT,
        "STFT": STFT,
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
