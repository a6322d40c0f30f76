"""Candidates of a schedule space as the search samples its first ones, postprocessed (for the tests of
the tensorizing rules)."""

from __future__ import annotations

from kiln_tvm import ms, register_cpu_tensor_intrinsics, s_tir, tvm
from schedules.spaces import space_for


def sampled_candidates(mod: tvm.IRModule, target: tvm.target.Target, count: int = 1) -> list[s_tir.Schedule]:
    """``count`` postprocessed candidates of the cpu space, sampled from each of its design spaces in
    turn (the tensor intrinsics, AMX's included, registered first: candidates replay them)."""
    register_cpu_tensor_intrinsics(amx=True)
    context = ms.TuneContext(
        mod=mod, target=target, space_generator=space_for(target, "cpu"), task_name="t", num_threads=2
    ).clone()
    candidates = []
    for _ in range(20 * count):
        for design in context.space_generator.generate_design_space(mod):
            sch = s_tir.Schedule(mod, debug_mask="all")
            design.trace.apply_to_schedule(sch, remove_postproc=True)
            sch.enter_postproc()
            if all(p.apply(sch) for p in context.space_generator.postprocs):
                candidates.append(sch)
            if len(candidates) == count:
                return candidates
    raise AssertionError(f"fewer than {count} sampled candidates passed the postprocessors")
