"""Default schedules: hand-written rules that serve a kernel well without any search.

TVM's ``dlight`` CPU rules schedule the kernels whose structure they recognise: ``Reduction`` takes
softmax, layer norm and the like (row-parallel, every block computed under the row loop, the elementwise
blocks vectorised), ``GEMV`` takes matrix-vector products. MetaSchedule's space for such kernels is
poor (a softmax's blocks tiled one by one, each over the whole tensor); a rule gets them right at once.
The tuner measures a task's default schedule before the search and stores it like any measured
candidate, so the compiled model takes whichever is faster, and the search may stop early on it.
"""

from __future__ import annotations

from typing import Any

from kiln_tvm import Target, dlight, s_tir, tvm
from schedules.anatomy import contraction_depth


def _cpu_rules(func: Any) -> list[Any]:
    rules = [dlight.cpu.GEMV()]
    # dlight's Reduction takes any reduction followed by an elementwise block, a matmul with an epilogue
    # too, and schedules it row by row without tiling; a matmul is the search's to schedule.
    if not contraction_depth(func):
        rules.insert(0, dlight.cpu.Reduction())
    return rules


def default_schedule(mod: tvm.IRModule, target: Target) -> s_tir.Schedule | None:
    """A rule's schedule of ``mod`` (a task's one-function module, ``main``), with its trace; None when no
    rule applies or ``target`` is not a CPU."""
    if target.kind.name != "llvm":
        return None
    func = mod["main"]
    for rule in _cpu_rules(func):
        try:
            sch = rule.apply(func, target, False)
        except Exception:  # noqa: BLE001 -- a rule that trips over a kernel simply does not apply
            continue
        if isinstance(sch, list):
            sch = sch[0] if sch else None
        if sch is not None and sch.trace is not None:
            return sch
    return None
