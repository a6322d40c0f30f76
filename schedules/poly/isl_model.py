"""The isl form of a :class:`~schedules.poly.program.Program`: iteration domains, access relations and the
textual ("2d+1") schedule of each statement, as islpy sets and maps."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import islpy as isl

from schedules.poly.program import Access, Program, Statement, Tensor


def isl_name(name: str) -> str:
    """``name`` as an isl identifier (letters, digits and underscores, not starting with a digit)."""
    cleaned = re.sub(r"\W", "_", name)
    return cleaned if cleaned and not cleaned[0].isdigit() else f"_{cleaned}"


@dataclass(frozen=True)
class IslStatement:
    """One statement's isl objects; its tuple name is ``S<index>`` and its dimensions are its loops."""

    statement: Statement
    tuple_name: str
    depth: int  # the program's deepest nest, to which every schedule is padded

    @cached_property
    def dims(self) -> list[str]:
        names: list[str] = []
        for loop in self.statement.loops:
            name = isl_name(loop.name)
            while name in names:
                name += "_"
            names.append(name)
        return names

    @property
    def tuple(self) -> str:
        return f"{self.tuple_name}[{', '.join(self.dims)}]"

    def bounds(self, extents: list[int] | None = None) -> str:
        """Constraints of the loops' ranges (or of a tile's, with ``extents``)."""
        extents = extents if extents is not None else [loop.extent for loop in self.statement.loops]
        return " and ".join(f"0 <= {d} < {e}" for d, e in zip(self.dims, extents, strict=True)) or "true"

    @cached_property
    def domain(self) -> isl.Set:
        return isl.Set(f"{{ {self.tuple} : {self.bounds()} }}")

    def tile(self, extents: list[int]) -> isl.Set:
        """The first tile of the given extents (loop ``l`` runs over ``[0, extents[l])``)."""
        return isl.Set(f"{{ {self.tuple} : {self.bounds(extents)} }}")

    def access(self, access: Access) -> isl.Map:
        """The access relation from this statement's iterations to the tensor's elements, within the tensor."""
        tensor = access.tensor
        outs = [f"o{d}" for d in range(len(tensor.shape))]
        constraints: list[str] = []
        exists: list[str] = []
        if access.indices is not None:
            for d, index in enumerate(access.indices):
                terms = [f"{c}*{v}" for c, v in zip(index.coefficients, self.dims, strict=True) if c]
                expr = " + ".join([*terms, str(index.constant)])
                if index.extent == 1:
                    constraints.append(f"o{d} = {expr}")
                else:
                    exists.append(f"e{d}")
                    constraints.append(f"o{d} = {expr} + e{d} and 0 <= e{d} < {index.extent}")
        else:  # an inexact access: every element of its bounding box, from every iteration
            constraints += [f"{lo} <= o{d} <= {hi}" for d, (lo, hi) in enumerate(access.box)]
        constraints.append(_within(tensor, outs))
        body = " and ".join(constraints)
        if exists:
            body = f"exists {', '.join(exists)}: {body}"
        relation = isl.Map(f"{{ {self.tuple} -> {isl_name(tensor.name)}[{', '.join(outs)}] : {body} }}")
        return relation.intersect_domain(self.domain)

    @cached_property
    def schedule(self) -> isl.Map:
        """``S[l] -> [p0, l0, p1, l1, ..., pn, 0, ...]``, padded to the program's depth."""
        position = self.statement.position
        out: list[str] = []
        for level in range(self.depth):
            out.append(str(position[level]) if level < len(position) else "0")
            out.append(self.dims[level] if level < len(self.dims) else "0")
        out.append(str(position[self.depth]) if self.depth < len(position) else "0")
        return isl.Map(f"{{ {self.tuple} -> [{', '.join(out)}] }}").intersect_domain(self.domain)


def _within(tensor: Tensor, outs: list[str]) -> str:
    return " and ".join(f"0 <= {o} < {size}" for o, size in zip(outs, tensor.shape, strict=True)) or "true"


class IslProgram:
    """The isl objects of every statement of a program."""

    def __init__(self, program: Program) -> None:
        self.program = program
        depth = max((len(s.loops) for s in program.statements), default=0)
        self.statements = [IslStatement(s, f"S{i}", depth) for i, s in enumerate(program.statements)]

    def of(self, name: str) -> IslStatement:
        for statement in self.statements:
            if statement.statement.name == name:
                return statement
        raise KeyError(name)

    def domain_text(self) -> str:
        """All the iteration domains in isl notation, one union set with the statements in textual order."""
        parts = [str(statement.domain).strip()[1:-1].strip() for statement in self.statements]
        return "{ " + "; ".join(parts) + " }"
