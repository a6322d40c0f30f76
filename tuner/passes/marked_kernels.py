"""Kernels whose blocks Kiln's schedule rules recognise: a TE kernel emitted as a PrimFunc with its block
marked, and the layouts of the convolutions those kernels take."""

from __future__ import annotations

from typing import Any

from kiln_tvm import relax, s_tir, tvm


def conv2d_layout_misfit(call: relax.Call) -> str | None:
    """Why a conv2d call cannot go on a packed kernel (its layouts, its groups), or None."""
    attrs = call.attrs
    layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
    if layouts != ("NHWC", "OHWI", "NHWC"):
        return f"its layouts are {'/'.join(layouts)} (NHWC/OHWI/NHWC is packed)"
    if int(attrs.groups) != 1:
        return f"it is grouped ({int(attrs.groups)} groups)"
    return None


def emit_marked_kernel(
    builder: relax.BlockBuilder, kernel: Any, args: list[relax.Expr], name: str, mark: str
) -> relax.Expr:
    """Emit the TE ``kernel`` on ``args`` as the PrimFunc ``name``, its block ``name`` annotated ``mark``
    (the rules of :mod:`schedules` tensorize marked blocks only)."""
    out = builder.call_te(kernel, *args, primfunc_name_hint=name)
    gvar = out.args[0]
    sch = s_tir.Schedule(tvm.IRModule({"main": builder.get()[gvar]}))
    sch.annotate(sch.get_sblock(name), mark, 1)
    builder.update_func(gvar, sch.mod["main"])
    return out
