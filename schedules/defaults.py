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
        if sch is not None and sch.trace is not None:
            return sch
    return None
