"""Tiling packed matmuls onto Intel AMX's tile multiplies, on CPUs that have them.

Two kinds of kernel are packed for AMX's weight tiles, each block marked by its pass:

* int8: the kernels :mod:`tuner.passes.int8_packing` packs (``Wp[N/16, K/4, 16, 4]``, :data:`schedules.vnni.
  VNNI_BLOCK`), in the order both ``vpdpbusd`` and ``tdpbusd`` read;
* bf16: the matmuls of the ``bf16`` precision policy that :mod:`tuner.passes.bf16_packing` packs
  (``Wp[N/16, K/2, 16, 2]``, :data:`schedules.vnni.BF16_BLOCK`) for ``tdpbf16ps``.

On a CPU with the kind's AMX multiply, the rule here tiles each such matmul whose rows are a multiple of
16, columns of 32 and reduction of one tile row (64 int8, 32 bf16) into blocks of :mod:`kiln_tvm.x86_amx`'s
intrinsics, and leaves the rest to the rules after it: VNNI for int8, ``vdpbf16ps`` or plain tiling for
bf16. Convolutions reach it as matmuls: pointwise ones over their pixels, windowed ones as implicit GEMMs
whose taps are reduction loops around the tile multiply (:mod:`tuner.passes.windowed_gemm`).

The intrinsic block is fixed per design space (16 or 32 rows by 32 columns, the deepest registered
reduction that divides the kernel's); the search samples the blocking of the loops around it, which the
parallel postprocessor then fuses and spreads over the cores. MetaSchedule's ``MultiLevelTilingWithIntrin``
cannot do the tiling: its applicability check does not map the weight's packed indices (``j // 16``).
"""

from __future__ import annotations

from typing import Any

from kiln_tvm import Target, derived_object, ms, s_tir, tvm
from kiln_tvm.x86_amx import (
    BF16,
    DEPTHS,
    INT8,
    TILE_COLS,
    TILE_ROWS,
    AmxKind,
    amx_intrinsic_name,
    amx_zero_name,
    register_amx_kind,
)
from schedules.isa import isa_profile
from schedules.vnni import BF16_BLOCK, VNNI_BLOCK, keep_scalar_around_intrinsic

#: Columns of one intrinsic block (two weight tiles: the only width registered).
BLOCK_COLS = 2 * TILE_COLS
#: The block annotation marking each kind's packed kernels.
_MARK = {INT8.name: VNNI_BLOCK, BF16.name: BF16_BLOCK}
# Read by MetaSchedule's RewriteReductionBlock and RewriteTensorize postprocessors.
_AUTO_TENSORIZE = "meta_schedule.auto_tensorize"
_AUTO_TENSORIZE_INIT = "meta_schedule.auto_tensorize_init"
_TILING_STRUCTURE = "meta_schedule.tiling_structure"  # set: MetaSchedule's tiling rules skip the block


def has_amx_int8(target: Target) -> bool:
    """Whether ``target``'s CPU has AMX tiles with the int8 multiply (Intel Xeon since Sapphire Rapids)."""
    return isa_profile(target).amx_int8


def has_amx_bf16(target: Target) -> bool:
    """Whether ``target``'s CPU has AMX tiles with the bf16 multiply (Intel Xeon since Sapphire Rapids)."""
    return isa_profile(target).amx_bf16


def amx_kinds(target: Target) -> list[AmxKind]:
    """The AMX multiplies ``target``'s CPU has."""
    return [kind for kind, has in ((INT8, has_amx_int8), (BF16, has_amx_bf16)) if has(target)]


def fits_amx_tiles(kind: AmxKind, rows: int, cols: int, depth: int) -> bool:
    """Whether a ``rows`` x ``depth`` by ``depth`` x ``cols`` matmul of ``kind`` is whole intrinsic blocks."""
    return rows % TILE_ROWS == 0 and cols % BLOCK_COLS == 0 and depth % kind.depth == 0


def amx_matmul_extents(sch: s_tir.Schedule, block: Any, kind: AmxKind) -> tuple[int, int, int] | None:
    """``(rows, columns, reduction)`` of a matmul block packed for ``kind`` that AMX can serve, else None:
    its spatial loops first, the rows and columns the last two of them, then its reduction loops, the
    innermost the one tiles reduce (a convolution's taps, :mod:`tuner.passes.windowed_gemm`, above it)."""
    stmt = sch.get(block)
    if _MARK[kind.name] not in stmt.annotations or len(stmt.iter_vars) < 3:
        return None
    kinds = [int(v.iter_type) for v in stmt.iter_vars]  # 0: spatial, 2: reduction
    spatial = kinds.index(2) if 2 in kinds else len(kinds)
    if spatial < 2 or any(k != 0 for k in kinds[:spatial]) or any(k != 2 for k in kinds[spatial:]):
        return None
    loops = sch.get_loops(block)
    extents = [sch.get(loop).extent for loop in loops]
    if len(loops) != len(kinds) or not all(isinstance(e, tvm.tirx.IntImm) for e in extents):
        return None
    rows, cols, depth = int(extents[spatial - 2]), int(extents[spatial - 1]), int(extents[-1])
    return (rows, cols, depth) if fits_amx_tiles(kind, rows, cols, depth) else None


def amx_blocks(kind: AmxKind, rows: int, depth: int) -> list[tuple[int, int]]:
    """The ``(tile rows, reduction tile rows)`` intrinsic blocks for a kernel: 32 and 16 rows where they
    fit, each with the deepest registered reduction dividing ``depth``."""
    reduction = max(d for d in DEPTHS if (depth // kind.depth) % d == 0)
    return [(tiles, reduction) for tiles in (2, 1) if rows % (tiles * TILE_ROWS) == 0]


@derived_object
class AmxTiling(ms.schedule_rule.PyScheduleRule):
    """Packed matmuls onto AMX intrinsic blocks, one design space per block size, for the ``kinds`` the
    target's CPU has."""

    def __init__(self, kinds: tuple[str, ...] = (INT8.name, BF16.name)) -> None:
        super().__init__()
        self.kinds = tuple(kinds)

    def _initialize_with_tune_context(self, context: Any) -> None:
        pass

    def apply(self, sch: s_tir.Schedule, block: Any) -> list[s_tir.Schedule]:
        for kind in (INT8, BF16):
            extents = amx_matmul_extents(sch, block, kind) if kind.name in self.kinds else None
            if extents is not None:
                register_amx_kind(kind)  # here, not up front: most models have no packed matmul
                rows, _, depth = extents
                return [_tile(sch.copy(), block, kind, *shape) for shape in amx_blocks(kind, rows, depth)]
        return [sch]

    def clone(self) -> AmxTiling:
        return AmxTiling(self.kinds)


def _tile(sch: s_tir.Schedule, block: Any, kind: AmxKind, tiles: int, reduction: int) -> s_tir.Schedule:
    """``sch`` with ``block``'s last three loops tiled around one intrinsic block and marked for it."""
    name = sch.get(block).name_hint
    spatial = [int(v.iter_type) for v in sch.get(block).iter_vars].index(2)
    loops = sch.get_loops(block)
    m, n, taps, k = loops[spatial - 2], loops[spatial - 1], loops[spatial:-1], loops[-1]
    m_blocks, m_inner = sch.split(m, [None, tiles * TILE_ROWS])
    n_blocks, n_inner = sch.split(n, [None, BLOCK_COLS])
    k_blocks, k_inner = sch.split(k, [None, reduction * kind.depth])
    m_outer, m_mid = sch.split(m_blocks, sch.sample_perfect_tile(m_blocks, n=2, max_innermost_factor=16))
    n_outer, n_mid = sch.split(n_blocks, sch.sample_perfect_tile(n_blocks, n=2, max_innermost_factor=16))
    sch.reorder(m_outer, n_outer, n_mid, m_mid, *taps, k_blocks, m_inner, n_inner, k_inner)
    tiled = sch.blockize(m_inner)
    cols = BLOCK_COLS // TILE_COLS
    sch.annotate(tiled, _AUTO_TENSORIZE, amx_intrinsic_name(kind, tiles, cols, reduction))
    sch.annotate(tiled, _AUTO_TENSORIZE_INIT, amx_zero_name(kind, tiles, cols))
    # The VNNI rule and the plain tiling after this one must leave the block alone.
    sch.unannotate(block, _MARK[kind.name])
    sch.annotate(block, _TILING_STRUCTURE, "amx")
    keep_scalar_around_intrinsic(sch, f"{name}_o")
    return sch
