"""Tensorizing integer kernels with x86's VNNI dot product (``vpmaddwd`` on CPUs without VNNI), and only
the kernels laid out for it.

Kiln's graph pass :mod:`tuner.passes.int8_packing` gives each integer matmul and convolution it can serve a kernel
over weights packed ``[N/16, K/4, 16, 4]`` (16 output channels by 4 reduction elements: the 64 bytes one
``vpdpbusd zmm`` reads; 8 by 4 for the ``ymm`` form on AVX-VNNI CPUs without AVX-512) and marks that kernel's block with :data:`VNNI_BLOCK`. MetaSchedule's
``MultiLevelTilingWithIntrin`` would also tensorize an unpacked integer block, which builds and computes
wrong numbers (TVM_NOTES.md), so the rule here applies it to marked blocks alone; the others get the plain
multi-level tiling that follows it in the space.
"""

from __future__ import annotations

from typing import Any

from kiln_tvm import Target, derived_object, ms, register_cpu_tensor_intrinsics, s_tir, tvm
from kiln_tvm.x86_bf16 import DPBF16_INTRINSIC
from kiln_tvm.x86_vnni import (
    AVX2_BYTE_DOT,
    AVX2_WORD_DOT,
    AVX512_BYTE_DOT,
    AVX512_WORD_DOT,
    AVXVNNI_DOT,
    AVXVNNI_LANES,
    VNNI_DOT,
    VNNI_LANES,
    IntegerDot,
)
from schedules.isa import isa_profile

#: Block annotation of a kernel whose weight is packed for the VNNI intrinsic.
VNNI_BLOCK = "kiln.vnni_packed"
#: Block annotation of a bf16 matmul whose weight is packed for AMX's ``tdpbf16ps`` (``[N/16, K/2, 16, 2]``).
BF16_BLOCK = "kiln.amx_bf16_packed"
#: Block annotation of an integer kernel over 7-bit weights packed for ``vpmaddubsw`` (CPUs without VNNI).
SEVEN_BIT_BLOCK = "kiln.vnni_packed_7bit"
#: The marks of kernels over packed weights (whose layout MetaSchedule must not rewrite).
PACKED_BLOCKS = (VNNI_BLOCK, BF16_BLOCK, SEVEN_BIT_BLOCK)


def vnni_lanes(target: Target) -> int | None:
    """The output lanes of ``target``'s widest VNNI product: 16 with AVX512-VNNI (``vpdpbusd zmm``: Intel
    since Cascade Lake, AMD since Zen 4), 8 with AVX-VNNI alone (``vpdpbusd ymm``, VEX-encoded: Intel
    since Alder Lake), None without VNNI."""
    isa = isa_profile(target)
    if isa.has("avx512vnni", "avx512f"):
        return VNNI_LANES
    if isa.has("avxvnni"):
        return AVXVNNI_LANES
    return None


def integer_dot(target: Target) -> IntegerDot | None:
    """The dot product ``target``'s integer kernels are tensorized with: VNNI's (:func:`vnni_lanes`) where
    the CPU has it, else ``vpmaddwd`` on int16 products (16 lanes with AVX512-BW, 8 with AVX2), None on
    other CPUs (plain integer kernels)."""
    lanes = vnni_lanes(target)
    if lanes is not None:
        return VNNI_DOT if lanes == VNNI_LANES else AVXVNNI_DOT
    isa = isa_profile(target)
    if isa.has("avx512bw", "avx512f"):
        return AVX512_WORD_DOT
    if isa.has("avx2"):
        return AVX2_WORD_DOT
    return None


def seven_bit_dot(target: Target) -> IntegerDot | None:
    """Where ``target``'s integer kernels use ``vpmaddwd`` on int16 products (no VNNI), the faster
    ``vpmaddubsw`` product the kernels over 7-bit weights get instead; None elsewhere."""
    return {AVX2_WORD_DOT: AVX2_BYTE_DOT, AVX512_WORD_DOT: AVX512_BYTE_DOT}.get(integer_dot(target))


def packed_mark(dot: IntegerDot) -> str:
    """The block annotation of the kernels packed for ``dot`` (each mark is tensorized with one intrinsic)."""
    return SEVEN_BIT_BLOCK if dot.max_weight is not None else VNNI_BLOCK


def has_avx512_bf16(target: Target) -> bool:
    """Whether ``target``'s CPU has AVX512-BF16's ``vdpbf16ps`` (Intel since Cooper Lake, AMD since Zen 4)."""
    return isa_profile(target).avx512_bf16


def has_vnni(target: Target) -> bool:
    """Whether ``target``'s CPU has a VNNI dot product Kiln tensorizes with (:func:`vnni_lanes`)."""
    return vnni_lanes(target) is not None


def has_integer_dot(target: Target) -> bool:
    """Whether ``target``'s integer kernels are tensorized (:func:`integer_dot`)."""
    return integer_dot(target) is not None


def has_packed_block(stmt: Any) -> bool:
    """Whether a PrimFunc's body (or any statement) holds a block over a packed weight
    (:data:`PACKED_BLOCKS`)."""
    if isinstance(stmt, tvm.tirx.PrimFunc):
        return has_packed_block(stmt.body)
    if isinstance(stmt, tvm.s_tir.SBlockRealize):
        marked = any(mark in stmt.block.annotations for mark in PACKED_BLOCKS)
        return marked or has_packed_block(stmt.block.body)
    if isinstance(stmt, tvm.tirx.SeqStmt):
        return any(has_packed_block(s) for s in stmt.seq)
    if isinstance(stmt, tvm.tirx.IfThenElse):
        return has_packed_block(stmt.then_case) or (
            stmt.else_case is not None and has_packed_block(stmt.else_case)
        )
    return hasattr(stmt, "body") and has_packed_block(stmt.body)


#: Loop annotation that stops MetaSchedule's vectorization at the loop (any annotation does).
_NOT_VECTORIZED = "kiln.around_tensor_intrinsic"


def keep_scalar_around_intrinsic(sch: s_tir.Schedule, outer_block: str) -> None:
    """Annotate the innermost loop around the tensorized block ``outer_block``, so that the postprocessor
    vectorizing the innermost spatial loops leaves it alone: vectorizing a loop around the 16-lane
    intrinsic fails to build (``Cannot broadcast lanes=32 ... to 128``) and costs a trial."""
    try:
        loops = sch.get_loops(sch.get_sblock(outer_block))
    except Exception:  # noqa: BLE001 - no tensorized block in this candidate: nothing to protect
        return
    if loops:
        sch.annotate(loops[-1], _NOT_VECTORIZED, 1)


def cpu_tiling_args() -> dict[str, Any]:
    """MetaSchedule's x86 multi-level tiling settings, shared by the stock rule and the VNNI one."""
    return {
        "structure": "SSRSRS",
        "tile_binds": None,
        "max_innermost_factor": 64,
        "vector_load_lens": None,
        "reuse_read": None,
        "reuse_write": ms.schedule_rule.ReuseType(req="may", levels=[1, 2], scope="global"),
    }


@derived_object
class PackedTiling(ms.schedule_rule.PyScheduleRule):
    """MetaSchedule's multi-level tiling around a dot-product ``intrinsic`` (VNNI's, AVX512-BF16's), for
    the blocks marked ``mark`` only: the kernels whose weights Kiln packed in the order it reads."""

    def __init__(self, intrinsic: str, mark: str) -> None:
        super().__init__()
        register_cpu_tensor_intrinsics()  # the rule looks its intrinsic up when it is made
        self.intrinsic, self.mark = intrinsic, mark
        self.inner = ms.schedule_rule.MultiLevelTilingWithIntrin(intrinsic, **cpu_tiling_args())

    def _initialize_with_tune_context(self, context: Any) -> None:
        self.inner._initialize_with_tune_context(context)

    def apply(self, sch: s_tir.Schedule, block: Any) -> list[s_tir.Schedule]:
        if self.mark not in sch.get(block).annotations:
            return [sch]
        name = sch.get(block).name_hint
        tiled = list(self.inner.apply(sch, block))
        for candidate in tiled:
            keep_scalar_around_intrinsic(candidate, f"{name}_o")
        return tiled

    def clone(self) -> PackedTiling:
        return PackedTiling(self.intrinsic, self.mark)


def vnni_tiling(dot: IntegerDot = VNNI_DOT) -> PackedTiling:
    """The tiling of the kernels packed for the integer dot product ``dot`` (:func:`packed_mark`) around its
    intrinsic."""
    return PackedTiling(dot.intrinsic, packed_mark(dot))


def dpbf16_tiling() -> PackedTiling:
    """The tiling of :data:`BF16_BLOCK` kernels around AVX512-BF16's ``vdpbf16ps`` (those AMX's rule,
    before it, did not put on tiles)."""
    return PackedTiling(DPBF16_INTRINSIC, BF16_BLOCK)
