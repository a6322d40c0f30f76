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


def packed_vnni_matmul(k: int = 64, n: int = 32) -> tvm.IRModule:
    """The kernel of an integer matmul ``x[4, k] (u8) @ W[k, n] (s8)`` after Kiln packed its weight for
    VNNI, alone, as its tuning task sees it (the cpu space tensorizes it with ``kiln_dot_16x4_vnni``)."""
    import numpy as np

    from kiln_tvm import relax
    from schedules.vnni import VNNI_BLOCK
    from tuner.passes.int8_packing import pack_for_vnni

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, k), "uint8"))
    with bb.function("main", [x]):
        w = np.random.default_rng(0).integers(-128, 128, (k, n), dtype=np.int8)
        out = bb.emit(relax.op.matmul(x, relax.const(w, "int8"), out_dtype="int32"))
        bb.emit_func_output(out)
    lowered = relax.get_pipeline("zero")(pack_for_vnni()(bb.get()))
    (func,) = [
        f for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc) and VNNI_BLOCK in f.script()
    ]
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
