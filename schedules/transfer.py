"""Schedules transferred from a similar workload: a measured trace re-applied to a kernel of the same
operator with other shapes, its tile sizes adapted to the new extents (transfer-tuning, Gibson et al.,
PACT'22).

Two workloads are of one **family** when their TIR has the same blocks in the same order (names, spatial
and reduction iterators, the dtype and rank of every buffer they read and write): a convolution with a
bias and a ReLU at 56x56x64 and at 28x28x128, or a matmul at any M, N, K. A MetaSchedule trace names its
blocks and loops by position, so it replays on any workload of its family; only its tile decisions
(``SamplePerfectTile``: factors whose product is a loop's extent) depend on the shapes. Each is adapted:
from the innermost level out, the divisor of what is left of the new extent closest (by ratio) to the
old factor, the outermost level taking the rest. A split by numbers the trace fixed (a default rule's)
must divide the new extent, or the transfer is refused. The replayed schedule then goes through the
space's postprocessors like any candidate, so a transfer that does not fit is refused there, not compiled.

Two workloads share an **anchor** when their first reduction block (the convolution, the matmul) is the
same operator, whatever elementwise epilogue was fused after it (a bias, a residual add, a GELU) or
before it. Their traces differ in the instructions on those blocks, so a trace does not replay across
them; its *decisions* do (:func:`decisions_transferred`): the new workload's own design space (which
schedules its own epilogue) is replayed with the old trace's tile factors (adapted as above), unroll and
compute-location choices, matched instruction by instruction in order, kind by kind.
"""

from __future__ import annotations

import difflib
import hashlib
import math
from collections.abc import Sequence
from typing import Any

from kiln_tvm import SCHEDULE_ERRORS, ms, s_tir, tvm

#: The instruction whose decisions are tile factors of one loop.
_PERFECT_TILE = "SamplePerfectTile"
#: The instruction that splits a loop, by sampled factors or by numbers the trace fixed.
_SPLIT = "Split"


def _top_blocks(func: Any) -> list[Any]:
    sch = s_tir.Schedule(func)
    return [sch.get(block) for block in sch.get_child_blocks(sch.get_sblock("root"))]


def _main(mod: Any) -> Any:
    funcs = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    return funcs[0] if len(funcs) == 1 else None


def _regions(regions: Sequence[Any]) -> str:
    return ",".join(f"{r.source.dtype}/{len(r.region)}" for r in regions)


def workload_family(mod: Any) -> str | None:
    """The family of a task's module (see the module docstring): 16 hex digits, the same for the same
    operator at other shapes; None when ``mod`` is not one unscheduled PrimFunc."""
    func = _main(mod)
    if func is None:
        return None
    try:
        blocks = _top_blocks(func)
    except SCHEDULE_ERRORS:
        return None
    if not blocks:
        return None
    params = ",".join(
        f"{arg.dtype}/{len(getattr(arg, 'shape', ()))}" for arg in ms.arg_info.ArgInfo.from_prim_func(func)
    )
    parts = [params] + [
        f"{b.name_hint}:{''.join(str(int(iv.iter_type)) for iv in b.iter_vars)}:{_regions(b.reads)}:"
        f"{_regions(b.writes)}"
        for b in blocks
    ]
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]


def _anchor(blocks: Sequence[Any]) -> Any | None:
    """The first block with a reduction iterator: the operator an epilogue was fused onto."""
    reduce = int(tvm.tirx.IterVar.CommReduce)
    return next((b for b in blocks if any(int(iv.iter_type) == reduce for iv in b.iter_vars)), None)


def anchor_family(mod: Any) -> str | None:
    """What a task's module shares with the same operator under other fused epilogues and at other shapes
    (see the module docstring): 16 hex digits; None when ``mod`` is not one unscheduled PrimFunc with a
    reduction block."""
    func = _main(mod)
    if func is None:
        return None
    try:
        anchor = _anchor(_top_blocks(func))
    except SCHEDULE_ERRORS:
        return None
    if anchor is None:
        return None
    part = (
        f"anchor|{anchor.name_hint}:{''.join(str(int(iv.iter_type)) for iv in anchor.iter_vars)}:"
        f"{_regions(anchor.reads)}:{_regions(anchor.writes)}"
    )
    return hashlib.sha1(part.encode()).hexdigest()[:16]


def iteration_extents(mod: Any, anchor_only: bool = False) -> list[int]:
    """Every block iterator's extent, block by block (0 for a symbolic one): a workload's shape, to rank
    the members of a family by how close their shapes are; with ``anchor_only``, the anchor block's only
    (to rank workloads sharing an anchor)."""
    func = _main(mod)
    if func is None:
        return []
    blocks = _top_blocks(func)
    if anchor_only:
        anchor = _anchor(blocks)
        blocks = [] if anchor is None else [anchor]
    return [
        int(iv.dom.extent) if isinstance(iv.dom.extent, tvm.tirx.IntImm) else 0
        for block in blocks
        for iv in block.iter_vars
    ]


def shape_distance(a: Sequence[int], b: Sequence[int]) -> float:
    """How far two shapes of one family are: the sum of |log2| of their extents' ratios (inf when their
    iterators differ in number or either is symbolic)."""
    if len(a) != len(b) or any(x <= 0 or y <= 0 for x, y in zip(a, b, strict=True)):
        return math.inf
    return sum(abs(math.log2(x / y)) for x, y in zip(a, b, strict=True))


def within_reach(a: Sequence[int], b: Sequence[int], reach: float) -> bool:
    """Whether every extent of ``a`` is within a factor of ``2 ** reach`` of ``b``'s (False when their
    iterators differ in number or either is symbolic)."""
    if len(a) != len(b) or any(x <= 0 or y <= 0 for x, y in zip(a, b, strict=True)):
        return False
    return all(abs(math.log2(x / y)) <= reach for x, y in zip(a, b, strict=True))


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def adapted_tiles(factors: Sequence[int], extent: int, max_innermost: int = 0) -> list[int]:
    """Tile factors for a loop of ``extent`` as close as the divisors allow to ``factors`` (a perfect
    tiling of another extent): innermost level first, each the divisor of what is left nearest by ratio
    to the old factor (the larger of two as near), the innermost no more than ``max_innermost`` (> 0),
    the outermost the rest. Their product is ``extent``."""
    new = [1] * len(factors)
    left = extent
    for level in range(len(factors) - 1, 0, -1):
        cap = max_innermost if level == len(factors) - 1 and max_innermost > 0 else left
        want = max(1, int(factors[level]))
        choices = [d for d in _divisors(left) if d <= cap]
        new[level] = min(choices, key=lambda d: (abs(math.log(d / want)), -d))
        left //= new[level]
    new[0] = left
    return new


class NotTransferable(ValueError):
    """A trace that does not fit the workload it is replayed on."""


def _check_literal_split(sch: s_tir.Schedule, inputs: list[Any]) -> None:
    """Refuse a split by numbers the trace fixed (a rule's ``[None, 16]``) that do not divide the loop's new
    extent: the split would need a predicate the rule never planned for. TVM lets ``rfactor`` take such a
    loop and computes a wrong softmax (seen: a 128-wide row's rule replayed on a 197-wide row)."""
    fixed = [int(f) for f in inputs[1:] if isinstance(f, int | tvm.tirx.IntImm)]
    extent = sch.get(inputs[0]).extent
    if fixed and isinstance(extent, tvm.tirx.IntImm) and int(extent) % math.prod(fixed) != 0:
        raise NotTransferable(f"a split by {fixed} does not divide a loop of {int(extent)}")


def transferred_schedule(trace: Any, mod: Any, postprocs: Sequence[Any]) -> s_tir.Schedule | None:
    """``trace`` (measured on another workload of ``mod``'s family) replayed on ``mod`` with its tiles
    adapted, and ``postprocs`` applied; None when it does not replay or a postprocessor refuses it."""
    sch = s_tir.Schedule(mod, seed=1)

    def adapt(inst: Any, inputs: list[Any], attrs: list[Any], decision: Any) -> Any:
        if inst.kind.name == _SPLIT:
            _check_literal_split(sch, inputs)
            return decision
        if inst.kind.name != _PERFECT_TILE or decision is None:
            return decision
        extent = sch.get(inputs[0]).extent
        if not isinstance(extent, tvm.tirx.IntImm):
            return decision
        factors = [int(f) for f in decision]
        if math.prod(factors) == int(extent):
            return decision
        return adapted_tiles(factors, int(extent), int(attrs[1]))

    try:
        trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=adapt)
    except SCHEDULE_ERRORS:
        return None
    return postprocessed(sch, postprocs)


def postprocessed(sch: s_tir.Schedule, postprocs: Sequence[Any]) -> s_tir.Schedule | None:
    """``sch`` with ``postprocs`` applied, as every measured candidate is; None when one refuses it."""
    try:
        sch.enter_postproc()
        if all(p.apply(sch) for p in postprocs):
            return sch
    except SCHEDULE_ERRORS:
        return None
    return None


#: The sampling instructions whose decisions :func:`decisions_transferred` carries over.
_SAMPLES = (_PERFECT_TILE, "SampleCategorical", "SampleComputeLocation")


def sampled_decisions(trace: Any) -> dict[str, list[Any]]:
    """The decisions of ``trace``'s sampling instructions before its postprocessing, per kind, in order."""
    decisions: dict[str, list[Any]] = {}
    for inst in trace.insts:
        kind = inst.kind.name
        if kind == "EnterPostproc":
            break
        if kind in _SAMPLES:
            decisions.setdefault(kind, []).append(trace.get_decision(inst))
    return decisions


def _kinds(trace: Any) -> list[str]:
    kinds = []
    for inst in trace.insts:
        if inst.kind.name == "EnterPostproc":
            break
        kinds.append(inst.kind.name)
    return kinds


def _counts(decisions: dict[str, list[Any]]) -> dict[str, int]:
    return {kind: len(values) for kind, values in decisions.items()}


def decisions_transferred(
    trace: Any, mod: Any, design_spaces: Sequence[Any], postprocs: Sequence[Any]
) -> s_tir.Schedule | None:
    """The first of ``mod``'s design spaces (schedules from its space generator; those whose instructions
    most resemble ``trace``'s first) that replays with the decisions of ``trace`` (measured on a workload
    of ``mod``'s anchor family): each space's tile
    decisions are replaced, in order, by the old ones adapted to the new extents, and its other sampled
    decisions by the old ones where the space samples as many of that kind. A space tiling a different
    number of loops, or at other depths, is passed over. None when no space takes them and passes
    ``postprocs``."""
    old = sampled_decisions(trace)
    tiles = old.get(_PERFECT_TILE, [])
    if not tiles:
        return None
    # The space the old trace most resembles first (a write cache or not, where the epilogue went).
    kinds = _kinds(trace)
    ranked = sorted(
        design_spaces, key=lambda sp: -difflib.SequenceMatcher(None, kinds, _kinds(sp.trace)).ratio()
    )
    for space in ranked:
        counts = _counts(sampled_decisions(space.trace))
        if counts.get(_PERFECT_TILE, 0) != len(tiles):
            continue
        sch = _replayed_with(space.trace, mod, old, counts)
        if sch is not None and postprocessed(sch, postprocs) is not None:
            return sch
    return None


def _replayed_with(
    trace: Any, mod: Any, old: dict[str, list[Any]], counts: dict[str, int]
) -> s_tir.Schedule | None:
    sch = s_tir.Schedule(mod, seed=1)
    seen: dict[str, int] = {}

    def provide(inst: Any, inputs: list[Any], attrs: list[Any], decision: Any) -> Any:
        kind = inst.kind.name
        if kind not in _SAMPLES:
            return decision
        index = seen.get(kind, 0)
        seen[kind] = index + 1
        was = old.get(kind, [])
        if len(was) != counts.get(kind, 0):
            return decision  # the spaces sample this kind differently: the new space's own choice
        if kind == _PERFECT_TILE:
            factors = [int(f) for f in was[index]]
            extent = sch.get(inputs[0]).extent
            if len(factors) != len(decision) or not isinstance(extent, tvm.tirx.IntImm):
                raise NotTransferable("the old tiling has other levels")
            return adapted_tiles(factors, int(extent), int(attrs[1]))
        if kind == "SampleCategorical":
            return was[index] if int(was[index]) < len(attrs[0]) else decision
        return was[index]

    try:
        trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=provide)
    except SCHEDULE_ERRORS:
        return None
    return sch


def transferred_schedules(family: list[Any], anchored: list[Any], context: Any, count: int) -> list[Any]:
    """Up to ``count`` schedules of ``context``'s module transferred from similar workloads' records:
    ``family`` (the same operator at other shapes: each trace replayed with its tiles adapted) first, then
    ``anchored`` (the same anchor under other epilogues: each trace's decisions replayed on the module's
    own design spaces)."""
    if count <= 0:
        return []
    postprocs = list(context.space_generator.postprocs)
    found = []
    for record in family:
        sch = transferred_schedule(record.trace, context.mod, postprocs)
        if sch is not None:
            found.append(sch)
            if len(found) == count:
                return found
    if anchored:
        try:
            spaces = list(context.space_generator.generate_design_space(context.mod))
        except SCHEDULE_ERRORS:  # a module the space does not take has no design space to fill
            return found
        for record in anchored:
            sch = decisions_transferred(record.trace, context.mod, spaces, postprocs)
            if sch is not None:
                found.append(sch)
                if len(found) == count:
                    break
    return found
