"""A kernel's loop nest as a polyhedral program: statements (TIR blocks) with their loops, affine accesses
and textual order. Plain data, free of TVM and isl: :mod:`schedules.poly.extract` builds it from TIR,
:mod:`schedules.poly.isl_model` turns it into isl sets and maps."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class LoopKind(str, Enum):
    """What a loop iterates over, from the block variables it binds."""

    SPATIAL = "spatial"
    REDUCTION = "reduction"
    #: Binds both kinds (a fused loop), or none (a loop whose iterations all do the same thing).
    MIXED = "mixed"


class AccessKind(str, Enum):
    READ = "read"
    WRITE = "write"


@dataclass(frozen=True)
class Loop:
    """One loop around a statement: ``for name in range(extent)`` (loops start at 0 after extraction)."""

    name: str
    extent: int
    kind: LoopKind


@dataclass(frozen=True)
class AffineIndex:
    """One index of an access: ``sum(coefficients[l] * loop_l) + constant + e`` for ``0 <= e < extent``.

    ``extent`` is 1 for a point access; a region (a block reading a whole row) has a larger one.
    """

    coefficients: tuple[int, ...]
    constant: int
    extent: int = 1


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype_bytes: int


@dataclass(frozen=True)
class Access:
    """A statement's read or write of a tensor, over the statement's loops.

    ``indices`` is None when some index is not affine in the loops (division, modulo, a gather): the
    access is then the over-approximating ``box`` (inclusive bounds per tensor dimension) and inexact.
    ``clamped`` says the affine form reaches outside the tensor (a padding block's read), which the
    model intersects with the tensor's shape.
    """

    tensor: Tensor
    kind: AccessKind
    indices: tuple[AffineIndex, ...] | None
    box: tuple[tuple[int, int], ...]
    clamped: bool = False
    reason: str | None = None

    @property
    def exact(self) -> bool:
        return self.indices is not None


@dataclass(frozen=True)
class Statement:
    """A TIR block with the loops around it (outermost first).

    ``position[d]`` is the statement's index among the children of its loop ``d - 1`` (``position[0]``
    among the function's top-level statements): with the loops it gives the textual order, the
    classic "2d+1" schedule ``[position[0], loop_0, position[1], loop_1, ..., position[n]]``.
    """

    name: str
    loops: tuple[Loop, ...]
    position: tuple[int, ...]
    accesses: tuple[Access, ...]
    #: The block's own variables: name, extent, whether it is a reduction variable.
    block_vars: tuple[tuple[str, int, bool], ...] = ()

    @property
    def exact(self) -> bool:
        return all(a.exact for a in self.accesses)

    @property
    def is_reduction(self) -> bool:
        return any(reduction for _, _, reduction in self.block_vars)

    def reads(self) -> list[Access]:
        return [a for a in self.accesses if a.kind is AccessKind.READ]

    def writes(self) -> list[Access]:
        return [a for a in self.accesses if a.kind is AccessKind.WRITE]


@dataclass(frozen=True)
class Edge:
    """The consumer reads a tensor the producer writes."""

    producer: str
    consumer: str
    tensor: str


@dataclass(frozen=True)
class Program:
    """A kernel as statements in textual order, and what stops it from being modelled exactly."""

    name: str
    statements: tuple[Statement, ...]
    #: Why parts of the kernel are not affine (one line each); empty when the model is exact.
    inexact: tuple[str, ...] = ()

    @property
    def exact(self) -> bool:
        return not self.inexact and all(s.exact for s in self.statements)

    def statement(self, name: str) -> Statement:
        for statement in self.statements:
            if statement.name == name:
                return statement
        raise KeyError(name)

    def edges(self) -> list[Edge]:
        """Producer -> consumer pairs: each statement that reads a tensor an earlier statement writes."""
        edges = []
        for consumer in self.statements:
            for read in consumer.reads():
                for producer in self.statements:
                    if producer is consumer or producer.position >= consumer.position:
                        continue
                    if any(w.tensor.name == read.tensor.name for w in producer.writes()):
                        edge = Edge(producer.name, consumer.name, read.tensor.name)
                        if edge not in edges:
                            edges.append(edge)
        return edges
