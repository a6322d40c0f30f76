"""Windowed (KxK) NHWC convolutions as implicit GEMMs whose rows AMX tiles can load.

An AMX tile multiply takes 16 rows of input: for a convolution, 16 output pixels, each row the channels of
the input pixel under one tap of the window. Tiles load rows at any fixed stride, so 16 pixels are one
tile when their input pixels are equally spaced; within one output row they are, across rows they are
not, and the rows of these networks' feature maps (56, 28, 14, 7) are not multiples of 16.

The layout here makes them equally spaced everywhere: the input, padded as the convolution pads it, is
flattened to ``[N * Hp * Wp, C]`` (``Hp``, ``Wp``: the padded height and width). Output pixel ``p = (n, oh,
ow)`` is then computed at flat row ``p' = (n * Hp + oh) * Wp + ow``, and its tap ``(i, j)`` reads flat row
``p' + i * Wp + j``: 16 consecutive ``p'`` read 16 consecutive rows, for every tap. The flat output has
``Hp * Wp`` rows per image where the convolution has ``Ho * Wo``; the extra ones (the last ``KW - 1``
columns and ``KH - 1`` rows of each image, computed from the padding and the next image) are sliced away
after the kernel. ResNet's 56x56 layers compute 3 % more rows than they keep, its 7x7 ones 2x.

A strided convolution is first made a stride-1 one: its padded input, rearranged space-to-depth
(``[N, H/s, W/s, s*s*C]``, the channels of each ``s x s`` patch side by side), convolved with a window of
``ceil(K/s)`` taps whose weights are the original taps at those offsets (zeros past the window). A 3x3
stride-2 convolution is then a 2x2 one over 4C channels: 16/9 of the products, on tiles.

The weight is packed ``[KH, KW, O/16, C/P, 16, P]`` (:func:`pack_windowed_weight`): at each tap, the weight
tiles of AMX's int8 (``P`` 4) or bf16 (``P`` 2) multiply, the tap outermost so that one tap's tiles are the
intrinsic's operand as it declares it (a convolution's ``[O/16, KH, KW, ...]`` puts the tap between two of
its dimensions, which tensorization does not match).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln_tvm import relax, tvm
from kiln_tvm.x86_amx import AmxKind
from schedules.amx import TILE_ROWS, fits_amx_tiles
from tuner.passes.marked_kernels import conv2d_layout_misfit, emit_marked_kernel
from tuner.passes.qdq_lowering import describe_core

te = tvm.te
#: Flat output rows are rounded up to this: two tile rows, the taller of the AMX blocks.
_ROW_BLOCK = 2 * TILE_ROWS


@dataclass(frozen=True)
class WindowedGemm:
    """A windowed NHWC convolution as a GEMM over the flattened padded input (see the module's docstring):
    of the input padded by ``padding`` (the convolution's, then zeros to whole strides), then, for a
    ``stride`` above 1, rearranged space-to-depth, ``padded`` the grid of flat rows per image,
    ``channels`` and ``window`` those of the stride-1 convolution computed; ``rows`` flat output rows
    computed (a multiple of 32), ``kept`` of them the image rows, ``input_rows`` flat input rows read."""

    batch: int
    padded: tuple[int, int]  # the flat grid: Hp, Wp (after space-to-depth)
    channels: int  # stride * stride * C
    cols: int
    window: tuple[int, int]  # ceil(kh / stride), ceil(kw / stride)
    padding: tuple[int, int, int, int]  # top, left, bottom, right: the convolution's
    extra: tuple[int, int]  # zero rows and columns after it, to whole strides
    stride: int
    out_shape: tuple[int, int, int, int]  # N, Ho, Wo, O

    @property
    def kept(self) -> int:
        return self.batch * self.padded[0] * self.padded[1]

    @property
    def rows(self) -> int:
        return -(-self.kept // _ROW_BLOCK) * _ROW_BLOCK

    @property
    def input_rows(self) -> int:
        kh, kw = self.window
        return self.rows + (kh - 1) * self.padded[1] + kw - 1

    @property
    def depth(self) -> int:
        """The GEMM's reduction: every tap's channels."""
        kh, kw = self.window
        return kh * kw * self.channels

    def describe(self, call: relax.Call) -> str:
        depth = self.depth
        rearranged = f" (space-to-depth {self.stride})" if self.stride > 1 else ""
        return f"{describe_core(call)} as implicit GEMM {self.rows}x{depth} @ {depth}x{self.cols}{rearranged}"

    def weight(self, weight: np.ndarray) -> np.ndarray:
        """The OHWI ``weight`` of the stride-1 convolution computed: for a stride ``s``, tap ``(i, j)`` of
        channel ``(a, b, c)`` is the original's tap ``(s*i + a, s*j + b)`` of channel ``c`` (zero past the
        window)."""
        s = self.stride
        if s == 1:
            return weight
        o, kh, kw, c = weight.shape
        wh, ww = self.window
        full = np.zeros((o, wh * s, ww * s, c), weight.dtype)
        full[:, :kh, :kw, :] = weight
        blocked = full.reshape(o, wh, s, ww, s, c).transpose(0, 1, 3, 2, 4, 5)
        return np.ascontiguousarray(blocked.reshape(o, wh, ww, s * s * c))


def windowed_as_gemm(call: relax.Call, weight: Any, kind: AmxKind) -> WindowedGemm | None:
    """The implicit GEMM of an NHWC conv2d ``call`` of OHWI ``weight`` when it is windowed (larger than
    1x1), of one stride both ways, undilated, ungrouped, and its channels (after space-to-depth) whole AMX
    blocks of ``kind`` (output channels a multiple of 32, input channels of one tile row: 64 int8, 32
    bf16); else None."""
    attrs = call.attrs
    out_channels, kh, kw, channels = (int(d) for d in weight.shape)
    if conv2d_layout_misfit(call) or (kh, kw) == (1, 1):
        return None
    sh, sw = (int(s) for s in attrs.strides)
    if sh != sw or any(int(d) != 1 for d in attrs.dilation):
        return None
    if not fits_amx_tiles(kind, _ROW_BLOCK, out_channels, sh * sh * channels):
        return None
    top, left, bottom, right = (int(p) for p in attrs.padding)
    batch, height, width, _ = (int(d) for d in call.args[0].ty.shape)
    hp, wp = height + top + bottom, width + left + right
    hs, ws = -(-hp // sh), -(-wp // sh)
    return WindowedGemm(
        batch=batch,
        padded=(hs, ws),
        channels=sh * sh * channels,
        cols=out_channels,
        window=(-(-kh // sh), -(-kw // sh)),
        padding=(top, left, bottom, right),
        extra=(hs * sh - hp, ws * sh - wp),
        stride=sh,
        out_shape=(batch, (hp - kh) // sh + 1, (wp - kw) // sh + 1, out_channels),
    )


def pack_windowed_weight(weight: np.ndarray, lanes: int, pair: int) -> np.ndarray:
    """``W[O, KH, KW, C]`` (OHWI) -> ``Wp[KH, KW, O/lanes, C/pair, lanes, pair]``."""
    o, kh, kw, c = weight.shape
    blocked = weight.reshape(o // lanes, lanes, kh, kw, c // pair, pair)
    return np.ascontiguousarray(blocked.transpose(2, 3, 0, 4, 1, 5))


def windowed_gemm_kernel(x: Any, packed: Any, *, row_pitch: int, rows: int, dtype: str, name: str) -> Any:
    """``out[p, o] = sum dtype(x[p + i * row_pitch + j, c]) * dtype(Wp[i, j, o // L, c // P, o % L, c % P])``
    over the taps (``i``, ``j``) and channels ``c`` of the flat input ``x``, for ``rows`` rows ``p``."""
    kh, kw, blocks = (int(d) for d in packed.shape[:3])
    lanes, pair = (int(d) for d in packed.shape[4:])
    ri = te.reduce_axis((0, kh), name="ri")
    rj = te.reduce_axis((0, kw), name="rj")
    rc = te.reduce_axis((0, x.shape[1]), name="rc")

    def body(p: Any, o: Any) -> Any:
        value = x[p + ri * row_pitch + rj, rc].astype(dtype)
        weight = packed[ri, rj, o // lanes, rc // pair, o % lanes, rc % pair]
        return te.sum(value * weight.astype(dtype), axis=[ri, rj, rc])

    return te.compute((rows, blocks * lanes), body, name=name)


def emit_windowed_gemm(
    builder: relax.BlockBuilder,
    call: relax.Call,
    gemm: WindowedGemm,
    packed: relax.Expr,
    *,
    dtype: str,
    name: str,
    mark: str,
) -> relax.Expr:
    """Emit the conv2d ``call`` as :func:`windowed_gemm_kernel` over the ``packed`` weight (block ``name``
    marked ``mark``; packed from :meth:`WindowedGemm.weight`): the input padded with zeros as the
    convolution pads it and to whole strides, rearranged space-to-depth for a stride above 1, flattened;
    the flat output sliced back to the convolution's."""
    top, left, bottom, right = gemm.padding
    below, beside = gemm.extra
    x = call.args[0]
    widths = [0, 0, top, bottom + below, left, right + beside, 0, 0]
    if any(widths):
        x = builder.emit(relax.op.nn.pad(x, widths, "constant", 0.0))
    if gemm.stride > 1:  # [N, Hs*s, Ws*s, C] -> [N, Hs, Ws, s*s*C], channels (row offset, column offset, c)
        s, (hs, ws) = gemm.stride, gemm.padded
        split = builder.emit(relax.op.reshape(x, [gemm.batch, hs, s, ws, s, gemm.channels // (s * s)]))
        moved = builder.emit(relax.op.permute_dims(split, [0, 1, 3, 2, 4, 5]))
        x = builder.emit(relax.op.reshape(moved, [gemm.batch, hs, ws, gemm.channels]))
    flat = builder.emit(relax.op.reshape(x, [gemm.kept, gemm.channels]))
    # Rows past the last image feed only rows that are sliced away; zeros keep them finite.
    flat = builder.emit(relax.op.nn.pad(flat, [0, gemm.input_rows - gemm.kept, 0, 0], "constant", 0.0))

    def kernel(data: Any, w: Any) -> Any:
        return windowed_gemm_kernel(data, w, row_pitch=gemm.padded[1], rows=gemm.rows, dtype=dtype, name=name)

    out = emit_marked_kernel(builder, kernel, [flat, packed], name, mark)
    if gemm.rows != gemm.kept:
        out = builder.emit(relax.op.strided_slice(out, axes=[0], begin=[0], end=[gemm.kept]))
    batch, out_h, out_w, cols = gemm.out_shape
    images = builder.emit(relax.op.reshape(out, [batch, *gemm.padded, cols]))
    return relax.op.strided_slice(images, axes=[1, 2], begin=[0, 0], end=[out_h, out_w])
