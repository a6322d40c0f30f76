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

from kiln_tvm import Target, dlight, normalize_prim_func, s_tir, tvm

REDUCTION_ITER = 2  # tirx IterVar.CommReduce


def _cpu_rules(func: Any) -> list[Any]:
    rules = [dlight.cpu.GEMV()]
    if not _contracts_two_inputs(func):
        rules.insert(0, dlight.cpu.Reduction())
    return rules


def _contracts_two_inputs(func: Any) -> bool:
    """Whether a reduction block of ``func`` reduces over two inputs (a matmul's ``C += A * B``).

    dlight's ``Reduction`` takes any reduction followed by an elementwise block, a matmul with an
    epilogue too, and schedules it row by row without tiling; a matmul is the search's to schedule. An
    input read at a point that does not move with the reduction (layer norm's mean, in its variance) is
    a broadcast, not a second operand.
    """
    sch = s_tir.Schedule(func)
    for info in normalize_prim_func(sch) or []:
        if info.is_injective():
            continue
        block = sch.get(info.block_rv)
        reduce_vars = [iv.var for iv in block.iter_vars if int(iv.iter_type) == REDUCTION_ITER]
        written = [w.source for w in block.writes]
        operands: list[Any] = []
        for read in block.reads:
            if any(read.source.same_as(b) for b in written + operands):
                continue
            used = [v for rng in read.region for v in tvm.tirx.analysis.undefined_vars(rng.min)]
            if any(u.same_as(r) for u in used for r in reduce_vars):
                operands.append(read.source)
        if len(operands) >= 2:
            return True
    return False


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
