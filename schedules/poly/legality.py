"""What the dependences allow, per loop and per producer/consumer pair.

A loop is *parallel* when no dependence among the statements inside it is carried by it; loops form a
*permutable band* (tiling and interchange legal) when every dependence not yet satisfied by an outer band
has a non-negative distance on each of them (Pluto's condition), a reduction's accumulation excepted
(see :func:`is_accumulation`); a *reduction* loop carries only its
accumulator's dependence, which associativity lets one reorder and rfactor lets one parallelise; a loop is
*vectorizable* when it is parallel and every statement inside writes consecutive elements along it.
A producer can be computed at depth ``d`` of its consumer (``compute_at``, without recomputation) when
their first ``d`` loops have equal extents and no dependence runs from a later prefix of the producer's
loops to an earlier one of the consumer's.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from schedules.poly.dependences import DependenceRelation, loop_dim, schedule_constraint
from schedules.poly.isl_model import IslProgram, IslStatement
from schedules.poly.program import LoopKind


@dataclass(frozen=True)
class LoopLegality:
    statement: str
    loop: str
    extent: int
    kind: LoopKind
    parallel: bool
    #: Index of the permutable band the loop belongs to, outermost band 0.
    band: int
    #: The band holds more than this loop: tiling and interchange within it are legal.
    permutable: bool
    #: Carries only the accumulation of a reduction: parallel through rfactor, reorderable by associativity.
    reduction: bool
    vectorizable: bool
    #: "RAW on C" ... for each dependence this loop carries.
    carries: tuple[str, ...]


@dataclass(frozen=True)
class Fusion:
    """How deep ``producer`` can be computed inside ``consumer``'s loops."""

    producer: str
    consumer: str
    tensor: str
    depth: int
    #: The consumer's loops the producer would share at that depth.
    shared_loops: tuple[str, ...]


def _subtree(ip: IslProgram, owner: IslStatement, level: int) -> list[IslStatement]:
    """The statements inside ``owner``'s loop at ``level``."""
    prefix = owner.statement.position[: level + 1]
    return [
        s
        for s in ip.statements
        if len(s.statement.loops) > level and s.statement.position[: level + 1] == prefix
    ]


def _inside(dep: DependenceRelation, statements: list[IslStatement]) -> bool:
    return any(dep.source is s for s in statements) and any(dep.sink is s for s in statements)


def _zero(dims: list[int]) -> str:
    return " and ".join(f"s{d} = 0" for d in dims) or "true"


def loop_legality(ip: IslProgram, deps: list[DependenceRelation]) -> list[LoopLegality]:
    """Legality of every loop of every statement (a loop shared by statements is reported once)."""
    seen: set[tuple[tuple[int, ...], int]] = set()
    result: list[LoopLegality] = []
    for owner in ip.statements:
        bands = _bands(ip, owner, deps)
        for level, loop in enumerate(owner.statement.loops):
            key = (owner.statement.position[: level + 1], level)
            if key in seen:
                continue
            seen.add(key)
            inner = _subtree(ip, owner, level)
            t = loop_dim(level)
            carried_here = schedule_constraint(ip, f"{_zero(list(range(t)))} and s{t} > 0")
            carriers = [
                d
                for d in deps
                if _inside(d, inner) and not d.schedule_deltas.intersect(carried_here).is_empty()
            ]
            carries = tuple(f"{d.dependence.kind.value} on {d.dependence.tensor}" for d in carriers)
            accumulators = {
                w.tensor.name for s in inner if s.statement.is_reduction for w in s.statement.writes()
            }
            reduction = (
                loop.kind is LoopKind.REDUCTION
                and bool(carriers)
                and all(d.dependence.tensor in accumulators for d in carriers)
            )
            band = bands[level]
            result.append(
                LoopLegality(
                    statement=owner.statement.name,
                    loop=loop.name,
                    extent=loop.extent,
                    kind=loop.kind,
                    parallel=not carriers,
                    band=band,
                    permutable=sum(1 for b in bands if b == band) > 1,
                    reduction=reduction,
                    vectorizable=not carriers and all(_unit_write_stride(s, level) for s in inner),
                    carries=tuple(dict.fromkeys(carries)),
                )
            )
    return result


def is_accumulation(dep: DependenceRelation) -> bool:
    """A reduction statement's dependence on its own accumulator: ``C[i, j] += ...`` over ``k``. Its
    order matters only up to associativity and commutativity, which reductions have."""
    statement = dep.source.statement
    return (
        dep.source is dep.sink
        and statement.is_reduction
        and any(w.tensor.name == dep.dependence.tensor for w in statement.writes())
    )


def _bands(ip: IslProgram, owner: IslStatement, deps: list[DependenceRelation]) -> list[int]:
    """The band index of each of ``owner``'s loops: greedily, a loop joins the current band when every
    dependence inside it that the earlier bands leave unsatisfied has a non-negative distance on it.

    Accumulations are left out: reordering a reduction's loops (a convolution's ``ry, rx, rc``) only
    reassociates its sum, which is how TVM, Pluto's reduction support and every BLAS tile reductions."""
    deps = [d for d in deps if not is_accumulation(d)]
    bands: list[int] = []
    band, band_dims = 0, []  # schedule dims of the loops in the current band
    satisfied_before: list[int] = []  # dims whose bands are closed: dependences must be 0 there to remain
    for level in range(len(owner.statement.loops)):
        inner = _subtree(ip, owner, level)
        t = loop_dim(level)
        remaining = schedule_constraint(ip, _zero(satisfied_before))
        negative = remaining.intersect(schedule_constraint(ip, f"s{t} < 0"))
        violates = any(
            _inside(d, inner) and not d.schedule_deltas.intersect(negative).is_empty() for d in deps
        )
        if violates and band_dims:
            band += 1
            satisfied_before += band_dims
            band_dims = []
        band_dims.append(t)
        bands.append(band)
    return bands


def _unit_write_stride(statement: IslStatement, level: int) -> bool:
    for write in statement.statement.writes():
        if write.indices is None:
            return False
        stride, step = 0, 1
        for index, size in reversed(list(zip(write.indices, write.tensor.shape, strict=True))):
            stride += index.coefficients[level] * step
            step *= size
        if stride != 1:
            return False
    return True


def fusion_depths(ip: IslProgram, deps: list[DependenceRelation]) -> list[Fusion]:
    """The deepest legal ``compute_at`` of each producer into each of its consumers."""
    fusions: list[Fusion] = []
    for edge in ip.program.edges():
        producer, consumer = ip.of(edge.producer), ip.of(edge.consumer)
        between = [d.relation for d in deps if d.source is producer and d.sink is consumer]
        limit = min(len(producer.statement.loops), len(consumer.statement.loops))
        depth = 0
        while depth < limit:
            candidate = depth + 1
            if producer.statement.loops[depth].extent != consumer.statement.loops[depth].extent:
                break
            violation = _later_prefix(producer, consumer, candidate)
            if any(not relation.intersect(violation).is_empty() for relation in between):
                break
            depth = candidate
        fusions.append(
            Fusion(
                producer=edge.producer,
                consumer=edge.consumer,
                tensor=edge.tensor,
                depth=depth,
                shared_loops=tuple(loop.name for loop in consumer.statement.loops[:depth]),
            )
        )
    return fusions


def _later_prefix(producer: IslStatement, consumer: IslStatement, depth: int) -> isl.Map:
    """Pairs whose producer iteration's first ``depth`` loops come lexicographically after the consumer's."""
    p = [f"p{d}" for d in range(len(producer.dims))]
    c = [f"c{d}" for d in range(len(consumer.dims))]
    clauses = []
    for level in range(depth):
        equal = [f"{p[u]} = {c[u]}" for u in range(level)]
        clauses.append("(" + " and ".join([*equal, f"{p[level]} > {c[level]}"]) + ")")
    return isl.Map(
        f"{{ {producer.tuple_name}[{', '.join(p)}] -> {consumer.tuple_name}[{', '.join(c)}] : {' or '.join(clauses)} }}"
    )
