"""A default schedule for transpositions: kernels that only move data, writing their output's innermost
axis from a strided axis of their input (a reshape-and-transpose that splits attention heads, a
layout change).

MetaSchedule's space for such a kernel is a parallel loop and a vector width over the output in order:
every vector of the output gathers its elements from as many cache lines of the input, and the search
has nothing to tile, so it stays at its first candidate (37 µs for the BERT-style encoder's 128 KiB key
transpose on Zen 4). This rule tiles the two axes that are contiguous on either side, the output's
innermost and the one the input's innermost index follows, by the vector width: a tile's input rows and
output rows both stay in L1, the loads gather from lines already loaded, and the stores are whole vectors.
"""

from __future__ import annotations

from typing import Any

from kiln_tvm import Target, normalize_prim_func, s_tir, tvm
from schedules.loops import fp32_lanes, loop_extent


def input_contiguous_axis(block: Any, variables: list[Any]) -> int | None:
    """The position in ``variables`` (the block's iteration variables, in loop order) of the one that
    steps the block's one input along its innermost dimension by one element, or None when none does
    (the index is not affine in them)."""
    (read,) = block.reads
    analyzer = tvm.sym.Analyzer()
    for iv in block.iter_vars:
        analyzer.bind(iv.var, iv.dom)
    # A reshape's index carries a modulo the bounds make redundant; simplifying removes it.
    innermost = analyzer.simplify(read.region[-1].min)
    coefficients = tvm.sym.detect_linear_equation(innermost, variables)
    if not coefficients:
        return None
    for position, coefficient in enumerate(coefficients[:-1]):
        if isinstance(coefficient, tvm.tirx.IntImm) and int(coefficient) == 1:
            return position
    return None


def transpose_schedule(func: Any, target: Target) -> s_tir.Schedule | None:
    """The rule's schedule of ``func``, or None when ``func`` is not a transposition of one input whose
    two contiguous axes both divide by the vector width."""
    sch = s_tir.Schedule(func)
    blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    for producer in blocks[:-1]:
        sch.compute_inline(producer)
    infos = normalize_prim_func(sch)
    if not infos or len(infos) != 1 or not infos[0].is_injective():
        return None
    stmt = sch.get(infos[0].block_rv)
    if len(stmt.reads) != 1:
        return None
    loops = [it.loop_rv for it in infos[0].iters]
    source = input_contiguous_axis(stmt, [it.var for it in infos[0].iters])
    out = len(loops) - 1
    if source is None or source == out:
        return None
    lanes = fp32_lanes(target)
    if any(
        loop_extent(sch, loops[axis]) is None or loop_extent(sch, loops[axis]) % lanes
        for axis in (source, out)
    ):
        return None
    source_tiles, source_lane = sch.split(loops[source], factors=[None, lanes])
    out_tiles, out_lane = sch.split(loops[out], factors=[None, lanes])
    others = [loop for axis, loop in enumerate(loops) if axis not in (source, out)]
    sch.reorder(*others, source_tiles, out_tiles, source_lane, out_lane)
    sch.parallel(sch.fuse(*others, source_tiles, out_tiles))
    sch.vectorize(out_lane)
    return sch
