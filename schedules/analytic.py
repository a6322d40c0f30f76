"""Analytic schedules for the contractions on CPUs: a register tile sized from the ISA, not searched.

The CPU counterpart of TVM's ``dlight`` rules for GPUs, in the manner of BLIS's and oneDNN's micro-kernels:
a float32 matmul, batched matmul, dense or convolution computes its output in register tiles of ``rows``
points of its outer axes by ``vectors`` fp32 vectors of its innermost (contiguous) output axis, so that
the tile's accumulators, one vector of the weight and one broadcast value of the input fit the vector
registers with two to spare (on AVX2's 16: 4 rows by 2 vectors of 8; on AVX-512's 32: 8 rows by 3 of 16).
The innermost input-contiguous reduction runs in blocks of up to 32 inside the tile loops, and the weight
follows the schedule's access order (MetaSchedule's ``RewriteLayout``, applied once at compile time).

The schedule is a set of decisions on the task's own MetaSchedule design space: ``SSRSRS`` multi-level
tiling, accumulating in the output buffer or, for a short reduction, writing back per parallel tile with
the epilogue fused there; the register tile's loops unrolled and the reduction block not (unrolling that
too ran 1.2-1.6x slower). So it replays as a record, the search starts from it and plain TVM reads its
trace.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from kiln_tvm import SCHEDULE_ERRORS, s_tir
from schedules.isa import IsaProfile
from schedules.poly.search import FootprintPruner, TracedTiling, traced_tilings, unrolled_to_cover

log = logging.getLogger(__name__)

#: Vector registers left free beyond the tile's accumulators, one weight vector each and a broadcast.
SPARE_REGISTERS = 2
#: The most rows (points of the outer axes) and vectors a register tile spans.
MAX_ROWS = 8
MAX_VECTORS = 4
#: The longest block of the contiguous reduction inside the tile loops.
REDUCTION_BLOCK = 32
#: Reductions up to this length write back per parallel tile, the epilogue fused (see _space_for_reduction).
SHORT_REDUCTION = 96

_TILED = "SSRSRS"


@dataclass(frozen=True)
class RegisterTile:
    """``rows`` points of the outer axes (``row_factors``: of the innermost outer axis, then of the next)
    by ``vectors`` fp32 vectors of the innermost output axis."""

    row_factors: tuple[int, ...]
    vectors: int
    lanes: int

    @property
    def rows(self) -> int:
        return math.prod(self.row_factors)

    @property
    def columns(self) -> int:
        return self.vectors * self.lanes


def register_tile(row_extents: list[int], columns_extent: int, isa: IsaProfile) -> RegisterTile | None:
    """The largest register tile (accumulators ``rows`` x ``vectors``) whose factors divide the extents
    (``row_extents``: the outer axes', innermost first; rows come from the first two) and that fits
    ``isa``'s vector registers; None when the innermost axis holds no whole vector."""
    lanes, budget = isa.fp32_lanes, isa.vector_registers - SPARE_REGISTERS
    inner, outer = ([*row_extents, 1, 1])[:2]
    best: RegisterTile | None = None
    for vectors in range(1, MAX_VECTORS + 1):
        if columns_extent % (vectors * lanes):
            continue
        for first in _divisors(inner, MAX_ROWS):
            for second in _divisors(outer, MAX_ROWS // first):
                if first * second * vectors + vectors + 1 > budget:
                    continue
                tile = RegisterTile((first, second), vectors, lanes)
                if best is None or _preferred(tile) > _preferred(best):
                    best = tile
    return best


def _divisors(extent: int, at_most: int) -> list[int]:
    return [d for d in range(1, min(extent, at_most) + 1) if extent % d == 0]


def _preferred(tile: RegisterTile) -> tuple[int, int, int, int]:
    # Most accumulators; then the fewest loads per step (a broadcast per row, a load per vector); then
    # fewer vectors: of AVX2's 4x2 and 2x4, 4x2 measured up to 1.5x faster on BERT's matmuls; then rows
    # from one axis.
    return (tile.rows * tile.vectors, -(tile.rows + tile.vectors), -tile.vectors, -tile.row_factors[1])


def analytic_schedule(context: Any, isa: IsaProfile) -> s_tir.Schedule | None:
    """The analytic schedule of ``context``'s task (its space generator: Kiln's ``cpu`` space), built and
    postprocessed; None when the task is not one float32 contraction the rule models (no tiled block,
    several, a tensorized one, an innermost axis without a whole vector)."""
    if not isa.features:
        return None
    mod = context.mod
    spaces = list(context.space_generator.generate_design_space(mod))
    if not spaces:
        return None
    space = _space_for_reduction(spaces, _reduction_length(traced_tilings(spaces[0].trace)))
    tiled = traced_tilings(space.trace)
    if len(tiled) != 1 or tiled[0].structure != _TILED:
        return None
    if not _float32_block(mod, tiled[0].block):
        return None
    found = analytic_factors(tiled[0], isa)
    if found is None:
        return None
    tile, factors = found
    trace = unrolled_to_cover(space.trace, tile.rows * tile.columns)
    for inst, decided in zip(tiled[0].instructions, factors, strict=True):
        trace = trace.with_decision(inst, list(decided), True)
    sch = s_tir.Schedule(mod, seed=1)
    try:
        trace.apply_to_schedule(sch, remove_postproc=True)
        sch.enter_postproc()
        if not all(p.apply(sch) for p in _postprocs(context)):
            return None
    except SCHEDULE_ERRORS as error:
        log.info(
            "the analytic schedule of %s does not apply: %s", context.task_name, str(error).splitlines()[0]
        )
        return None
    return sch


def analytic_factors(
    tiled: TracedTiling, isa: IsaProfile
) -> tuple[RegisterTile, list[tuple[int, ...]]] | None:
    """The register tile, and per loop of the tiled block its ``SSRSRS`` factors: spatial loops in four
    levels (outer, parallel, cache block, register tile), reductions in two (outer, inner block)."""
    extents = [math.prod(f) for f in tiled.factors]
    spatial = [i for i, f in enumerate(tiled.factors) if len(f) == 4]
    reduction = [i for i, f in enumerate(tiled.factors) if len(f) == 2]
    if not spatial or not reduction:
        return None
    columns = spatial[-1]
    outer = [i for i in reversed(spatial[:-1]) if extents[i] > 1][:2]  # innermost first
    tile = register_tile([extents[i] for i in outer], extents[columns], isa)
    if tile is None:
        return None
    row_factor = dict(zip(outer, tile.row_factors, strict=False))
    inner_reductions = _reduction_blocks([extents[i] for i in reduction], tile.lanes)
    inner_reductions = {reduction[k]: v for k, v in inner_reductions.items()}
    factors: list[tuple[int, ...]] = []
    for i, extent in enumerate(extents):
        if i == columns:
            block = 2 if (extent // tile.columns) % 2 == 0 else 1
            factors.append((1, extent // (tile.columns * block), block, tile.columns))
        elif i in row_factor:
            rows = row_factor[i]
            block = 2 if i == outer[0] and (extent // rows) % 2 == 0 else 1
            factors.append((1, extent // (rows * block), block, rows))
        elif i in spatial:
            factors.append((1, extent, 1, 1))
        elif i in inner_reductions:
            factors.append((extent // inner_reductions[i], inner_reductions[i]))
        else:
            factors.append((extent, 1))
    return tile, factors


def _postprocs(context: Any) -> list[Any]:
    # The cpu-poly space's cache pruner judges sampled tilings; this one is chosen, not sampled.
    return [p for p in context.space_generator.postprocs if not isinstance(p, FootprintPruner)]


def _reduction_blocks(extents: list[int], lanes: int) -> dict[int, int]:
    """The inner block of each reduction loop (by position in ``extents``) that has one: up to
    :data:`REDUCTION_BLOCK` of the innermost (input-contiguous) loop and, while that block is shorter than
    a vector's lanes, the whole of the loop outside it too (a convolution over 3 input channels reduces
    over its kernel's width inside the tile as well: ResNet's 7x7 stem ran at 37 % of the FMA peak without, 74 % with)."""
    blocks: dict[int, int] = {}
    span = 1
    for position in reversed(range(len(extents))):
        extent = extents[position]
        if blocks and span >= lanes:
            break
        block = max(_divisors(extent, REDUCTION_BLOCK)) if not blocks else extent
        blocks[position] = block
        span *= block
    return blocks


def _reduction_length(tiled: list[TracedTiling]) -> int:
    """The product of the reduction loops' extents of the one tiled block (0 when there is not one)."""
    if len(tiled) != 1:
        return 0
    return math.prod(math.prod(f) for f in tiled[0].factors if len(f) == 2)


def _space_for_reduction(spaces: list[Any], reduction: int) -> Any:
    """The design space to decide: for a reduction of at most :data:`SHORT_REDUCTION`, the first that
    writes each parallel tile's result back with the epilogue fused there (``ReverseComputeAt``), else
    the first that accumulates in the output buffer with the epilogue a pass of its own. Measured on
    Zen 3: with a short reduction the output's second pass dominates (MobileNetV2's 1x1 expansion over 24
    channels, 4.5x; its 3x3 depthwise convolutions, 3.6x; 1.3-1.5x up to 96 channels); beyond, the
    in-place space ran as fast or faster: 1.1-1.2x on BERT's 768-deep matmuls and MobileNetV2's 960-deep
    projections, 1.3x on ResNet's 7x7 stem (147 deep, a 3 MiB output); ResNet's 1x1 (64-256 deep) and
    3x3 convolutions within the noise of either, MobileNetV2's 160- and 384-deep ones 1.15x slower."""
    fused = [s for s in spaces if any(i.kind.name == "ReverseComputeAt" for i in s.trace.insts)]
    in_place = [s for s in spaces if s not in fused]
    preferred = fused if 0 < reduction <= SHORT_REDUCTION else in_place
    return (preferred or spaces)[0]


def _float32_block(mod: Any, name: str) -> bool:
    """Whether the block ``name`` writes float32 from float32 operands (not a tensorized integer or bf16
    kernel, whose tiles the dot product's shape decides)."""
    sch = s_tir.Schedule(mod)
    try:
        block = sch.get(sch.get_sblock(name))
    except SCHEDULE_ERRORS:
        return False
    if any(key.startswith("meta_schedule.auto_tensorize") for key in block.annotations):
        return False
    buffers = [r.source for r in block.reads] + [w.source for w in block.writes]
    return all(str(b.dtype) == "float32" for b in buffers)
