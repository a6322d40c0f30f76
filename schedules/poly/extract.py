"""Read a polyhedral :class:`~schedules.poly.program.Program` off a task's PrimFunc.

Each leaf block becomes a statement over the loops around it. Its accesses are the index expressions of
``block.reads`` and ``block.writes``, rewritten from block variables to loop variables through the
block's bindings; ``tvm.sym.detect_linear_equation`` gives the coefficients. What is not affine
(division and modulo from layout rewrites, gathers, symbolic extents) is kept as a bounding box and
marked inexact, so the analysis can say which part of the kernel it cannot model.
"""

from __future__ import annotations

from typing import Any

from kiln_tvm import tvm
from schedules.poly.program import (
    Access,
    AccessKind,
    AffineIndex,
    Loop,
    LoopKind,
    Program,
    Statement,
    Tensor,
)

_REDUCTION_ITER = 2  # tirx IterVar.CommReduce


class _Extractor:
    def __init__(self) -> None:
        self.statements: list[Statement] = []
        self.inexact: list[str] = []
        self._tensors: list[tuple[Any, Tensor]] = []

    # -- the walk ------------------------------------------------------------------------------------
    def visit(self, stmt: Any, loops: list[tuple[Any, int, int]], position: list[int], index: int) -> None:
        if isinstance(stmt, tvm.tirx.SeqStmt):
            for i, child in enumerate(stmt.seq):
                self.visit(child, loops, position, i)
        elif isinstance(stmt, tvm.tirx.For):
            extent, start = stmt.extent, stmt.min
            if not isinstance(extent, tvm.tirx.IntImm) or not isinstance(start, tvm.tirx.IntImm):
                self.inexact.append(f"loop {stmt.loop_var.name} has a symbolic extent: not modelled")
                return
            self.visit(stmt.body, [*loops, (stmt.loop_var, int(start), int(extent))], [*position, index], 0)
        elif isinstance(stmt, tvm.s_tir.SBlockRealize):
            if _has_child_block(stmt.block.body):
                self.inexact.append(
                    f"block {stmt.block.name_hint} holds other blocks: only its leaves are modelled"
                )
                self.visit(stmt.block.body, loops, position, index)
            else:
                self.statements.append(self.statement(stmt, loops, [*position, index]))
        elif isinstance(stmt, tvm.tirx.IfThenElse):
            self.inexact.append("a conditional around blocks: modelled as if it always held")
            self.visit(stmt.then_case, loops, position, index)
            if stmt.else_case is not None:
                self.visit(stmt.else_case, loops, position, index + 1)
        elif hasattr(stmt, "body"):  # AttrStmt, LetStmt, buffer declarations
            self.visit(stmt.body, loops, position, index)

    # -- one block -----------------------------------------------------------------------------------
    def statement(self, realize: Any, loops: list[tuple[Any, int, int]], position: list[int]) -> Statement:
        block = realize.block
        loop_vars = [var for var, _, _ in loops]
        # Each block variable as an affine form over the loops (None when its binding is not affine).
        bindings: list[tuple[list[int], int] | None] = []
        for value in realize.iter_values:
            form = _linear(value, loop_vars)
            if form is not None:  # loops are shifted to start at 0
                coefficients, constant = form
                constant += sum(c * start for c, (_, start, _) in zip(coefficients, loops, strict=True))
                form = (coefficients, constant)
            bindings.append(form)
        kinds = _loop_kinds(block, bindings, len(loops))
        analyzer = tvm.sym.Analyzer()
        for iv in block.iter_vars:
            analyzer.bind(iv.var, iv.dom)
        block_vars = [iv.var for iv in block.iter_vars]

        accesses = [
            self.access(
                r, AccessKind.READ, block_vars=block_vars, bindings=bindings, loops=loops, analyzer=analyzer
            )
            for r in block.reads
        ]
        writes = [
            self.access(
                w, AccessKind.WRITE, block_vars=block_vars, bindings=bindings, loops=loops, analyzer=analyzer
            )
            for w in block.writes
        ]
        accesses += writes
        is_reduction = block.init is not None or any(
            int(iv.iter_type) == _REDUCTION_ITER for iv in block.iter_vars
        )
        if is_reduction:  # the update reads its accumulator, which block.reads leaves out
            for write in writes:
                read = Access(
                    write.tensor, AccessKind.READ, write.indices, write.box, write.clamped, write.reason
                )
                if read not in accesses:
                    accesses.insert(len(accesses) - len(writes), read)
        return Statement(
            name=block.name_hint,
            loops=tuple(
                Loop(var.name, extent, kind) for (var, _, extent), kind in zip(loops, kinds, strict=True)
            ),
            position=tuple(position),
            accesses=tuple(accesses),
            block_vars=tuple(
                (iv.var.name, _int_or(iv.dom.extent, 0), int(iv.iter_type) == _REDUCTION_ITER)
                for iv in block.iter_vars
            ),
        )

    def access(
        self,
        region: Any,
        kind: AccessKind,
        *,
        block_vars: list[Any],
        bindings: list[tuple[list[int], int] | None],
        loops: list[tuple[Any, int, int]],
        analyzer: Any,
    ) -> Access:
        tensor = self.tensor(region.source)
        indices: list[AffineIndex] | None = []
        reason = None
        for dim, rng in enumerate(region.region):
            extent = rng.extent
            form = _linear(rng.min, block_vars)
            if not isinstance(extent, tvm.tirx.IntImm):
                reason = f"dimension {dim} of {tensor.name} has a symbolic extent"
            elif form is None:
                reason = f"index {rng.min} of {tensor.name} is not affine"
            elif any(c != 0 and bindings[b] is None for b, c in enumerate(form[0])):
                reason = f"a block variable in {tensor.name}'s index is bound non-affinely"
            if reason is not None:
                indices = None
                break
            assert form is not None and indices is not None
            coefficients = [0] * len(loops)
            constant = form[1]
            for b, c in enumerate(form[0]):
                binding = bindings[b]
                if c == 0 or binding is None:
                    continue
                for loop, beta in enumerate(binding[0]):
                    coefficients[loop] += c * beta
                constant += c * binding[1]
            indices.append(AffineIndex(tuple(coefficients), constant, int(extent)))

        extents = [extent for _, _, extent in loops]
        if indices is not None:
            box = tuple(_affine_range(index, extents) for index in indices)
        else:
            box = tuple(_bounded_range(rng, analyzer) for rng in region.region)
        clamped_box = tuple(
            (max(lo, 0), min(hi, size - 1)) for (lo, hi), size in zip(box, tensor.shape, strict=True)
        )
        return Access(
            tensor=tensor,
            kind=kind,
            indices=tuple(indices) if indices is not None else None,
            box=clamped_box,
            clamped=clamped_box != box,
            reason=reason,
        )

    def tensor(self, buffer: Any) -> Tensor:
        for known, tensor in self._tensors:
            if known.same_as(buffer):
                return tensor
        name = buffer.name
        taken = {t.name for _, t in self._tensors}
        suffix = 1
        while name in taken:
            name, suffix = f"{buffer.name}_{suffix}", suffix + 1
        dtype = tvm.runtime.DataType(str(buffer.dtype))
        shape = tuple(_int_or(dim, -1) for dim in buffer.shape)
        if any(dim < 0 for dim in shape):
            self.inexact.append(f"tensor {name} has a symbolic shape: bounds are not known")
            shape = tuple(dim if dim >= 0 else 1 << 30 for dim in shape)
        tensor = Tensor(name, shape, max(1, dtype.bits * dtype.lanes // 8))
        self._tensors.append((buffer, tensor))
        return tensor


def extract_program(func: Any, name: str = "main") -> Program:
    """The polyhedral program of a PrimFunc: one statement per leaf block, in textual order."""
    extractor = _Extractor()
    body = func.body
    if isinstance(body, tvm.s_tir.SBlockRealize) and body.block.name_hint == "root":
        body = body.block.body
    extractor.visit(body, [], [], 0)
    for statement in extractor.statements:
        for access in statement.accesses:
            if access.reason and access.reason not in extractor.inexact:
                extractor.inexact.append(f"{statement.name}: {access.reason} (kept as a bounding box)")
    return Program(name=name, statements=tuple(extractor.statements), inexact=tuple(extractor.inexact))


def _linear(expr: Any, variables: list[Any]) -> tuple[list[int], int] | None:
    """``expr`` as integer coefficients over ``variables`` plus a constant; None when it is not affine."""
    if not variables:
        return ([], int(expr)) if isinstance(expr, tvm.tirx.IntImm) else None
    terms = tvm.sym.detect_linear_equation(expr, variables)
    if len(terms) != len(variables) + 1 or not all(isinstance(t, tvm.tirx.IntImm) for t in terms):
        return None
    values = [int(t) for t in terms]
    return values[:-1], values[-1]


def _int_or(value: Any, default: int) -> int:
    return int(value) if isinstance(value, tvm.tirx.IntImm | int) else default


def _affine_range(index: AffineIndex, extents: list[int]) -> tuple[int, int]:
    lo = hi = index.constant
    for c, extent in zip(index.coefficients, extents, strict=True):
        lo += min(0, c * (extent - 1))
        hi += max(0, c * (extent - 1))
    return lo, hi + index.extent - 1


def _bounded_range(rng: Any, analyzer: Any) -> tuple[int, int]:
    low = analyzer.const_int_bound(rng.min)
    high = analyzer.const_int_bound(rng.min + rng.extent - 1)
    return int(low.min_value), int(high.max_value)


def _loop_kinds(block: Any, bindings: list[tuple[list[int], int] | None], loop_count: int) -> list[LoopKind]:
    kinds = []
    for loop in range(loop_count):
        bound: set[bool] = set()
        for iv, binding in zip(block.iter_vars, bindings, strict=True):
            if binding is None or binding[0][loop] != 0:
                bound.add(int(iv.iter_type) == _REDUCTION_ITER)
        if bound == {True}:
            kinds.append(LoopKind.REDUCTION)
        elif bound == {False}:
            kinds.append(LoopKind.SPATIAL)
        else:
            kinds.append(LoopKind.MIXED)
    return kinds


def _has_child_block(stmt: Any) -> bool:
    if isinstance(stmt, tvm.s_tir.SBlockRealize):
        return True
    if isinstance(stmt, tvm.tirx.SeqStmt):
        return any(_has_child_block(s) for s in stmt.seq)
    if isinstance(stmt, tvm.tirx.IfThenElse):
        return _has_child_block(stmt.then_case) or (
            stmt.else_case is not None and _has_child_block(stmt.else_case)
        )
    return hasattr(stmt, "body") and _has_child_block(stmt.body)
