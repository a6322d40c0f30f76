"""Data footprints of a tile of a statement's loops: per tensor, the number of distinct elements one tile
touches. :func:`tile_footprint` is the closed form the search uses (microseconds, no isl);
:func:`exact_tile_footprint` counts the same with isl, at analysis time and in the tests.

The closed form counts each tensor dimension's distinct index values over the tile (see
:func:`_distinct`) and multiplies them, capped at the tensor's size: exact for the unit-coefficient,
strided and convolution-window (``h * stride + r``) indices of legalized operators; an over-approximation
where one index mixes steps that do not divide each other (a dilated window), or where a statement reads
one tensor at several offsets (their joint range is counted).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import islpy as isl

from schedules.poly.isl_model import IslStatement
from schedules.poly.program import Access, Statement


def _span(access: Access, dim: int, tile: Sequence[int]) -> tuple[int, int]:
    """The index range ``[low, high]`` of one tensor dimension over a tile starting at loop origin 0."""
    if access.indices is None:
        return access.box[dim]
    index = access.indices[dim]
    low = high = index.constant
    for c, t in zip(index.coefficients, tile, strict=True):
        low += min(0, c * (t - 1))
        high += max(0, c * (t - 1))
    return low, high + index.extent - 1


def _distinct(access: Access, dim: int, tile: Sequence[int]) -> int:
    """Distinct values of one index over a tile: terms ``c * x`` (``x < t``) combined smallest step first.

    A run of ``n`` consecutive multiples of ``step`` plus a term whose coefficient is ``q`` steps stays one
    run of ``q (t - 1) + n`` when ``n >= q`` (the windows overlap, as a convolution's ``h * s + r``) and
    becomes ``n * t`` separate values otherwise (a stride larger than the window); after that, or when a
    step does not divide the next, the range's length bounds it.
    """
    low, high = _span(access, dim, tile)
    if access.indices is None:
        return high - low + 1
    index = access.indices[dim]
    terms = sorted((abs(c), t) for c, t in zip(index.coefficients, tile, strict=True) if c and t > 1)
    if index.extent > 1:
        terms = sorted([*terms, (1, index.extent)])
    step, count, run = 1, 1, True
    for coefficient, t in terms:
        if count == 1:
            step, count = coefficient, t
        elif run and coefficient % step == 0:
            q = coefficient // step
            count, run = (q * (t - 1) + count, True) if count >= q else (count * t, False)
        else:
            return min(high - low + 1, count * t)
    return min(count, high - low + 1)


def tile_footprint(statement: Statement, tile: Sequence[int]) -> dict[str, int]:
    """Distinct elements per tensor touched by one tile (``tile[l]`` iterations of loop ``l``)."""
    by_tensor: dict[str, list[Access]] = {}
    for access in statement.accesses:
        same = by_tensor.setdefault(access.tensor.name, [])
        if not any(a.indices == access.indices and a.box == access.box for a in same):
            same.append(access)
    footprint = {}
    for name, accesses in by_tensor.items():
        shape = accesses[0].tensor.shape
        elements = 1
        for dim, size in enumerate(shape):
            if len(accesses) == 1:
                extent = _distinct(accesses[0], dim, tile)
            else:  # several accesses (a stencil's neighbours): the range they span together
                spans = [_span(a, dim, tile) for a in accesses]
                extent = max(h for _, h in spans) - min(lo for lo, _ in spans) + 1
            elements *= min(extent, size)
        footprint[name] = elements
    return footprint


def tile_footprint_bytes(statement: Statement, tile: Sequence[int]) -> dict[str, int]:
    """:func:`tile_footprint` in bytes."""
    sizes = {a.tensor.name: a.tensor.dtype_bytes for a in statement.accesses}
    return {name: n * sizes[name] for name, n in tile_footprint(statement, tile).items()}


def interior_offset(statement: Statement, tile: Sequence[int]) -> list[int]:
    """Where a tile sits away from the domain's edges (so that clamped padding reads do not shrink it)."""
    return [(loop.extent - t) // 2 for loop, t in zip(statement.loops, tile, strict=True)]


def exact_tile_footprint(statement: IslStatement, tile: Sequence[int]) -> dict[str, int]:
    """isl's exact count of the distinct elements per tensor touched by an interior tile."""
    offset = interior_offset(statement.statement, tile)
    bounds = (
        " and ".join(f"{o} <= {d} < {o + t}" for d, o, t in zip(statement.dims, offset, tile, strict=True))
        or "true"
    )
    tile_set = isl.Set(f"{{ {statement.tuple} : {bounds} }}")
    images: dict[str, isl.Set] = {}
    for access in statement.statement.accesses:
        image = statement.access(access).intersect_domain(tile_set).range()
        name = access.tensor.name
        images[name] = images[name].union(image) if name in images else image
    return {name: image.count_val().to_python() for name, image in images.items()}


def reuse_directions(statement: Statement, access: Access) -> list[tuple[int, ...]]:
    """A basis of the loop directions along which ``access`` touches the same element (the null space of
    its coefficient matrix): ``(0, 1, 0)`` for ``A[i, k]`` in a ``(i, j, k)`` nest. Empty for an inexact
    access or an injective one."""
    if access.indices is None:
        return []
    rows = [[Fraction(c) for c in index.coefficients] for index in access.indices]
    return _null_space(rows, len(statement.loops))


def _null_space(rows: list[list[Fraction]], columns: int) -> list[tuple[int, ...]]:
    matrix = [row[:] for row in rows if any(row)]
    pivots: list[int] = []
    r = 0
    for col in range(columns):
        pivot = next((i for i in range(r, len(matrix)) if matrix[i][col] != 0), None)
        if pivot is None:
            continue
        matrix[r], matrix[pivot] = matrix[pivot], matrix[r]
        scale = matrix[r][col]
        matrix[r] = [v / scale for v in matrix[r]]
        for i in range(len(matrix)):
            if i != r and matrix[i][col] != 0:
                factor = matrix[i][col]
                matrix[i] = [a - factor * b for a, b in zip(matrix[i], matrix[r], strict=True)]
        pivots.append(col)
        r += 1
    basis = []
    for free in (c for c in range(columns) if c not in pivots):
        vector = [Fraction(0)] * columns
        vector[free] = Fraction(1)
        for row, col in zip(matrix, pivots, strict=False):
            vector[col] = -row[free]
        denominator = 1
        for v in vector:
            denominator = denominator * v.denominator // _gcd(denominator, v.denominator)
        basis.append(tuple(int(v * denominator) for v in vector))
    return basis


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a
