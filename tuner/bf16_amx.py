"""bf16 matmuls of the ``bf16`` precision policy put on kernels over weights packed for AMX's ``tdpbf16ps``
and AVX512-BF16's ``vdpbf16ps``.

After :mod:`tuner.precision` and constant folding, a float matmul under the bf16 policy is

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
``vdpbf16ps`` (:mod:`kiln_tvm.x86_bf16`: it reads the same 16 columns by 2 reduction elements). The others
stay as they were (bf16 operands, products widened to fp32 by TVM).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kiln_tvm import relax, tvm
from kiln_tvm.x86_amx import BF16
from kiln_tvm.x86_bf16 import DPBF16_LANES, DPBF16_PAIR
from schedules.amx import fits_amx_tiles
from schedules.vnni import BF16_BLOCK
from tuner.graph_rewrite import rewrite_functions
from tuner.quant.qdq import describe_core
from tuner.quant.vnni import emit_marked_kernel, pack_matmul_weight

te = tvm.te
_Constant = tvm.ir.expr.Constant
_LANES, _PAIR = 16, BF16.pair


@dataclass
class Bf16AmxReport:
    """The bf16 matmuls now on AMX-BF16 kernels, those on AVX512-BF16 ones, and those left as they were
    (why); ``amx`` and ``dot``: whether the CPU has AMX-BF16 and AVX512-BF16."""

    packed: list[str] = field(default_factory=list)  # "matmul 128x256 @ 256x1024"
    dot_packed: list[str] = field(default_factory=list)  # "matmul 1x512 @ 512x1024"
    unpacked: list[str] = field(default_factory=list)  # "matmul 1x512 @ 512x10: 1 rows ..."
    amx: bool = True
    dot: bool = False


def pack_for_amx_bf16(report: Bf16AmxReport | None = None) -> tvm.transform.Pass:
    """A module pass putting the bf16 matmuls AMX's ``tdpbf16ps`` or AVX512-BF16's ``vdpbf16ps`` serve (the
    report says which the CPU has) on packed kernels."""
    sink = report if report is not None else Bf16AmxReport()

    @tvm.transform.module_pass(opt_level=0, name="KilnPackForAMXBF16")
    def rewrite(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        return relax.transform.DeadCodeElimination()(rewrite_functions(_Bf16Mutator(mod, sink)))

    return rewrite


def bf16_matmul_kernel(x: Any, packed: Any, name: str = "amx_bf16_matmul") -> Any:
    """``out[..., n] = sum_k float32(x[..., k]) * float32(Wp[n // 16, k // 2, n % 16, k % 2])``, its block
    ``name``."""
    reduce = te.reduce_axis((0, x.shape[-1]), name="k")
    channels = packed.shape[0] * _LANES

    def body(*index: Any) -> Any:
        *outer, n = index
        w = packed[n // _LANES, reduce // _PAIR, n % _LANES, reduce % _PAIR]
        return te.sum(x[(*outer, reduce)].astype("float32") * w.astype("float32"), axis=reduce)

    return te.compute((*x.shape[:-1], channels), body, name=name)


@relax.expr_functor.mutator
class _Bf16Mutator(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, report: Bf16AmxReport) -> None:
        super().__init__(mod)
        self.report = report
        self.matmul = tvm.ir.Op.get("relax.matmul")

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call, relax.Call) or not call.op.same_as(self.matmul) or not _is_bf16_core(call):
            return call
        weight = call.args[1].value.numpy() if isinstance(call.args[1], _Constant) else None
        if weight is None or weight.ndim != 2:
            self.report.unpacked.append(f"{describe_core(call)}: its weight is not a 2-D constant")
            return call
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
            self.report.unpacked.append(f"{describe_core(call)}: {'; '.join(why)}")
            return call
        packed = relax.const(pack_matmul_weight(weight, _PAIR), "bfloat16")

        def kernel(x: Any, w: Any) -> Any:
            return bf16_matmul_kernel(x, w, name)

        return emit_marked_kernel(self.builder_, kernel, [call.args[0], packed], name, BF16_BLOCK)


def _is_bf16_core(call: relax.Call) -> bool:
    if len(call.args) < 2 or str(getattr(call.attrs, "out_dtype", "")) != "float32":
        return False
    return all(str(getattr(a.ty, "dtype", "")) == "bfloat16" for a in call.args[:2])
