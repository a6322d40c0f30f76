"""Converters in place of TVM's for forms its own get wrong or refuse, and ONNX's window functions.

* ``LayerNormalization``: TVM returns scalar placeholders for the optional ``Mean`` and ``InvStdDev``
  outputs; a node that has them gets the statistics, over the normalized axes and kept as size-1
  dimensions (in ``stash_type``'s precision). The normalized output is TVM's fused ``layer_norm`` as
  before, and a node with one output is converted by TVM alone.
* ``Pow`` with a base and an exponent of different types (float base, integer exponent; an integer base):
  computed in the base's float type, or in float64 for an integer base, and cast back to the base's type.
* ``OneHot`` (TVM's ``one_hot`` takes its values and depth as prim values of fixed types, and fails on
  others): an equality against ``arange(depth)``, then a choice between the two values.
* ``EyeLike`` with a ``dtype`` attribute other than the input's: a constant, since the shape is static.
* ``ReduceMax`` / ``ReduceMin`` of booleans (TVM's legalization has no bounds for ``bool``): as ``uint8``.
* ``HannWindow``, ``HammingWindow``, ``BlackmanWindow`` and ``MelWeightMatrix`` of a constant size: the
  constant ONNX's definition computes; ``CenterCropPad`` of a constant shape (a slice and a pad).
* ``Tile`` of constant repeats as ``relax.op.tile`` (which Kiln's graph passes rewrite; TVM's ``topi.tile``
  computes wrong values on several tiled axes).
* ``Resize`` with ``axes`` or a ``keep_aspect_ratio_policy`` (TVM reads neither): its parameters spread
  over every axis and the policy resolved to sizes, then TVM's converter.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln_tvm import relax
from kiln_tvm.onnx_converters.tensors import constant, constant_array, constant_int, dtype_of, static_shape


def onnx_dtype(code: int) -> str:
    """The numpy name of an ONNX element type code."""
    from onnx import helper

    return str(np.dtype(helper.tensor_dtype_to_np_dtype(int(code))))


def layer_norm_statistics(bb: Any, x: Any, axis: int, epsilon: float, stash: str) -> tuple[Any, Any]:
    """The mean and the reciprocal standard deviation of ``x`` over the axes from ``axis`` on, kept as
    size-1 dimensions, in ``stash``'s type."""
    x = bb.normalize(x)
    rank = len(static_shape(bb, x))
    axes = list(range(axis % rank, rank))
    wide = bb.normalize(relax.op.astype(x, stash)) if dtype_of(bb, x) != stash else x
    mean = bb.normalize(relax.op.mean(wide, axis=axes, keepdims=True))
    centered = relax.op.subtract(wide, mean)
    variance = relax.op.mean(relax.op.multiply(centered, centered), axis=axes, keepdims=True)
    eps = relax.const(epsilon, stash)
    inv_std = relax.op.divide(relax.const(1.0, stash), relax.op.sqrt(relax.op.add(variance, eps)))
    return mean, bb.normalize(inv_std)


def power(bb: Any, base: Any, exponent: Any) -> Any:
    """``base ** exponent`` in the base's type whatever the exponent's (ONNX's ``Pow``)."""
    base_type, exponent_type = dtype_of(bb, base), dtype_of(bb, exponent)
    wide = base_type if np.dtype(base_type).kind == "f" else "float64"
    lifted = relax.op.astype(base, wide) if wide != base_type else base
    raised = relax.op.power(lifted, relax.op.astype(exponent, wide) if exponent_type != wide else exponent)
    if wide == base_type:
        return raised
    if np.dtype(base_type).kind in "iu":  # exact for the integers a float64 holds
        raised = relax.op.round(raised)
    return relax.op.astype(raised, base_type)


def one_hot(bb: Any, indices: Any, depth: int, values: Any, axis: int) -> Any:
    """ONNX ``OneHot``: ``values[1]`` where an index (negative ones counted from ``depth``) equals the
    position along the new ``axis``, ``values[0]`` elsewhere."""
    rank = len(static_shape(bb, indices)) + 1
    axis %= rank
    index = bb.normalize(relax.op.astype(indices, "int64"))
    depth_const = relax.const(depth, "int64")
    index = relax.op.where(
        relax.op.less(index, relax.const(0, "int64")), relax.op.add(index, depth_const), index
    )
    index = bb.normalize(relax.op.expand_dims(index, axis))
    shape = [1] * rank
    shape[axis] = depth
    positions = constant(np.arange(depth, dtype="int64").reshape(shape))
    dtype = dtype_of(bb, values)
    off = relax.op.strided_slice(values, axes=[0], begin=[0], end=[1])
    on = relax.op.strided_slice(values, axes=[0], begin=[1], end=[2])
    off, on = relax.op.reshape(off, [1] * rank), relax.op.reshape(on, [1] * rank)
    chosen = relax.op.where(relax.op.equal(index, positions), on, off)
    return relax.op.astype(chosen, dtype)


def center_crop_pad(bb: Any, x: Any, sizes: list[int], axes: list[int]) -> Any:
    """ONNX's ``CenterCropPad``: each of ``axes`` cropped to its size in ``sizes`` around its centre, or
    zero-padded to it with the input centred (the odd sample after, as ONNX's reference puts it)."""
    shape = static_shape(bb, x)
    rank = len(shape)
    pads = [0] * (2 * rank)
    for axis, size in zip((a % rank for a in axes), sizes, strict=True):
        dim = shape[axis]
        if size < dim:
            start = (dim - size) // 2
            x = bb.normalize(relax.op.strided_slice(x, axes=[axis], begin=[start], end=[start + size]))
        elif size > dim:
            pads[2 * axis] = (size - dim) // 2
            pads[2 * axis + 1] = size - dim - pads[2 * axis]
    return relax.op.nn.pad(x, pads) if any(pads) else x


def resize_parameters(
    shape: list[int],
    roi: np.ndarray | None,
    scales: np.ndarray | None,
    sizes: np.ndarray | None,
    *,
    axes: list[int] | None,
    policy: str,
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """``Resize``'s roi, scales and sizes over every axis of an input of ``shape``, as ONNX's reference
    reads them: ``axes`` spread out (the others kept), and sizes under a ``keep_aspect_ratio_policy``
    resolved to the sizes of one scale over those axes (rounded half up)."""
    rank = len(shape)
    chosen = [a % rank for a in axes] if axes is not None else list(range(rank))
    if roi is not None and roi.size == 0:
        roi = None
    if axes is not None:
        if scales is not None and scales.size:
            full = np.ones(rank, dtype=scales.dtype)
            full[chosen] = scales
            scales = full
        if sizes is not None and sizes.size:
            full_sizes = np.array(shape, dtype="int64")
            full_sizes[chosen] = sizes
            sizes = full_sizes
        if roi is not None:
            full_roi = np.array([0.0] * rank + [1.0] * rank, dtype=roi.dtype)
            full_roi[chosen] = roi[: len(chosen)]
            full_roi[[rank + a for a in chosen]] = roi[len(chosen) :]
            roi = full_roi
    if sizes is not None and sizes.size and policy != "stretch":
        ratios = [sizes[a] / shape[a] for a in chosen]
        scale = min(ratios) if policy == "not_larger" else max(ratios)
        sizes = np.array(
            [int(scale * shape[a] + 0.5) if a in chosen else shape[a] for a in range(rank)], dtype="int64"
        )
    return roi, scales, sizes


def window(kind: str, size: int, periodic: bool, dtype: str) -> Any:
    """ONNX's ``HannWindow`` / ``HammingWindow`` / ``BlackmanWindow`` of ``size`` samples."""
    n = np.arange(size, dtype=np.float64)
    period = size if periodic else size - 1
    angle = 2 * np.pi * n / period if period > 0 else np.zeros(size)
    if kind == "HannWindow":
        values = 0.5 - 0.5 * np.cos(angle)
    elif kind == "HammingWindow":
        values = 25 / 46 - (21 / 46) * np.cos(angle)
    else:
        values = 0.42 - 0.5 * np.cos(angle) + 0.08 * np.cos(2 * angle)
    return constant(values.astype(dtype))


def mel_weight_matrix(
    bins: int, dft_length: int, rate: int, *, lower: float, upper: float, dtype: str
) -> np.ndarray:
    """ONNX's ``MelWeightMatrix`` (its reference implementation's formula): [dft_length // 2 + 1, bins]."""
    spectrogram_bins = dft_length // 2 + 1
    frequency_bins = np.arange(0, bins + 2)
    low_mel = 2595 * np.log10(1 + lower / 700)
    high_mel = 2595 * np.log10(1 + upper / 700)
    mel_step = (high_mel - low_mel) / frequency_bins.shape[0]
    frequency_bins = frequency_bins * mel_step + low_mel
    frequency_bins = 700 * (np.power(10, frequency_bins / 2595) - 1)
    frequency_bins = ((dft_length + 1) * frequency_bins) // rate
    frequency_bins = frequency_bins.astype(int)
    output = np.zeros((spectrogram_bins, bins))
    for i in range(bins):
        lower_bin, center, upper_bin = frequency_bins[i], frequency_bins[i + 1], frequency_bins[i + 2]
        low_to_center = center - lower_bin
        if low_to_center == 0:
            output[center, i] = 1
        else:
            for j in range(lower_bin, center + 1):
                output[j, i] = float(j - lower_bin) / float(low_to_center)
        center_to_high = upper_bin - center
        if center_to_high > 0:
            for j in range(center, upper_bin):
                output[j, i] = float(upper_bin - j) / float(center_to_high)
    return output.astype(dtype)


def corrections(base: type, tvm_map: dict[str, Any]) -> dict[str, type]:
    """The converter classes of this module, on TVM's ``OnnxOpConverter`` ``base``; TVM's own converters
    (``tvm_map``) handle the forms they get right."""
    tvm_layer_norm = tvm_map["LayerNormalization"]
    tvm_pow, tvm_eye_like = tvm_map["Pow"], tvm_map["EyeLike"]

    class LayerNormalization(base):  # type: ignore[misc, valid-type]
        """TVM's fused ``layer_norm``, with the ``Mean`` and ``InvStdDev`` outputs computed."""

        @classmethod
        def _impl_v17(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            fused = tvm_layer_norm.get_converter(17)(bb, inputs, attr, params)
            if int(attr.get("tvm_custom", {}).get("num_outputs", 3)) == 1:
                return fused  # nobody reads the statistics: the importer leaves no work for them
            normalized = fused[0] if isinstance(fused, relax.Tuple) else fused
            stash = onnx_dtype(int(attr.get("stash_type", 1)))
            mean, inv_std = layer_norm_statistics(
                bb, inputs[0], int(attr.get("axis", -1)), float(attr.get("epsilon", 1e-5)), stash
            )
            return relax.Tuple([normalized, mean, inv_std])

    class Pow(base):  # type: ignore[misc, valid-type]
        """TVM's ``Pow`` where both operands are of one float type; else :func:`power`."""

        @classmethod
        def _impl_v7(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            base_value, exponent = inputs[0], inputs[1]
            same = dtype_of(bb, base_value) == dtype_of(bb, exponent)
            if same and np.dtype(dtype_of(bb, base_value)).kind == "f":
                return tvm_pow.get_converter(7)(bb, inputs, attr, params)
            return power(bb, base_value, exponent)

    class OneHot(base):  # type: ignore[misc, valid-type]
        """:func:`one_hot` of a constant depth."""

        @classmethod
        def _impl_v11(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            indices, depth, values = inputs[0], inputs[1], inputs[2]
            return one_hot(
                bb, indices, constant_int(depth, "OneHot's depth"), values, int(attr.get("axis", -1))
            )

    class EyeLike(base):  # type: ignore[misc, valid-type]
        """Ones on the ``k``-th diagonal of the input's (static) shape, of the ``dtype`` asked for."""

        @classmethod
        def _impl_v9(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            x = inputs[0]
            if "dtype" not in attr:
                return tvm_eye_like.get_converter(9)(bb, inputs, attr, params)
            rows, columns = static_shape(bb, x)
            return constant(np.eye(rows, columns, k=int(attr.get("k", 0)), dtype=onnx_dtype(attr["dtype"])))

    def boolean_reduction(name: str) -> type:
        tvm_reduce = tvm_map[name]

        class Reduce(base):  # type: ignore[misc, valid-type]
            """TVM's reduction, of a boolean tensor as ``uint8``."""

            @classmethod
            def _convert(cls, version: int, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
                x = inputs[0]
                if dtype_of(bb, x) != "bool":
                    return tvm_reduce.get_converter(version)(bb, inputs, attr, params)
                as_bytes = bb.normalize(relax.op.astype(x, "uint8"))
                reduced = tvm_reduce.get_converter(version)(bb, [as_bytes, *inputs[1:]], attr, params)
                return relax.op.astype(reduced, "bool")

            @classmethod
            def _impl_v1(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
                return cls._convert(1, bb, inputs, attr, params)

            @classmethod
            def _impl_v18(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
                return cls._convert(18, bb, inputs, attr, params)

        Reduce.__name__ = name
        return Reduce

    def window_function(kind: str) -> type:
        class Window(base):  # type: ignore[misc, valid-type]
            """ONNX's window of a constant size, as a constant (:func:`window`)."""

            @classmethod
            def _impl_v17(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
                size = constant_int(inputs[0], f"{kind}'s size")
                dtype = onnx_dtype(int(attr.get("output_datatype", 1)))
                return window(kind, size, bool(attr.get("periodic", 1)), dtype)

        Window.__name__ = kind
        return Window

    class MelWeightMatrix(base):  # type: ignore[misc, valid-type]
        """ONNX's ``MelWeightMatrix`` of constant parameters, as a constant."""

        @classmethod
        def _impl_v17(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            numbers = [constant_array(x) for x in inputs[:5]]
            if any(n is None for n in numbers):
                raise ValueError("MelWeightMatrix with parameters computed at run time")
            bins, dft_length, rate = (int(n.reshape(-1)[0]) for n in numbers[:3])  # type: ignore[union-attr]
            lower, upper = (float(n.reshape(-1)[0]) for n in numbers[3:])  # type: ignore[union-attr]
            dtype = onnx_dtype(int(attr.get("output_datatype", 1)))
            return constant(mel_weight_matrix(bins, dft_length, rate, lower=lower, upper=upper, dtype=dtype))

    class CenterCropPad(base):  # type: ignore[misc, valid-type]
        """:func:`center_crop_pad` of a constant target shape."""

        @classmethod
        def _impl_v18(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            sizes = constant_array(inputs[1])
            if sizes is None:
                raise ValueError(
                    "CenterCropPad with a shape computed at run time (bind it with --input-value)"
                )
            rank = len(static_shape(bb, inputs[0]))
            axes = [int(a) for a in attr.get("axes", range(rank))]
            return center_crop_pad(bb, inputs[0], [int(v) for v in sizes.reshape(-1)], axes)

    tvm_resize = tvm_map["Resize"]

    class Resize(base):  # type: ignore[misc, valid-type]
        """TVM's ``Resize`` (which reads roi, scales and sizes over every axis) given them so
        (:func:`resize_parameters`) where the node names ``axes`` or a ``keep_aspect_ratio_policy``."""

        @classmethod
        def _convert(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            policy = attr.get("keep_aspect_ratio_policy", b"stretch")
            policy = policy.decode() if isinstance(policy, bytes) else str(policy)
            if "axes" not in attr and policy == "stretch":
                return tvm_resize.get_converter(18)(bb, inputs, attr, params)
            given = [inputs[i] if len(inputs) > i else None for i in range(4)]
            values = [constant_array(v) if v is not None else None for v in given[1:]]
            if any(v is None and g is not None for v, g in zip(values, given[1:], strict=True)):
                raise ValueError("Resize with axes and its roi, scales or sizes computed at run time")
            axes = [int(a) for a in attr["axes"]] if "axes" in attr else None
            roi, scales, sizes = resize_parameters(
                static_shape(bb, inputs[0]), *values, axes=axes, policy=policy
            )
            kept = {k: v for k, v in attr.items() if k not in ("axes", "keep_aspect_ratio_policy")}
            normalized = [
                inputs[0],
                constant(roi) if roi is not None else None,
                constant(scales) if scales is not None and scales.size else None,
                constant(sizes) if sizes is not None and sizes.size else None,
            ]
            return tvm_resize.get_converter(18)(bb, normalized, kept, params)

        @classmethod
        def _impl_v10(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            return cls._convert(bb, inputs, attr, params)

    tvm_tile = tvm_map["Tile"]

    class Tile(base):  # type: ignore[misc, valid-type]
        """``relax.op.tile`` for constant repeats (TVM emits ``topi.tile`` itself, which Kiln's graph pass
        :func:`tuner.passes.tile_rewrite.tile_as_broadcast` cannot reach); TVM's converter for repeats given at
        run time."""

        @classmethod
        def _impl_v13(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            repeats = constant_array(inputs[1])
            if repeats is None:
                return tvm_tile.get_converter(13)(bb, inputs, attr, params)
            return relax.op.tile(inputs[0], [int(r) for r in repeats.reshape(-1)])

    return {
        "Tile": Tile,
        "Resize": Resize,
        "CenterCropPad": CenterCropPad,
        "LayerNormalization": LayerNormalization,
        "Pow": Pow,
        "OneHot": OneHot,
        "EyeLike": EyeLike,
        "ReduceMax": boolean_reduction("ReduceMax"),
        "ReduceMin": boolean_reduction("ReduceMin"),
        **{kind: window_function(kind) for kind in ("HannWindow", "HammingWindow", "BlackmanWindow")},
        "MelWeightMatrix": MelWeightMatrix,
    }
