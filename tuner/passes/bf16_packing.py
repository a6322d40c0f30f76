"""bf16 matmuls and convolutions of the ``bf16`` precision policy put on kernels over weights packed for
AMX's ``tdpbf16ps`` and AVX512-BF16's ``vdpbf16ps``.

After :mod:`tuner.passes.precision` and constant folding, a float matmul under the bf16 policy is

    matmul(astype(x, bf16)[..., K], W_bf16[K, N], out_dtype=float32)

with ``W`` a constant. ``tdpbf16ps`` multiplies a 16-row tile of 32 bf16 inputs by a weight tile whose
row ``r`` holds, for each of 16 output columns, the pair of reduction elements ``2r, 2r+1`` (64 bytes),
accumulating in fp32. On a CPU with AMX-BF16 this pass replaces each such matmul that is whole intrinsic
blocks (:func:`schedules.amx.fits_amx_tiles`: rows a multiple of 16, columns of 32, reduction of 32) by a
TE kernel reading the weight packed in that order once, here:

    Wp[N/16, K/2, 16, 2]          Wp[n // 16, k // 2, n % 16, k % 2] = W[k, n]

and marks its block :data:`schedules.vnni.BF16_BLOCK`, which :mod:`schedules.amx` tiles onto the
intrinsic. On a CPU with AVX512-BF16 (Zen 4 too), the matmuls AMX does not take whose columns are a
multiple of 16 and reduction of 2 get the same kernel, which :mod:`schedules.vnni` tensorizes with
``vdpbf16ps`` (:mod:`kiln_tvm.x86_bf16`: it reads the same 16 columns by 2 reduction elements). There,
the NHWC convolutions (one group, output channels a multiple of 16) get the convolution kernel of
:mod:`tuner.passes.int8_packing` over a weight packed likewise, an odd channel count filled by one zero channel:

    Wp[O/16, KH, KW, C/2, 16, 2]  Wp[o // 16, kh, kw, c // 2, o % 16, c % 2] = W[o, kh, kw, c]

On a CPU with AMX-BF16, a pointwise (1x1) convolution, of stride 1 or more, is a matmul of its (strided)
pixels by its channels: it goes on the AMX matmul kernel over ``[N*H*W, C]`` rows when those are whole
blocks (16 pixels a tile, output channels a multiple of 32, input channels of 32):

    y[n, h, w, :] = x[n, s*h, s*w, :] @ W[:, 0, 0, :].T

Other convolutions stay off AMX (its 16 tile rows would have to be 16 consecutive output pixels of a
window).

A matmul of two computed operands (attention's ``Q @ K^T`` and ``P @ V``, batched over heads) has no
weight to pack at compile time: a kernel of its own packs the second operand as the model runs, batch by
batch, in the same order (``Bp[..., N/16, K/2, 16, 2]``), marked so that the search never inlines it
into the matmul (which would then read the operand unpacked), and the matmul goes on AMX tiles where it is
whole blocks (on ``vdpbf16ps`` only when asked: ``Bf16AmxReport.dot_activations``). The others stay as
they were (bf16 operands, products widened to fp32 by TVM).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln_tvm import RelaxConstant, relax, tvm
from kiln_tvm.x86_amx import BF16
from kiln_tvm.x86_bf16 import DPBF16_LANES, DPBF16_PAIR
from schedules.amx import fits_amx_tiles
from schedules.vnni import BF16_BLOCK
from tuner.passes.int8_packing import (
    emit_packed_conv2d,
    emit_pointwise_matmul,
    matmul_kernel,
    pack_conv_weight,
    pack_matmul_weight,
    pointwise_as_matmul,
)
from tuner.passes.marked_kernels import conv2d_layout_misfit, emit_marked_kernel
from tuner.passes.qdq_lowering import describe_core
from tuner.passes.rewrite import rewrite_functions
from tuner.passes.windowed_gemm import emit_windowed_gemm, pack_windowed_weight, windowed_as_gemm

te = tvm.te


@dataclass
class Bf16AmxReport:
    """The bf16 matmuls now on AMX-BF16 kernels, the matmuls and convolutions on AVX512-BF16 ones, and the
    operators left as they were (why); ``amx`` and ``dot``: whether the CPU has AMX-BF16 and AVX512-BF16."""

    packed: list[str] = field(default_factory=list)  # "matmul 128x256 @ 256x1024", "conv2d ... as matmul"
    dot_packed: list[str] = field(default_factory=list)  # "matmul 1x512 @ 512x1024"
    dot_convolutions: list[str] = field(default_factory=list)  # "conv2d 1x56x56x64 * 64x3x3x64"
    unpacked: list[str] = field(default_factory=list)  # "matmul 1x512 @ 512x10: 1 rows ..."
    amx: bool = True
    dot: bool = False
    #: Whether a matmul of two computed operands goes on ``vdpbf16ps`` where AMX does not take it. Off:
    #: on Zen 4 it halved attention's matmul kernels but not the model (the packing kernels and the calls
    #: cost what they gained; bench/RESULTS.md), so there they stay widened.
    dot_activations: bool = False


def pack_for_amx_bf16(report: Bf16AmxReport | None = None) -> tvm.transform.Pass:
    """A module pass putting the bf16 matmuls AMX's ``tdpbf16ps`` or AVX512-BF16's ``vdpbf16ps`` serve, and
    the NHWC convolutions ``vdpbf16ps`` serves (the report says which the CPU has), on packed kernels."""
    sink = report if report is not None else Bf16AmxReport()

    @tvm.transform.module_pass(opt_level=0, name="KilnPackForAMXBF16")
    def rewrite(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        return relax.transform.DeadCodeElimination()(rewrite_functions(_Bf16Mutator(mod, sink)))

    return rewrite


@relax.expr_functor.mutator
class _Bf16Mutator(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, report: Bf16AmxReport) -> None:
        super().__init__(mod)
        self.report = report
        self.matmul = tvm.ir.Op.get("relax.matmul")
        self.conv2d = tvm.ir.Op.get("relax.nn.conv2d")

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call, relax.Call) or not _is_bf16_core(call):
            return call
        if call.op.same_as(self.matmul):
            return self._matmul(call)
        if call.op.same_as(self.conv2d) and self.report.amx:
            for on_tiles in (self._pointwise_conv2d_on_amx, self._windowed_conv2d_on_amx):
                rewritten = on_tiles(call)
                if rewritten is not None:
                    return rewritten
        if call.op.same_as(self.conv2d) and self.report.dot:
            return self._conv2d(call)
        return call

    def _declined(self, call: relax.Call, why: str) -> relax.Call:
        self.report.unpacked.append(f"{describe_core(call)}: {why}")
        return call

    def _matmul(self, call: relax.Call) -> relax.Expr:
        weight = _constant(call.args[1])
        if weight is None:
            return self._activation_matmul(call)
        if weight.ndim != 2:
            return self._declined(call, "its weight is not a 2-D constant")
        x_shape = [int(d) for d in call.args[0].ty.shape]
        rows = x_shape[-2] if len(x_shape) > 1 else 1
        depth, cols = (int(d) for d in weight.shape)
        if self.report.amx and fits_amx_tiles(BF16, rows, cols, depth):
            self.report.packed.append(describe_core(call))
            name = "amx_bf16_matmul"
        elif self.report.dot and cols % DPBF16_LANES == 0 and depth % DPBF16_PAIR == 0:
            self.report.dot_packed.append(describe_core(call))
            name = "dpbf16_matmul"
        else:
            why = []
            if self.report.amx:
                why.append("not whole 16-row x 32-column x 32-deep AMX blocks")
            if self.report.dot:
                why.append(f"{cols} columns, {depth} deep (vdpbf16ps: multiples of 16, 2)")
            return self._declined(call, "; ".join(why))
        packed = relax.const(pack_matmul_weight(weight, BF16.pair), "bfloat16")

        def kernel(x: Any, w: Any) -> Any:
            return matmul_kernel(x, w, "float32", name)

        return emit_marked_kernel(self.builder_, kernel, [call.args[0], packed], name, BF16_BLOCK)

    def _activation_matmul(self, call: relax.Call) -> relax.Expr:
        """A matmul of two computed operands (attention's QK^T and PV) on AMX tiles where it is whole
        blocks, else on ``vdpbf16ps``: its second operand packed as the model runs, batch by batch
        (:func:`packed_operand`)."""
        x, b = call.args[:2]
        x_shape, b_shape = ([int(d) for d in a.ty.shape] for a in (x, b))
        if len(x_shape) < 2 or len(b_shape) != len(x_shape) or x_shape[:-2] != b_shape[:-2]:
            return self._declined(call, "its operands' batch dimensions differ (a broadcast)")
        rows, (depth, cols) = x_shape[-2], b_shape[-2:]
        on_amx = self.report.amx and fits_amx_tiles(BF16, rows, cols, depth)
        dot = self.report.dot and self.report.dot_activations
        if not on_amx and not (dot and cols % DPBF16_LANES == 0 and depth % DPBF16_PAIR == 0):
            why = []
            if self.report.amx:
                why.append("not whole 16-row x 32-column x 32-deep AMX blocks")
            if dot:
                why.append(f"{cols} columns, {depth} deep (vdpbf16ps: multiples of 16, 2)")
            elif self.report.dot:
                why.append(
                    "two computed operands go on AMX tiles only (on vdpbf16ps, packing the second as the "
                    "model runs cost what the kernel gained, bench/RESULTS.md)"
                )
            return self._declined(call, "; ".join(why))
        described = f"{describe_core(call)} (packed as it runs)"
        (self.report.packed if on_amx else self.report.dot_packed).append(described)
        packed = packed_operand(self.builder_, b, DPBF16_LANES, DPBF16_PAIR)

        name = "amx_bf16_matmul" if on_amx else "dpbf16_matmul"

        def kernel(data: Any, w: Any) -> Any:
            return batched_matmul_kernel(data, w, "float32", name)

        return emit_marked_kernel(self.builder_, kernel, [x, packed], name, BF16_BLOCK)

    def _pointwise_conv2d_on_amx(self, call: relax.Call) -> relax.Expr | None:
        """A pointwise NHWC convolution as the AMX matmul of its strided pixels by its channels, when those
        are whole AMX blocks; None for any other convolution."""
        weight = _constant(call.args[1])
        pointwise = pointwise_as_matmul(call, weight) if weight is not None else None
        if pointwise is None or not fits_amx_tiles(BF16, pointwise.rows, pointwise.cols, pointwise.channels):
            return None
        self.report.packed.append(pointwise.describe(call))
        packed = relax.const(pack_matmul_weight(pointwise.weight(weight), BF16.pair), "bfloat16")
        return emit_pointwise_matmul(
            self.builder_, call, pointwise, packed, dtype="float32", name="amx_bf16_matmul", mark=BF16_BLOCK
        )

    def _windowed_conv2d_on_amx(self, call: relax.Call) -> relax.Expr | None:
        """A windowed NHWC convolution as an AMX implicit GEMM over its flattened padded input
        (:mod:`tuner.passes.windowed_gemm`), when its channels are whole AMX blocks; None otherwise."""
        weight = _constant(call.args[1])
        windowed = windowed_as_gemm(call, weight, BF16) if weight is not None else None
        if windowed is None:
            return None
        self.report.packed.append(windowed.describe(call))
        packed = relax.const(
            pack_windowed_weight(windowed.weight(weight), DPBF16_LANES, BF16.pair), "bfloat16"
        )
        return emit_windowed_gemm(
            self.builder_, call, windowed, packed, dtype="float32", name="amx_bf16_matmul", mark=BF16_BLOCK
        )

    def _conv2d(self, call: relax.Call) -> relax.Expr:
        weight = _constant(call.args[1])
        why = "its weight is not a constant" if weight is None else conv2d_layout_misfit(call)
        if weight is None or why:
            return self._declined(call, why)
        if weight.shape[0] % DPBF16_LANES:
            return self._declined(call, f"{weight.shape[0]} output channels (vdpbf16ps: a multiple of 16)")
        # An odd channel count gets one zero channel, in the weight here and in the input's padding.
        extra = weight.shape[3] % DPBF16_PAIR
        if extra:
            weight = np.pad(weight, [(0, 0), (0, 0), (0, 0), (0, extra)])
        self.report.dot_convolutions.append(describe_core(call))
        packed = relax.const(pack_conv_weight(weight, DPBF16_LANES, DPBF16_PAIR), "bfloat16")
        return emit_packed_conv2d(
            self.builder_,
            call,
            packed,
            dtype="float32",
            name="dpbf16_conv2d",
            mark=BF16_BLOCK,
            extra_channels=extra,
        )


def packed_operand(builder: relax.BlockBuilder, b: relax.Expr, lanes: int, pair: int) -> relax.Expr:
    """``B[..., K, N]`` -> ``Bp[..., N/lanes, K/pair, lanes, pair]``, batch by batch: the packing of
    :func:`~tuner.passes.int8_packing.pack_matmul_weight` for an operand computed as the model runs, as a
    reshape and a transpose, which FuseOps fuses with the layout operators that produce the operand
    (attention's head split and transposes): the packing costs no kernel of its own."""
    *batch, depth, cols = (int(d) for d in b.ty.shape)
    blocked = builder.emit(relax.op.reshape(b, [*batch, depth // pair, pair, cols // lanes, lanes]))
    n = len(batch)
    return builder.emit(relax.op.permute_dims(blocked, [*range(n), n + 2, n, n + 3, n + 1]))


def batched_matmul_kernel(x: Any, packed: Any, dtype: str, name: str) -> Any:
    """``out[..., m, n] = sum_k dtype(x[..., m, k]) * dtype(Bp[..., n // L, k // P, n % L, k % P])``: the
    matmul of :func:`~tuner.passes.int8_packing.matmul_kernel` over an operand packed per batch."""
    reduce = te.reduce_axis((0, x.shape[-1]), name="k")
    lanes, pair = (int(d) for d in packed.shape[-2:])
    channels = packed.shape[-4] * lanes

    def body(*index: Any) -> Any:
        *outer, m, n = index
        w = packed[(*outer, n // lanes, reduce // pair, n % lanes, reduce % pair)]
        return te.sum(x[(*outer, m, reduce)].astype(dtype) * w.astype(dtype), axis=reduce)

    return te.compute((*x.shape[:-1], channels), body, name=name)


def _constant(expr: relax.Expr) -> np.ndarray | None:
    return expr.value.numpy() if isinstance(expr, RelaxConstant) else None


def _is_bf16_core(call: relax.Call) -> bool:
    if len(call.args) < 2 or str(getattr(call.attrs, "out_dtype", "")) != "float32":
        return False
    return all(str(getattr(a.ty, "dtype", "")) == "bfloat16" for a in call.args[:2])
