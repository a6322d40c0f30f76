"""Memory-based dependences of a program (read after write, write after read, write after write) and
their distance vectors over the loops the two statements share, computed with isl."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import islpy as isl

from schedules.poly.isl_model import IslProgram, IslStatement
from schedules.poly.program import AccessKind


class DependenceKind(str, Enum):
    RAW = "RAW"  # flow: a read of what an earlier iteration wrote
    WAR = "WAR"  # anti: a write over what an earlier iteration read
    WAW = "WAW"  # output: two writes of one element


@dataclass(frozen=True)
class DistanceRange:
    """The range of one component of a dependence's distance vectors (None: unbounded that way)."""

    low: int | None
    high: int | None

    def __str__(self) -> str:
        if self.low is not None and self.low == self.high:
            return str(self.low)
        low = "-inf" if self.low is None else str(self.low)
        high = "inf" if self.high is None else str(self.high)
        return f"{low}..{high}"


@dataclass(frozen=True)
class Dependence:
    """Iterations of ``sink`` that must follow iterations of ``source`` because both touch ``tensor``."""

    kind: DependenceKind
    source: str
    sink: str
    tensor: str
    #: The loops both statements sit in (all of a statement's loops for a dependence on itself).
    common_loops: tuple[str, ...]
    #: Per common loop, the range of sink minus source.
    distance: tuple[DistanceRange, ...]
    #: The common loops that carry some instance of it; empty when only textual order does.
    carried_by: tuple[str, ...]
    relation: str

    @property
    def distance_text(self) -> str:
        return "(" + ", ".join(str(d) for d in self.distance) + ")"


@dataclass(frozen=True)
class DependenceRelation:
    """A dependence with its isl relations, for the legality checks."""

    dependence: Dependence
    source: IslStatement
    sink: IslStatement
    #: ``S_source[loops] -> S_sink[loops]``.
    relation: isl.Map
    #: Sink minus source in the program's schedule space ``[p0, l0, p1, l1, ...]``.
    schedule_deltas: isl.Set


def common_loop_count(a: IslStatement, b: IslStatement) -> int:
    """How many loops, outermost first, the two statements share."""
    count = 0
    limit = min(len(a.statement.loops), len(b.statement.loops))
    while count < limit and a.statement.position[count] == b.statement.position[count]:
        count += 1
    return count


def schedule_constraint(ip: IslProgram, constraint: str) -> isl.Set:
    """A set in the program's schedule space, ``{ [s0, s1, ...] : constraint }``."""
    depth = ip.statements[0].depth if ip.statements else 0
    dims = ", ".join(f"s{d}" for d in range(2 * depth + 1))
    return isl.Set(f"{{ [{dims}] : {constraint} }}")


def loop_dim(level: int) -> int:
    """The schedule dimension of the loop at ``level`` (dimensions alternate position, loop)."""
    return 2 * level + 1


def compute_dependences(ip: IslProgram) -> list[DependenceRelation]:
    """Every non-empty memory-based dependence between pairs of accesses of the program."""
    found: list[DependenceRelation] = []
    for source in ip.statements:
        for sink in ip.statements:
            order = source.schedule.lex_lt_map(sink.schedule)
            for first in source.statement.accesses:
                for second in sink.statement.accesses:
                    if first.tensor.name != second.tensor.name:
                        continue
                    kind = _kind(first.kind, second.kind)
                    if kind is None:
                        continue
                    relation = (
                        source.access(first).apply_range(sink.access(second).reverse()).intersect(order)
                    )
                    if relation.is_empty():
                        continue
                    found.append(
                        _describe(
                            ip, kind, source, sink, tensor=first.tensor.name, relation=relation.coalesce()
                        )
                    )
    return _merged(found)


def _kind(first: AccessKind, second: AccessKind) -> DependenceKind | None:
    if first is AccessKind.WRITE and second is AccessKind.READ:
        return DependenceKind.RAW
    if first is AccessKind.READ and second is AccessKind.WRITE:
        return DependenceKind.WAR
    if first is AccessKind.WRITE and second is AccessKind.WRITE:
        return DependenceKind.WAW
    return None


def _describe(
    ip: IslProgram,
    kind: DependenceKind,
    source: IslStatement,
    sink: IslStatement,
    *,
    tensor: str,
    relation: isl.Map,
) -> DependenceRelation:
    deltas = relation.apply_domain(source.schedule).apply_range(sink.schedule).deltas()
    common = common_loop_count(source, sink)
    distance = tuple(_range(deltas, loop_dim(level)) for level in range(common))
    carried = []
    for level in range(common):
        zero_before = " and ".join(f"s{d} = 0" for d in range(loop_dim(level)))
        positive = f"{zero_before} and s{loop_dim(level)} > 0" if zero_before else f"s{loop_dim(level)} > 0"
        if not deltas.intersect(schedule_constraint(ip, positive)).is_empty():
            carried.append(source.statement.loops[level].name)
    dependence = Dependence(
        kind=kind,
        source=source.statement.name,
        sink=sink.statement.name,
        tensor=tensor,
        common_loops=tuple(loop.name for loop in source.statement.loops[:common]),
        distance=distance,
        carried_by=tuple(carried),
        relation=str(relation),
    )
    return DependenceRelation(dependence, source, sink, relation, deltas)


def _range(deltas: isl.Set, dim: int) -> DistanceRange:
    low, high = deltas.dim_min_val(dim), deltas.dim_max_val(dim)
    return DistanceRange(
        None if low.is_infty() or low.is_neginfty() else low.to_python(),
        None if high.is_infty() or high.is_neginfty() else high.to_python(),
    )


def _merged(found: list[DependenceRelation]) -> list[DependenceRelation]:
    """One entry per (kind, source, sink, tensor): a statement with two reads of one tensor gives two
    relations of the same dependence."""
    merged: dict[tuple[str, str, str, str], DependenceRelation] = {}
    for item in found:
        d = item.dependence
        key = (d.kind.value, d.source, d.sink, d.tensor)
        if key in merged:
            previous = merged[key]
            relation = previous.relation.union(item.relation).coalesce()
            ip_deltas = previous.schedule_deltas.union(item.schedule_deltas).coalesce()
            distance = tuple(
                DistanceRange(
                    None if a.low is None or b.low is None else min(a.low, b.low),
                    None if a.high is None or b.high is None else max(a.high, b.high),
                )
                for a, b in zip(previous.dependence.distance, d.distance, strict=True)
            )
            carried = tuple(dict.fromkeys(previous.dependence.carried_by + d.carried_by))
            dependence = Dependence(
                d.kind, d.source, d.sink, d.tensor, d.common_loops, distance, carried, str(relation)
            )
            merged[key] = DependenceRelation(dependence, item.source, item.sink, relation, ip_deltas)
        else:
            merged[key] = item
    return list(merged.values())
