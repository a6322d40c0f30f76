"""A default schedule for row-wise normalisations (softmax, layer norm, RMS norm) with vectorized
reductions.

dlight's CPU ``Reduction`` rule computes every block of such a kernel under the row loop and vectorizes
the elementwise blocks, but leaves each reduction a scalar chain: a 128-wide softmax row is 128
dependent ``max``es, then 128 dependent adds. This rule first splits each reduction's innermost axis
by the vector width and ``rfactor``s it, so a row is reduced into one vector of partial results (a
vector ``max`` or add per step) and the partials are reduced once per row. The ``rfactor`` must come
before the blocks move under the row loop: afterwards the reduction shares that loop with its
neighbours, which ``rfactor`` refuses.
"""

from __future__ import annotations

from typing import Any

from kiln_tvm import Target, normalize_prim_func, s_tir, tvm
from schedules.loops import fp32_lanes, loop_extent

_SPATIAL = 0  # tirx IterVar.DataPar


def _leading_spatial(dom_kind: str) -> int:
    return len(dom_kind) - len(dom_kind.lstrip("S"))


def row_reduction_schedule(func: Any, target: Target) -> s_tir.Schedule | None:
    """The rule's schedule of ``func``, or None when ``func`` is not a chain of row-wise reductions and
    elementwise blocks ending in an elementwise block (the shape dlight's ``Reduction`` takes), or none
    of its reductions runs along the innermost axis. A row whose length is no multiple of the vector
    width (ViT's 197 tokens) is reduced and written scalar, rows in parallel: without this rule ViT's
    softmax took a design-space sample (see bench/RESULTS.md)."""
    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    if not infos or len(infos) < 2 or not infos[-1].is_injective():
        return None
    if all(info.is_injective() for info in infos):
        return None
    leading = min(_leading_spatial(info.dom_kind()) for info in infos)
    if not leading:
        return None
    lanes = fp32_lanes(target)
    factored: set[str] = set()
    along_rows = 0
    for info in infos:
        if info.is_injective() or info.iters[-1].kind != "R":
            continue
        if not _reduces_innermost(sch.get(info.block_rv)):
            continue
        along_rows += 1
        extent = loop_extent(sch, info.iters[-1].loop_rv)
        if extent is None or extent % lanes or extent < 2 * lanes:
            continue
        _, lane = sch.split(info.iters[-1].loop_rv, factors=[None, lanes])
        written = sch.get(info.block_rv).writes[0].source
        factored.add(sch.get(sch.rfactor(lane, factor_axis=len(written.shape))).name_hint)
    if not along_rows:
        return None

    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    last = sch.get_sblock(names[-1])
    loops = sch.get_loops(last)
    rows = sch.fuse(*loops[:leading]) if leading > 1 else loops[0]
    sch.parallel(rows)
    _vectorize_innermost(sch, last, lanes)
    for name in reversed(names[:-1]):
        sch.compute_at(sch.get_sblock(name), rows, preserve_unit_loops=True)
    for name in names[:-1]:
        block = sch.get_sblock(name)
        if name in factored:
            # Under the row loop: the lane loop, then the loop over the row's vectors. Swap them, so
            # the row is consumed a vector at a time into one vector of partials.
            inner = [loop for loop in sch.get_loops(block)[1:] if loop_extent(sch, loop) != 1]
            lane, steps = inner[0], inner[-1]
            sch.reorder(steps, lane)
            sch.vectorize(lane)
            sch.decompose_reduction(block, steps)
        elif all(int(iv.iter_type) == _SPATIAL for iv in sch.get(block).iter_vars):
            _vectorize_innermost(sch, block, lanes)
    return sch


def _reduces_innermost(block: Any) -> bool:
    """Whether ``block``'s last (reduction) variable indexes the innermost dimension of what it reads (a
    row reduction, not a sum over an outer axis such as a global pooling's)."""
    last = block.iter_vars[-1].var
    for read in block.reads:
        index = read.region[-1].min
        if any(v.same_as(last) for v in tvm.tirx.analysis.undefined_vars(index)):
            return True
    return False


def _vectorize_innermost(sch: s_tir.Schedule, block: Any, lanes: int) -> None:
    loops = sch.get_loops(block)
    if len(loops) <= 1:
        return
    extent = loop_extent(sch, loops[-1])
    if extent is not None and extent > lanes and extent % lanes:
        return  # a split would predicate the vector lanes, which TVM writes out one by one
    if extent is not None and extent > lanes:
        _, vector = sch.split(loops[-1], factors=[None, lanes])
        sch.vectorize(vector)
    elif extent is not None and extent >= 2:
        sch.vectorize(loops[-1])
