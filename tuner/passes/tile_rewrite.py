"""``tile`` written as a broadcast between two reshapes.

TVM 0.27's ``topi.tile`` (what ``relax.op.tile`` legalizes to) computes wrong values when several axes are
tiled and the result is large enough (seen: a [2, 3, 4, 5] tensor tiled [7, 6, 4, 2], [4, 4, 4, 4] or
[1, 6, 4, 2] gives values of 1e36 or NaN; [2, 2, 2, 2] and single-axis tilings are right), in plain
``tvm.compile`` too. ``tile(x, reps)`` is ``reshape(broadcast_to(reshape(x, [1, d0, 1, d1, ...]),
[r0, d0, r1, d1, ...]), [r0 d0, r1 d1, ...])``: injective operators that fuse into one kernel.
"""

from __future__ import annotations

from typing import Any

from kiln_tvm import relax, tvm
from tuner.passes.rewrite import rewrite_functions


def tile_as_broadcast() -> tvm.transform.Pass:
    """A module pass: every ``relax.op.tile`` of a static shape as reshape, broadcast_to, reshape."""

    @tvm.transform.module_pass(opt_level=0, name="KilnTileAsBroadcast")
    def rewrite(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        return rewrite_functions(_TileMutator(mod))

    return rewrite


def _static(shape: Any) -> list[int] | None:
    values = getattr(shape, "values", None)
    if values is None or not all(isinstance(v, tvm.tirx.IntImm) for v in values):
        return None
    return [int(v.value) for v in values]


@relax.expr_functor.mutator
class _TileMutator(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.tile = tvm.ir.Op.get("relax.tile")

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not call.op.same_as(self.tile):
            return call
        x = call.args[0]
        shape = _static(x.ty.shape)
        if shape is None:
            return call
        reps = [int(r) for r in call.attrs.repeats]
        rank = max(len(shape), len(reps))
        shape = [1] * (rank - len(shape)) + shape
        reps = [1] * (rank - len(reps)) + reps
        interleaved = [size for pair in zip([1] * rank, shape, strict=True) for size in pair]
        spread = [size for pair in zip(reps, shape, strict=True) for size in pair]
        emit = self.builder_.emit
        wide = emit(relax.op.broadcast_to(emit(relax.op.reshape(x, interleaved)), spread))
        return relax.op.reshape(wide, [r * d for r, d in zip(reps, shape, strict=True)])
