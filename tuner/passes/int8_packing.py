"""Integer matmuls and convolutions rewritten for x86's VNNI dot product, over weights packed at compile time.

After :mod:`tuner.passes.qdq_lowering`, layout conversion and constant folding, a quantized layer's core is

    matmul(x_u8[..., K], W_s8[K, N], out_dtype=int32)            or
    conv2d(x_u8 NHWC, W_s8 OHWI, groups=1, out_dtype=int32)

with ``W`` a constant. ``vpdpbusd`` multiplies 4 consecutive u8 inputs by a 16 x 4 block of s8 weights
(64 contiguous bytes: 16 output channels, 4 reduction elements each) into 16 int32 sums. This pass replaces
each core whose output channels are a multiple of 16 and whose reduction is a multiple of 4 by a TE kernel
reading the weight packed in that order once, here (on AVX-VNNI CPUs without AVX-512, 8 channels for
the 256-bit ``vpdpbusd ymm`` instead of 16):

    matmul: Wp[N/16, K/4, 16, 4]          Wp[n // 16, k // 4, n % 16, k % 4] = W[k, n]
    conv2d: Wp[O/16, KH, KW, C/4, 16, 4]  Wp[o // 16, kh, kw, c // 4, o % 16, c % 4] = W[o, kh, kw, c]

The NHWC input gives the 4 consecutive channels and the NHWC output the 16 consecutive channels the
instruction reads and writes. On CPUs without VNNI the pass packs for ``vpmaddwd`` instead
(:data:`kiln_tvm.x86_vnni.AVX2_WORD_DOT`): 8 channels (16 with AVX-512) by 2 reduction elements, the weights
widened to int16 here, the u8 input pair widened in the kernel; the products are exact. A weight whose
values all lie within +-64 (7 bits) gets the faster ``vpmaddubsw`` product there instead (VNNI's packing,
:data:`kiln_tvm.x86_vnni.AVX2_BYTE_DOT`), exact on such weights. Each kernel's block is marked
(:func:`schedules.vnni.packed_mark`); only marked blocks are tensorized by the cpu spaces. The others (a
grouped convolution, 10 output classes) keep their integer kernels and plain tiling. The kernels take their pair and accumulation type from the caller:
the bf16 pass (:mod:`tuner.passes.bf16_packing`) emits its ``vdpbf16ps`` matmuls and convolutions with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln_tvm import RelaxConstant, relax, tvm
from kiln_tvm.x86_amx import INT8
from kiln_tvm.x86_vnni import VNNI_DEPTH, VNNI_DOT, VNNI_LANES, IntegerDot
from schedules.amx import fits_amx_tiles
from schedules.vnni import VNNI_BLOCK, has_packed_block, packed_mark
from tuner.passes.marked_kernels import conv2d_layout_misfit, emit_marked_kernel
from tuner.passes.qdq_lowering import describe_core
from tuner.passes.rewrite import rewrite_functions
from tuner.passes.windowed_gemm import emit_windowed_gemm, pack_windowed_weight, windowed_as_gemm

te = tvm.te


@dataclass
class VnniReport:
    """What the pass did: the cores now on VNNI kernels, and the integer cores left as they were (why)."""

    packed: list[str] = field(default_factory=list)  # "conv2d 1x56x56x64 * 64x3x3x64"
    unpacked: list[str] = field(default_factory=list)  # "conv2d 1x224x224x3 * ...: 3 input channels ..."
    #: Each packed matmul's (rows, columns, reduction), by its description in ``packed``.
    matmul_extents: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    #: The CPU's integer dot product the kernels are packed for (:func:`schedules.vnni.integer_dot`).
    dot: IntegerDot = VNNI_DOT
    #: On CPUs without VNNI, the faster product of kernels whose weights are all within +-64 (7-bit:
    #: ``vpmaddubsw``, :func:`schedules.vnni.seven_bit_dot`), and the operators packed for it.
    seven_bit: IntegerDot | None = None
    seven_bit_packed: list[str] = field(default_factory=list)
    #: Whether the CPU has AMX-INT8: a pointwise convolution of whole AMX blocks then goes on the matmul
    #: kernel (:func:`pointwise_as_matmul`), which :mod:`schedules.amx` tiles onto ``tdpbusd``.
    amx: bool = False

    @property
    def lanes(self) -> int:
        """Output lanes of the kernels' product (16: ``vpdpbusd zmm``; 8: ``ymm``, AVX-VNNI, or AVX2's)."""
        return self.dot.lanes


def pack_for_vnni(report: VnniReport | None = None) -> tvm.transform.Pass:
    """A module pass putting the integer matmuls and NHWC convolutions it can serve on VNNI kernels of
    the report's ``lanes``; it records what it did in ``report``."""
    sink = report if report is not None else VnniReport()

    @tvm.transform.module_pass(opt_level=0, name="KilnPackForVNNI")
    def rewrite(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        return relax.transform.DeadCodeElimination()(rewrite_functions(_VnniMutator(mod, sink, sink.dot)))

    return rewrite


def keep_packed_layouts(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with the packed kernels' weights (VNNI, AMX-BF16) no longer marked layout-free: they are packed already, in
    the layout the tensor intrinsic reads, which MetaSchedule's layout rewriting must not change."""
    for gvar, func in list(mod.functions.items()):
        marked = isinstance(func, tvm.tirx.PrimFunc) and func.attrs and "layout_free_buffers" in func.attrs
        if marked and has_packed_block(func):
            mod[gvar] = func.without_attr("layout_free_buffers")
    return mod


def pack_matmul_weight(weight: np.ndarray, pair: int = VNNI_DEPTH, lanes: int = VNNI_LANES) -> np.ndarray:
    """``W[K, N]`` -> ``Wp[N/lanes, K/pair, lanes, pair]`` (VNNI and AMX int8: pair 4; AMX bf16: 2)."""
    k, n = weight.shape
    return np.ascontiguousarray(weight.reshape(k // pair, pair, n // lanes, lanes).transpose(2, 0, 3, 1))


def pack_conv_weight(weight: np.ndarray, lanes: int = VNNI_LANES, pair: int = VNNI_DEPTH) -> np.ndarray:
    """``W[O, KH, KW, C]`` (OHWI) -> ``Wp[O/lanes, KH, KW, C/pair, lanes, pair]`` (VNNI: pair 4; bf16: 2)."""
    o, kh, kw, c = weight.shape
    blocked = weight.reshape(o // lanes, lanes, kh, kw, c // pair, pair)
    return np.ascontiguousarray(blocked.transpose(0, 2, 3, 4, 1, 5))


def matmul_kernel(x: Any, packed: Any, dtype: str = "int32", name: str = "vnni_matmul") -> Any:
    """``out[..., n] = sum_k dtype(x[..., k]) * dtype(Wp[n // L, k // P, n % L, k % P])``, ``L`` and ``P``
    the packed weight's lanes and pair (its last two dimensions), its block ``name``."""
    reduce = te.reduce_axis((0, x.shape[-1]), name="k")
    lanes, pair = (int(d) for d in packed.shape[2:])
    channels = packed.shape[0] * lanes

    def body(*index: Any) -> Any:
        *outer, n = index
        w = packed[n // lanes, reduce // pair, n % lanes, reduce % pair]
        return te.sum(x[(*outer, reduce)].astype(dtype) * w.astype(dtype), axis=reduce)

    return te.compute((*x.shape[:-1], channels), body, name=name)


def conv2d_kernel(
    x: Any,
    packed: Any,
    strides: tuple[int, int],
    dilation: tuple[int, int],
    *,
    dtype: str = "int32",
    name: str = "vnni_conv2d",
) -> Any:
    """NHWC ``out[b, h, w, o] = sum dtype(x[b, h*sh + i*dh, w*sw + j*dw, c]) * dtype(Wp[o // L, i, j, c // P,
    o % L, c % P])`` over the window (``i``, ``j``) and the channels ``c``, ``L`` and ``P`` the packed
    weight's lanes and pair (its last two dimensions), of an input padded already:
    a padding stage in the kernel would be inlined into the products, which then no longer match the
    intrinsic."""
    batch, height, width, channels = (int(d) for d in x.shape)
    blocks, kh, kw = (int(d) for d in packed.shape[:3])
    lanes, pair = (int(d) for d in packed.shape[4:])
    (sh, sw), (dh, dw) = strides, dilation
    out_h = (height - (kh - 1) * dh - 1) // sh + 1
    out_w = (width - (kw - 1) * dw - 1) // sw + 1
    ri = te.reduce_axis((0, kh), name="ri")
    rj = te.reduce_axis((0, kw), name="rj")
    rc = te.reduce_axis((0, channels), name="rc")

    def body(b: Any, h: Any, w: Any, o: Any) -> Any:
        value = x[b, h * sh + ri * dh, w * sw + rj * dw, rc].astype(dtype)
        weight = packed[o // lanes, ri, rj, rc // pair, o % lanes, rc % pair]
        return te.sum(value * weight.astype(dtype), axis=[ri, rj, rc])

    return te.compute((batch, out_h, out_w, blocks * lanes), body, name=name)


def emit_packed_conv2d(
    builder: relax.BlockBuilder,
    call: relax.Call,
    packed: relax.Expr,
    *,
    dtype: str,
    name: str,
    mark: str,
    extra_channels: int = 0,
) -> relax.Expr:
    """Emit the NHWC conv2d ``call`` as :func:`conv2d_kernel` over the ``packed`` weight (block ``name``
    marked ``mark``), its input padded with zeros as the convolution pads, in a kernel of its own, and by
    ``extra_channels`` zero channels (those the packed weight holds as zeros to fill its last pair)."""
    attrs = call.attrs
    strides = tuple(int(s) for s in attrs.strides)
    dilation = tuple(int(d) for d in attrs.dilation)
    top, left, bottom, right = (int(p) for p in attrs.padding)
    x = call.args[0]
    if any((top, left, bottom, right, extra_channels)):
        widths = [0, 0, top, bottom, left, right, 0, extra_channels]
        x = builder.emit(relax.op.nn.pad(x, widths, "constant", 0.0))

    def kernel(data: Any, w: Any) -> Any:
        return conv2d_kernel(data, w, strides, dilation, dtype=dtype, name=name)

    return emit_marked_kernel(builder, kernel, [x, packed], name, mark)


@dataclass(frozen=True)
class PointwiseMatmul:
    """A pointwise (1x1) NHWC convolution as a matmul: its ``rows`` (the output pixels, ``strides`` apart
    in an input of ``height`` x ``width``) by its ``channels``, into ``cols`` output channels, reshaped back
    to ``out_shape``."""

    rows: int
    channels: int
    cols: int
    height: int
    width: int
    strides: tuple[int, int]
    out_shape: tuple[int, int, int, int]

    def describe(self, call: relax.Call) -> str:
        return f"{describe_core(call)} as matmul {self.rows}x{self.channels} @ {self.channels}x{self.cols}"

    def weight(self, weight: np.ndarray) -> np.ndarray:
        """The OHWI 1x1 ``weight`` as the matmul's ``W[channels, cols]``."""
        return np.ascontiguousarray(weight[:, 0, 0, :].T)


def pointwise_as_matmul(call: relax.Call, weight: np.ndarray) -> PointwiseMatmul | None:
    """The matmul an NHWC conv2d ``call`` of OHWI ``weight`` is when it is pointwise (1x1, no padding, no
    dilation, one group; any stride), else None:

        y[n, h, w, :] = x[n, s*h, s*w, :] @ W[:, 0, 0, :].T
    """
    attrs = call.attrs
    if conv2d_layout_misfit(call) or tuple(weight.shape[1:3]) != (1, 1):
        return None
    if any(int(p) for p in attrs.padding) or any(int(d) != 1 for d in attrs.dilation):
        return None
    sh, sw = (int(s) for s in attrs.strides)
    batch, height, width, channels = (int(d) for d in call.args[0].ty.shape)
    out_h, out_w, cols = (height - 1) // sh + 1, (width - 1) // sw + 1, int(weight.shape[0])
    return PointwiseMatmul(
        rows=batch * out_h * out_w,
        channels=channels,
        cols=cols,
        height=height,
        width=width,
        strides=(sh, sw),
        out_shape=(batch, out_h, out_w, cols),
    )


def emit_pointwise_matmul(
    builder: relax.BlockBuilder,
    call: relax.Call,
    pointwise: PointwiseMatmul,
    packed: relax.Expr,
    *,
    dtype: str,
    name: str,
    mark: str,
) -> relax.Expr:
    """Emit the pointwise conv2d ``call`` as :func:`matmul_kernel` of its (strided) pixels over the
    ``packed`` weight (block ``name`` marked ``mark``), reshaped back to the convolution's output."""
    x = call.args[0]
    if pointwise.strides != (1, 1):
        end = [pointwise.height, pointwise.width]
        x = builder.emit(
            relax.op.strided_slice(x, axes=[1, 2], begin=[0, 0], end=end, strides=list(pointwise.strides))
        )
    pixels = builder.emit(relax.op.reshape(x, [pointwise.rows, pointwise.channels]))

    def kernel(data: Any, w: Any) -> Any:
        return matmul_kernel(data, w, dtype, name)

    out = emit_marked_kernel(builder, kernel, [pixels, packed], name, mark)
    return relax.op.reshape(out, list(pointwise.out_shape))


@relax.expr_functor.mutator
class _VnniMutator(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, report: VnniReport, dot: IntegerDot) -> None:
        super().__init__(mod)
        self.report = report
        self.dot = dot
        self.matmul = tvm.ir.Op.get("relax.matmul")
        self.conv2d = tvm.ir.Op.get("relax.nn.conv2d")

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call, relax.Call) or not _is_integer_core(call):
            return call
        weight = _constant(call.args[1])
        if weight is None:
            return call
        if call.op.same_as(self.matmul):
            return self._matmul(call, weight)
        if call.op.same_as(self.conv2d):
            return self._conv2d(call, weight)
        return call

    def _declined(self, call: relax.Call, why: str) -> relax.Call:
        self.report.unpacked.append(f"{describe_core(call)}: {why}")
        return call

    def _dot_for(self, weight: np.ndarray) -> IntegerDot:
        """The dot product a kernel over ``weight`` gets: the 7-bit one (``vpmaddubsw``) where the CPU has
        it and every weight lies within its range, exact there; else the CPU's own."""
        narrow = self.report.seven_bit
        if narrow is None or narrow.max_weight is None or not weight.size:
            return self.dot
        return narrow if int(np.abs(weight.astype(np.int32)).max()) <= narrow.max_weight else self.dot

    def _matmul(self, call: relax.Call, weight: np.ndarray) -> relax.Expr:
        if weight.ndim != 2:
            return self._declined(call, "its weight is not a 2-D constant")
        dot = self._dot_for(weight)
        why = _block_misfit(
            weight.shape[1], weight.shape[0], "output columns", "inputs", block=dot.lanes, pair=dot.depth
        )
        if why:
            return self._declined(call, why)
        packed = _packed(pack_matmul_weight(weight, pair=dot.depth, lanes=dot.lanes), dot)
        x_shape = [int(d) for d in call.args[0].ty.shape]
        rows = x_shape[-2] if len(x_shape) > 1 else 1
        self.report.matmul_extents[describe_core(call)] = (rows, int(weight.shape[1]), int(weight.shape[0]))
        self._packed_for(call, dot)
        return emit_marked_kernel(
            self.builder_, matmul_kernel, [call.args[0], packed], "vnni_matmul", packed_mark(dot)
        )

    def _conv2d(self, call: relax.Call, weight: np.ndarray) -> relax.Expr:
        amx = self.report.amx and self.dot.depth == VNNI_DEPTH  # AMX-INT8 CPUs have VNNI
        pointwise = pointwise_as_matmul(call, weight) if amx else None
        if pointwise is not None and fits_amx_tiles(INT8, pointwise.rows, pointwise.cols, pointwise.channels):
            described = pointwise.describe(call)
            self.report.packed.append(described)
            self.report.matmul_extents[described] = (pointwise.rows, pointwise.cols, pointwise.channels)
            packed = relax.const(pack_matmul_weight(pointwise.weight(weight), lanes=self.dot.lanes), "int8")
            return emit_pointwise_matmul(
                self.builder_, call, pointwise, packed, dtype="int32", name="vnni_matmul", mark=VNNI_BLOCK
            )
        # The lowered convolution's input comes padded with its zero point (its own padding is 0).
        windowed = windowed_as_gemm(call, weight, INT8) if amx else None
        if windowed is not None and not any(windowed.padding):
            described = windowed.describe(call)
            self.report.packed.append(described)
            self.report.matmul_extents[described] = (windowed.rows, windowed.cols, windowed.depth)
            packed = relax.const(
                pack_windowed_weight(windowed.weight(weight), self.dot.lanes, VNNI_DEPTH), "int8"
            )
            return emit_windowed_gemm(
                self.builder_, call, windowed, packed, dtype="int32", name="vnni_matmul", mark=VNNI_BLOCK
            )
        # Input channels short of a whole reduction block (an RGB image's 3) get zero channels, in the weight
        # here and in the input's padding: a zero weight adds nothing to the sums, whatever the input.
        dot = self._dot_for(weight)
        extra = -int(weight.shape[3]) % dot.depth
        why = conv2d_layout_misfit(call) or _block_misfit(
            weight.shape[0],
            weight.shape[3] + extra,
            "output channels",
            "input channels",
            block=dot.lanes,
            pair=dot.depth,
        )
        if why:
            return self._declined(call, why)
        if extra:
            weight = np.pad(weight, [(0, 0), (0, 0), (0, 0), (0, extra)])
        self._packed_for(call, dot)
        packed = _packed(pack_conv_weight(weight, dot.lanes, dot.depth), dot)
        return emit_packed_conv2d(
            self.builder_,
            call,
            packed,
            dtype="int32",
            name="vnni_conv2d",
            mark=packed_mark(dot),
            extra_channels=extra,
        )

    def _packed_for(self, call: relax.Call, dot: IntegerDot) -> None:
        self.report.packed.append(describe_core(call))
        if dot is not self.dot:
            self.report.seven_bit_packed.append(describe_core(call))


def _packed(weight: np.ndarray, dot: IntegerDot) -> relax.Expr:
    """The packed ``weight`` as a constant of ``dot``'s weight type (int16 for ``vpmaddwd``)."""
    return relax.const(weight.astype(dot.weight_dtype), dot.weight_dtype)


def _is_integer_core(call: relax.Call) -> bool:
    if len(call.args) < 2 or str(getattr(call.attrs, "out_dtype", "")) != "int32":
        return False
    x, w = (getattr(a.ty, "dtype", None) for a in call.args[:2])
    return str(x) == "uint8" and str(w) == "int8"


def _constant(expr: relax.Expr) -> np.ndarray | None:
    return expr.value.numpy() if isinstance(expr, RelaxConstant) else None


def _block_misfit(
    lanes: int, depth: int, lanes_name: str, depth_name: str, *, block: int, pair: int = VNNI_DEPTH
) -> str | None:
    if lanes % block:
        return f"{lanes} {lanes_name} (a multiple of {block} is packed)"
    if depth % pair:
        return f"{depth} {depth_name} (a multiple of {pair} is packed)"
    return None
