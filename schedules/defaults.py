"""Default schedules: hand-written rules that serve a kernel well without any search.

Kiln's row-reduction rule (:mod:`schedules.row_reduction`) and TVM's ``dlight`` CPU rules schedule the
kernels whose structure they recognise: the row-reduction rule takes softmax, layer norm and the like
(row-parallel, every block computed under the row loop, the elementwise blocks and the reductions
vectorised), dlight's ``Reduction`` the same shapes it cannot vectorize (reductions along an outer
axis, with scalar reductions), ``GEMV`` matrix-vector products, and Kiln's transpose rule
(:mod:`schedules.transpose`) kernels that only transpose data. MetaSchedule's space for such kernels is
poor (a softmax's blocks tiled one by one, each over the whole tensor); a rule gets them right at once.
The tuner measures a task's default schedule before the search and stores it like any measured
candidate, so the compiled model takes whichever is faster, and the search may stop early on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kiln_tvm import Target, dlight, s_tir, tvm
from schedules.anatomy import contraction_depth
from schedules.row_reduction import row_reduction_schedule
from schedules.transpose import transpose_schedule

Rule = Callable[[Any, Target], Any]


def _dlight(rule: Any) -> Rule:
    return lambda func, target: rule.apply(func, target, False)


def _cpu_rules(func: Any) -> list[Rule]:
    """The rules to try on ``func``, best first."""
    rules = [_dlight(dlight.cpu.GEMV()), transpose_schedule]
    # Row-wise rules take any reduction followed by an elementwise block, a matmul with an epilogue
    # too, and schedule it row by row without tiling; a matmul is the search's to schedule.
    if not contraction_depth(func):
        rules[:0] = [row_reduction_schedule, _dlight(dlight.cpu.Reduction())]
    return rules


def default_schedule(mod: tvm.IRModule, target: Target) -> s_tir.Schedule | None:
    """A rule's schedule of ``mod`` (a task's one-function module, ``main``), with its trace; None when no
    rule applies or ``target`` is not a CPU."""
    if target.kind.name != "llvm":
        return None
    func = mod["main"]
    for rule in _cpu_rules(func):
        try:
            sch = rule(func, target)
        except Exception:  # noqa: BLE001 -- a rule that trips over a kernel simply does not apply
            continue
        if isinstance(sch, list):
            sch = sch[0] if sch else None
        if sch is not None and sch.trace is not None and not predicated_under_vectorized(sch.mod["main"]):
            return sch
    return None


def predicated_under_vectorized(func: Any) -> bool:
    """Whether a block under a vectorized loop has a predicate (a loop split by a factor that does not
    divide it). TVM cannot vectorize such a body and writes out every lane instead: dlight's GEMV on an
    EfficientNet squeeze-excite convolution (a reduction of 48 split by 64 under 128 vectorized lanes)
    did not compile in minutes."""
    return _predicated(func.body, vectorized=False)


def _predicated(stmt: Any, vectorized: bool) -> bool:
    if isinstance(stmt, tvm.tirx.SeqStmt):
        return any(_predicated(child, vectorized) for child in stmt.seq)
    if isinstance(stmt, tvm.tirx.For):
        return _predicated(stmt.body, vectorized or stmt.kind == tvm.tirx.ForKind.VECTORIZED)
    if isinstance(stmt, s_tir.SBlockRealize):
        predicate = stmt.predicate
        always = isinstance(predicate, tvm.tirx.IntImm) and int(predicate.value) == 1
        if vectorized and not always:
            return True
        block = stmt.block
        return _predicated(block.body, vectorized) or (
            block.init is not None and _predicated(block.init, vectorized)
        )
    if isinstance(stmt, tvm.tirx.IfThenElse):
        return _predicated(stmt.then_case, vectorized) or (
            stmt.else_case is not None and _predicated(stmt.else_case, vectorized)
        )
    body = getattr(stmt, "body", None)  # AttrStmt, LetStmt, buffer declarations
    return body is not None and _predicated(body, vectorized)
