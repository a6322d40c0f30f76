"""Multi-level tilings of a statement, read as MetaSchedule samples them (one perfect tile per loop, one
factor per occurrence of the loop's kind in the tiling structure, e.g. ``SSRSRS``), their footprints at
each level against the caches, and an analytic ranking of tilings for seeding the search.

Pure Python over a :class:`~schedules.poly.program.Statement`: the search calls these per candidate.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from schedules.poly.caches import CacheHierarchy
from schedules.poly.footprint import tile_footprint, tile_footprint_bytes
from schedules.poly.program import AccessKind, LoopKind, Statement

#: Cache levels each cut of an ``SSRSRS`` tiling should fit in: the data one iteration of the loop at
#: that position touches. Below the outer reduction loop (``R0``) the tile streams its inner reduction
#: chunk through L1; below the inner spatial loops of the middle level (``S2``), registers and L1.
DEFAULT_CUT_LEVELS = {"S2": "L1d", "R0": "L2", "S1": "L3"}
#: Independent FMA chains that hide the FMA latency (the roofline kernel's count, tuner/timing/roofline.py).
FMA_CHAINS = 12
#: Vector registers the accumulators may use before they spill (32 with AVX-512, 16 without).
_ACCUMULATOR_REGISTERS = {16: 28, 8: 12, 4: 12}


@dataclass(frozen=True)
class Tiling:
    """One factor list per loop of the statement (outermost factor first), under ``structure``."""

    structure: str
    factors: tuple[tuple[int, ...], ...]


def _kind_char(kind: LoopKind) -> str:
    return "R" if kind is LoopKind.REDUCTION else "S"


def cut_names(structure: str) -> list[str]:
    """``SSRSRS`` -> ``["S0", "S1", "R0", "S2", "R1", "S3"]``: the name of each position."""
    counts = {"S": 0, "R": 0}
    names = []
    for char in structure:
        names.append(f"{char}{counts[char]}")
        counts[char] += 1
    return names


def tile_below(statement: Statement, tiling: Tiling, position: int) -> tuple[int, ...]:
    """Per loop, the iterations of one tile below position ``position`` of the structure (the product of
    the loop's factors at deeper positions of its kind)."""
    extents = []
    for loop, factors in zip(statement.loops, tiling.factors, strict=True):
        char = _kind_char(loop.kind)
        deeper = tiling.structure[position + 1 :].count(char)
        extents.append(math.prod(factors[len(factors) - deeper :]) if deeper else 1)
    return tuple(extents)


def cut_footprints(statement: Statement, tiling: Tiling) -> dict[str, int]:
    """Bytes one iteration of each position's loops touches (all tensors together), by position name."""
    return {
        name: sum(tile_footprint_bytes(statement, tile_below(statement, tiling, position)).values())
        for position, name in enumerate(cut_names(tiling.structure))
    }


def overflows(
    statement: Statement,
    tiling: Tiling,
    caches: CacheHierarchy,
    margin: float,
    cut_levels: dict[str, str] = DEFAULT_CUT_LEVELS,
) -> list[str]:
    """The cuts whose footprint exceeds its cache level by more than ``margin`` (0.5: 50 % over), as
    ``"R0: 1.6 MiB > L2 1.0 MiB"``; empty when the tiling fits, or when the caches are unknown."""
    sizes = {level.name: level.bytes for level in caches.levels}
    footprints = cut_footprints(statement, tiling)
    problems = []
    for cut, level in cut_levels.items():
        if cut in footprints and level in sizes and footprints[cut] > sizes[level] * (1 + margin):
            problems.append(
                f"{cut}: {footprints[cut] / 1024:.0f} KiB > {level} {sizes[level] / 1024:.0f} KiB"
            )
    return problems


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _random_perfect_tile(rng: random.Random, extent: int, parts: int, max_innermost: int) -> tuple[int, ...]:
    """A random factorisation of ``extent`` into ``parts`` (MetaSchedule's ``sample_perfect_tile``)."""
    inner = rng.choice([d for d in divisors(extent) if d <= max_innermost])
    rest = extent // inner
    factors = []
    for _ in range(parts - 2):
        f = rng.choice(divisors(rest))
        factors.append(f)
        rest //= f
    return (rest, *factors, inner) if parts > 1 else (extent,)


@dataclass(frozen=True)
class MachineModel:
    """What the ranking knows of the machine: vector lanes, threads, caches, and the bandwidth (bytes per
    FMA-instruction cycle) of each level relative to the compute peak."""

    lanes: int
    threads: int
    caches: CacheHierarchy
    #: Bytes per cycle a core can take from the level below each cache, and from memory (all cores share).
    level_bandwidth: tuple[float, ...] = (64.0, 32.0, 16.0)
    memory_bandwidth: float = 8.0


class TileFootprints:
    """One statement's tile footprints (:mod:`schedules.poly.footprint`), each tile shape computed once."""

    def __init__(self, statement: Statement) -> None:
        self.statement = statement
        self._elements: dict[tuple[int, ...], dict[str, int]] = {}
        self._bytes: dict[tuple[int, ...], int] = {}

    def elements(self, tile: tuple[int, ...]) -> dict[str, int]:
        """Distinct elements per tensor of one tile (do not modify the answer: it is shared)."""
        if tile not in self._elements:
            self._elements[tile] = tile_footprint(self.statement, tile)
        return self._elements[tile]

    def total_bytes(self, tile: tuple[int, ...]) -> int:
        """Bytes of all tensors one tile touches."""
        if tile not in self._bytes:
            self._bytes[tile] = sum(tile_footprint_bytes(self.statement, tile).values())
        return self._bytes[tile]


def modelled_cycles(statement: Statement, tiling: Tiling, machine: MachineModel) -> float:
    """A roofline-style estimate of the tiling's cycles per thread: the larger of its vector FMA cycles
    (inefficient when the vector loop's innermost factor wastes lanes, too few accumulators hide the
    FMA latency, or the register tile's loads and accumulator reloads outnumber its FMAs) and the cycles
    to move each cut's data into the cache it fits in, divided over the threads the outer spatial loops
    can feed."""
    return modelled_costs(statement, tiling, machine)[0]


def modelled_costs(
    statement: Statement,
    tiling: Tiling,
    machine: MachineModel,
    footprints: TileFootprints | None = None,
) -> tuple[float, float]:
    """:func:`modelled_cycles`, and the cycles of all levels' data movement added up: the ranking's
    tie-break between tilings the roofline finds equally compute-bound (less traffic, more slack).

    ``footprints``: the statement's footprints, kept by a caller that models many tilings (random tilings
    share most of their tiles, and the footprints are most of the model's cost)."""
    footprints = footprints if footprints is not None else TileFootprints(statement)
    loops = statement.loops
    iterations = math.prod(loop.extent for loop in loops)
    inner = [f[-1] for f in tiling.factors]
    spatial = [i for i, loop in enumerate(loops) if loop.kind is not LoopKind.REDUCTION]
    vector = spatial[-1] if spatial else len(loops) - 1
    lanes_used = inner[vector]
    vector_ops = math.ceil(lanes_used / machine.lanes)
    lane_efficiency = lanes_used / (vector_ops * machine.lanes)
    accumulators = vector_ops * math.prod(inner[i] for i in spatial if i != vector)
    registers = _ACCUMULATOR_REGISTERS.get(machine.lanes, 12)
    chain_efficiency = min(1.0, accumulators / FMA_CHAINS)
    if accumulators > registers:
        chain_efficiency *= registers / accumulators
    compute = iterations / machine.lanes / (lane_efficiency * chain_efficiency)
    compute *= _register_tile_overhead(footprints, inner, vector, machine.lanes, accumulators)
    # Data movement: each cache level is filled by the outermost cut that fits in it, once per tile.
    names = cut_names(tiling.structure)
    memory = traffic = 0.0
    bandwidths = list(machine.level_bandwidth)
    levels = list(machine.caches.levels)
    cuts: list[tuple[tuple[int, ...], int]] = []  # (tile, bytes) below each position, outermost first

    def cut(position: int) -> tuple[tuple[int, ...], int]:
        while len(cuts) <= position:
            tile = tile_below(statement, tiling, len(cuts))
            cuts.append((tile, footprints.total_bytes(tile)))
        return cuts[position]

    for index, level in enumerate(levels):
        fitting = None
        for position in range(len(names)):
            if cut(position)[1] <= level.bytes:
                fitting = cut(position)
                break
        tile, footprint = fitting if fitting is not None else cut(len(names) - 1)
        tiles = iterations / math.prod(tile)
        bandwidth = bandwidths[index] if index < len(bandwidths) else machine.memory_bandwidth
        memory = max(memory, tiles * footprint / bandwidth)
        traffic += tiles * footprint / bandwidth
    outer = math.prod(f[0] for i, f in enumerate(tiling.factors) if i in spatial) if spatial else 1
    threads_used = min(machine.threads, outer)
    balance = (
        outer / (math.ceil(outer / machine.threads) * machine.threads) if outer >= machine.threads else 1.0
    )
    scale = max(1, threads_used) * balance
    return max(compute, memory) / scale, traffic / scale


def inner_shape(tiling: Tiling) -> tuple[int, ...]:
    """The innermost factor of each loop: the register tile, whose last spatial entry is the vector loop."""
    return tuple(f[-1] for f in tiling.factors)


def _register_tile_overhead(
    footprints: TileFootprints, inner: Sequence[int], vector: int, lanes: int, accumulators: int
) -> float:
    """How much slower than its FMAs the register tile (the innermost factors) runs: per reduction step
    it loads each input's part of the tile (whole vectors where the input moves with the vector loop,
    one broadcast per element elsewhere; loads and vector FMAs issue at the same rate on the x86 cores
    seen), and after each chunk of inner reduction steps its accumulators are stored and reloaded.
    1.0 for a tile whose FMAs hide its loads over a long chunk."""
    statement = footprints.statement
    loops = statement.loops
    reductions = [i for i, loop in enumerate(loops) if loop.kind is LoopKind.REDUCTION]
    step = tuple(1 if i in reductions else f for i, f in enumerate(inner))
    narrow = tuple(1 if i == vector else f for i, f in enumerate(step))
    written = {a.tensor.name for a in statement.accesses if a.kind is AccessKind.WRITE}
    wide, scalar = footprints.elements(step), footprints.elements(narrow)
    loads = 0.0
    for name, elements in wide.items():
        if name not in written:
            moves = elements > scalar[name]
            loads += math.ceil(elements * lanes / max(1, inner[vector]) / lanes) if moves else elements
    fmas = max(1, accumulators)
    overhead = max(fmas, loads) / fmas
    if reductions:
        chunk = math.prod(inner[i] for i in reductions)
        overhead += 2 * accumulators / (chunk * fmas)  # a store and a reload per accumulator and chunk
    return overhead


def rank_tilings(
    statement: Statement,
    structure: str,
    machine: MachineModel,
    count: int,
    *,
    samples: int = 2000,
    max_innermost: int = 64,
    seed: int = 0,
    diverse: bool = True,
) -> list[Tiling]:
    """The ``count`` best of ``samples`` random tilings by :func:`modelled_costs` (cycles, then traffic).

    ``diverse``: at most one tiling per :func:`inner_shape` (the best-modelled of each), so that the
    tilings differ where the model is least sure (register tile, vector width) rather than only in
    their outer factors; the best-ranked of the rest fill up when there are fewer shapes than ``count``.
    """
    rng = random.Random(seed)
    parts = {"S": structure.count("S"), "R": structure.count("R")}
    scored: dict[Tiling, tuple[float, float]] = {}
    footprints = TileFootprints(statement)
    for _ in range(samples):
        factors = tuple(
            _random_perfect_tile(rng, loop.extent, parts[_kind_char(loop.kind)], max_innermost)
            for loop in statement.loops
        )
        tiling = Tiling(structure, factors)
        if tiling not in scored:
            scored[tiling] = modelled_costs(statement, tiling, machine, footprints)
    ranked = sorted(scored, key=scored.__getitem__)
    if not diverse:
        return ranked[:count]
    chosen: list[Tiling] = []
    shapes: set[tuple[int, ...]] = set()
    for tiling in ranked:
        if len(chosen) < count and inner_shape(tiling) not in shapes:
            chosen.append(tiling)
            shapes.add(inner_shape(tiling))
    picked = set(chosen)
    return chosen + [t for t in ranked if t not in picked][: count - len(chosen)]


def matches(statement: Statement, factors: Sequence[Sequence[int]]) -> bool:
    """Whether per-loop factor lists tile exactly this statement's loops."""
    return len(factors) == len(statement.loops) and all(
        math.prod(f) == loop.extent for f, loop in zip(factors, statement.loops, strict=True)
    )
