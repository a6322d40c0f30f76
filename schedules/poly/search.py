"""The search hooks of the ``cpu-poly`` space: a postprocessor that rejects candidates whose tiles
overflow the caches, and seed schedules carrying the analysis' best-ranked tilings.

Both read the tilings MetaSchedule's multi-level tiling sampled from the candidate's trace (the
``sample_perfect_tile`` decisions of each tiled block) and judge them with the closed-form footprints of
:mod:`schedules.poly.tiling`: no isl call runs inside the search loop.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass, field
from typing import Any

from kiln_tvm import derived_object, ms, s_tir
from schedules.poly.caches import CacheHierarchy
from schedules.poly.extract import extract_program
from schedules.poly.program import Program, Statement
from schedules.poly.tiling import MachineModel, Tiling, matches, overflows, rank_tilings

log = logging.getLogger(__name__)

_UNROLL_EXPLICIT = "meta_schedule.unroll_explicit"
_TILING_STRUCTURE = "meta_schedule.tiling_structure"


@dataclass
class PruningStats:
    """What the postprocessor did in one task's search (shared by the postprocessor's clones)."""

    examined: int = 0
    rejected: int = 0
    #: Rejected by the model but let through (the soft part: a model error cannot exclude the optimum).
    passed_through: int = 0
    seeds: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, rejected: bool, passed: bool) -> None:
        with self._lock:
            self.examined += 1
            self.rejected += rejected and not passed
            self.passed_through += rejected and passed

    def to_json(self) -> dict[str, int]:
        return {
            "examined": self.examined,
            "rejected": self.rejected,
            "passed_through": self.passed_through,
            "seeds": self.seeds,
        }


@dataclass(frozen=True)
class TracedTiling:
    """A block's tiling as a trace sampled it: the structure, and per loop its sampling instruction and
    the factors it decided."""

    block: str
    structure: str
    instructions: tuple[Any, ...]
    factors: tuple[tuple[int, ...], ...]

    def tiling(self) -> Tiling:
        return Tiling(self.structure, self.factors)


def traced_tilings(trace: Any) -> list[TracedTiling]:
    """The multi-level tilings in ``trace``: for each block annotated with a tiling structure, the
    ``sample_perfect_tile`` of each of its original loops in loop order."""
    block_names: dict[Any, str] = {}
    structures: dict[str, str] = {}
    loop_owner: dict[Any, tuple[str, int]] = {}
    samples: dict[str, dict[int, tuple[Any, tuple[int, ...]]]] = {}
    decisions = trace.decisions
    for inst in trace.insts:
        kind = inst.kind.name
        if kind == "GetSBlock":
            block_names[inst.outputs[0]] = str(inst.attrs[0])
        elif kind == "Annotate" and str(inst.attrs[0]) == _TILING_STRUCTURE:
            name = block_names.get(inst.inputs[0])
            if name is not None:
                structures[name] = str(inst.inputs[1])
        elif kind == "GetLoops":
            name = block_names.get(inst.inputs[0])
            if name is not None and name in structures and name not in samples:
                samples[name] = {}
                for index, loop in enumerate(inst.outputs):
                    loop_owner[loop] = (name, index)
        elif kind == "SamplePerfectTile":
            owner = loop_owner.get(inst.inputs[0])
            if owner is not None and inst in decisions:
                name, index = owner
                samples[name][index] = (inst, tuple(int(f) for f in decisions[inst]))
    tilings = []
    for name, by_loop in samples.items():
        if not by_loop or sorted(by_loop) != list(range(len(by_loop))):
            continue
        ordered = [by_loop[i] for i in range(len(by_loop))]
        tilings.append(
            TracedTiling(name, structures[name], tuple(i for i, _ in ordered), tuple(f for _, f in ordered))
        )
    return tilings


def _statement_for(program: Program | None, tiling: TracedTiling) -> Statement | None:
    if program is None:
        return None
    try:
        statement = program.statement(tiling.block)
    except KeyError:
        return None
    # Only what the model describes exactly is judged; the rest is left to the stock search.
    return statement if statement.exact and matches(statement, tiling.factors) else None


def _program_of(mod: Any) -> Program | None:
    try:
        return extract_program(mod["main"])
    except Exception as exc:  # noqa: BLE001 - an unmodellable kernel is searched as the stock space would
        log.info("no polyhedral model of this task (%s): its candidates are not pruned", exc)
        return None


@derived_object
class FootprintPruner(ms.postproc.PyPostproc):
    """Rejects a candidate when one of its tiles' footprint exceeds the cache level it should fit in by
    more than ``margin``, except a ``pass_through`` fraction of those (chosen by the candidate's
    decisions, so the same candidate always gets the same answer)."""

    def __init__(
        self,
        caches: CacheHierarchy,
        margin: float = 0.5,
        pass_through: float = 0.1,
        stats: PruningStats | None = None,
        program: Program | None = None,
    ) -> None:
        super().__init__()
        self.caches = caches
        self.margin = margin
        self.pass_through = pass_through
        self.stats = stats if stats is not None else PruningStats()
        self.program = program

    def _initialize_with_tune_context(self, context: Any) -> None:
        if context.mod is not None:
            self.program = _program_of(context.mod)

    def apply(self, sch: s_tir.Schedule) -> bool:
        if not self.caches.known or self.program is None:
            return True
        problems = []
        key: list[tuple[int, ...]] = []
        for traced in traced_tilings(sch.trace):
            statement = _statement_for(self.program, traced)
            if statement is not None:
                problems += overflows(statement, traced.tiling(), self.caches, self.margin)
                key += traced.factors
        if not key:
            return True
        rejected = bool(problems)
        passed = rejected and hash(tuple(key)) % 1000 < self.pass_through * 1000
        self.stats.count(rejected, passed)
        return not rejected or passed

    def clone(self) -> FootprintPruner:
        return FootprintPruner(self.caches, self.margin, self.pass_through, self.stats, self.program)


def _accumulates_per_tile(trace: Any) -> bool:
    """Whether a design space writes its tiled block's result back per tile (a cache write, or the
    consumer computed at a tile loop) rather than accumulating in the output buffer itself."""
    return any(inst.kind.name in ("CacheWrite", "ReverseComputeAt") for inst in trace.insts)


def _reduces_over_one_axis(blocks: list[tuple[TracedTiling, list[Tiling]]]) -> bool:
    """Whether every tiled block reduces over at most one loop longer than 1 (a matmul, not a window)."""
    for traced, _ in blocks:
        levels = traced.structure.count("R")
        reductions = [f for f in traced.factors if len(f) == levels and math.prod(f) > 1]
        if len(reductions) > 1:
            return False
    return True


def unrolled_most(trace: Any) -> Any:
    """``trace`` with each explicit-unroll choice set to its largest candidate."""
    return _unrolled(trace, max)


def unrolled_to_cover(trace: Any, steps: int) -> Any:
    """``trace`` with each explicit-unroll choice set to its smallest candidate of at least ``steps`` (its
    largest when none is that large)."""
    return _unrolled(
        trace, lambda candidates: min([c for c in candidates if c >= steps] or [max(candidates)])
    )


def _unrolled(trace: Any, choose: Any) -> Any:
    unroll_vars = {
        inst.inputs[1]
        for inst in trace.insts
        if inst.kind.name == "Annotate" and str(inst.attrs[0]) == _UNROLL_EXPLICIT
    }
    for inst in trace.insts:
        if inst.kind.name == "SampleCategorical" and inst.outputs and inst.outputs[0] in unroll_vars:
            candidates = [int(c) for c in inst.attrs[0]]
            trace = trace.with_decision(inst, candidates.index(choose(candidates)), True)
    return trace


def seed_schedules(
    context: Any, machine: MachineModel, count: int, seed: int = 0, *, unmeasured: bool = False
) -> list[s_tir.Schedule]:
    """Up to ``count`` schedules of the task's design spaces whose tilings are the analysis' best-ranked
    (:func:`~schedules.poly.tiling.rank_tilings`: one per register tile), the ``r``-th best applied to
    design space ``r`` modulo their number, so that the seeds differ both in tile shape and in the
    spaces' other choices (cache reads and writes, unrolling); postprocessed and ready to build. Other
    decisions keep the design space's samples. Empty when no tiled block is modelled exactly.

    ``unmeasured``: for a schedule compiled without measuring anything. A block that reduces over one axis
    (matmuls, pointwise convolutions) takes a space that accumulates in a tile of its own (the result
    written back once per tile, the epilogue fused there) first, its register tile unrolled as far as the
    space allows: otherwise its accumulators go through memory on every step of the reduction (8-20x
    slower on MobileNetV2's pointwise convolutions). A windowed reduction (a 3x3 convolution) keeps the
    spaces' order and samples: measured over ResNet-18, both choices made its convolutions slower.
    """
    mod = context.mod
    program = _program_of(mod)
    if program is None or count <= 0:
        return []
    spaces = list(context.space_generator.generate_design_space(mod))
    postprocs = list(context.space_generator.postprocs)
    per_space = [[] for _ in spaces]  # type: list[list[tuple[Any, list[Tiling]]]]
    for index, space in enumerate(spaces):
        for traced in traced_tilings(space.trace):
            statement = _statement_for(program, traced)
            if statement is not None:
                ranked = rank_tilings(statement, traced.structure, machine, count, seed=seed)
                per_space[index].append((traced, ranked))
    modelled = [(space, blocks) for space, blocks in zip(spaces, per_space, strict=True) if blocks]
    one_axis = unmeasured and all(_reduces_over_one_axis(blocks) for _, blocks in modelled)
    if one_axis:
        modelled.sort(key=lambda item: not _accumulates_per_tile(item[0].trace))
    seeds: list[s_tir.Schedule] = []
    for rank in range(count):
        if not modelled:
            break
        space, blocks = modelled[rank % len(modelled)]
        if any(rank >= len(ranked) for _, ranked in blocks):
            continue
        trace = unrolled_most(space.trace) if one_axis else space.trace
        for traced, ranked in blocks:
            for inst, factors in zip(traced.instructions, ranked[rank].factors, strict=True):
                trace = trace.with_decision(inst, list(factors), True)
        # Without debug verification, as MetaSchedule samples its own candidates: its cached-flag check
        # rejects a sound schedule whose epilogue is predicated (a 1000-wide bias add in blocks of 64).
        sch = s_tir.Schedule(mod, seed=seed + rank + 1)
        try:
            trace.apply_to_schedule(sch, remove_postproc=True)
            sch.enter_postproc()
            applied = all(p.apply(sch) for p in postprocs)
        except (RuntimeError, ValueError) as error:  # a seed that cannot be built is no seed
            log.warning("seed %d of %s dropped: %s", rank, context.task_name, str(error).splitlines()[0])
            continue
        if applied:
            seeds.append(sch)
    return seeds
