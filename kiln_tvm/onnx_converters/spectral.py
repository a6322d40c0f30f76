"""ONNX's ``DFT`` and ``STFT`` as matmuls with the (static) DFT matrix."""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln_tvm import relax
from kiln_tvm.onnx_converters.tensors import constant, dtype_of, static_shape


def dft(bb: Any, x: Any, axis: int, attr: dict[str, Any]) -> Any:
    """The DFT of ``x`` [..., n, ..., 1 or 2] (real, or real and imaginary parts) along ``axis``: forward,
    inverse (divided by n), one-sided (the first n // 2 + 1 frequencies) and the inverse of a one-sided
    spectrum (a real signal of 2 (m - 1) samples, as ``numpy.fft.irfft``)."""
    op = relax.op
    x = bb.normalize(x)
    shape, dtype = static_shape(bb, x), dtype_of(bb, x)
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
        out = op.matmul(real, constant(cos_m.astype(dtype)))
        if imag is not None:
            out = op.subtract(out, op.matmul(imag, constant(sin_m.astype(dtype))))
        parts = [bb.normalize(out)]
    else:
        bins = n // 2 + 1 if onesided else n
        angle = 2 * np.pi * np.outer(np.arange(n), np.arange(bins)) / n
        scale = 1.0 / n if inverse else 1.0
        cos_m = constant((np.cos(angle) * scale).astype(dtype))
        sin_m = constant((np.sin(angle) * scale).astype(dtype))
        sign = 1.0 if inverse else -1.0  # e^{-i angle} forward, e^{+i angle} inverse
        out_real = op.matmul(real, cos_m)
        out_imag = op.multiply(relax.const(sign, dtype), op.matmul(real, sin_m))
        if imag is not None:
            out_real = op.subtract(out_real, op.multiply(relax.const(sign, dtype), op.matmul(imag, sin_m)))
            out_imag = op.add(out_imag, op.matmul(imag, cos_m))
        parts = [bb.normalize(out_real), bb.normalize(out_imag)]
    parts = [bb.normalize(op.permute_dims(p, [int(i) for i in back])) for p in parts]
    return op.stack(parts, axis=rank - 1)


def with_length(bb: Any, x: Any, axis: int, length: int) -> Any:
    """``x`` cut to its first ``length`` entries along ``axis``, or zero-padded to ``length`` (ONNX's
    ``dft_length``)."""
    shape = static_shape(bb, x)
    axis %= len(shape)
    if length < shape[axis]:
        return bb.normalize(relax.op.strided_slice(x, axes=[axis], begin=[0], end=[length]))
    if length > shape[axis]:
        pad = [*shape[:axis], length - shape[axis], *shape[axis + 1 :]]
        zeros = constant(np.zeros(pad, dtype=dtype_of(bb, x)))
        return bb.normalize(relax.op.concat([x, zeros], axis=axis))
    return x


def stft(bb: Any, signal: Any, *, step: int, window: Any, frame_length: int | None, onesided: bool) -> Any:
    """The short-time Fourier transform of ``signal`` [batch, length, 1 or 2]: frames of ``frame_length``
    samples (the window's length when None) every ``step`` samples, each multiplied by ``window`` when
    given, then transformed: [batch, frames, bins, 2]."""
    signal = bb.normalize(signal)
    batch, length, _ = static_shape(bb, signal)
    if frame_length is None:
        if window is None:
            raise ValueError("STFT with neither a window nor a frame_length")
        frame_length = static_shape(bb, window)[0]
    if step < 1 or frame_length < 1 or frame_length > length:
        raise ValueError(f"STFT with frame_step {step} and frame_length {frame_length} over {length} samples")
    frames = 1 + (length - frame_length) // step
    index = np.arange(frames)[:, None] * step + np.arange(frame_length)[None, :]
    framed = bb.normalize(relax.op.take(signal, constant(index.astype("int64")), axis=1))
    if window is not None:
        shaped = relax.op.reshape(relax.op.astype(window, dtype_of(bb, signal)), (1, 1, frame_length, 1))
        framed = bb.normalize(relax.op.multiply(framed, shaped))
    return dft(bb, framed, 2, {"onesided": int(onesided)})
