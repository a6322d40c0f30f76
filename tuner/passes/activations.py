"""GELU written out as its formula, so that fast math reaches the ``erf`` or ``tanh`` inside it.

TVM's ``FastMathTransform`` replaces Relax's ``exp``, ``erf``, ``tanh`` and softmax calls by polynomial
approximations, but not ``relax.nn.gelu`` / ``relax.nn.gelu_tanh`` (what torch.export's GELU becomes):
those legalise to one kernel whose ``erf``/``tanh`` LLVM lowers to a scalar libm call per element. In a
transformer block of ``bench/capture.py`` that kernel took 471 us of a 1.5 ms run (2.2 GFLOP/s).
:func:`gelu_as_formula` rewrites both into elementwise Relax operators, which fuse with their neighbours
as before.
"""

from __future__ import annotations

import math
from typing import Any

from kiln_tvm import relax, tvm
from tuner.passes.rewrite import rewrite_functions


def gelu_as_formula() -> tvm.transform.Pass:
    """A module pass: ``gelu(x) = 0.5 x (1 + erf(x / sqrt 2))`` and ``gelu_tanh(x) = 0.5 x (1 +
    tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`` as Relax operators. Other calls are left as they are."""

    @tvm.transform.module_pass(opt_level=0, name="KilnGeluAsFormula")
    def rewrite(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        return rewrite_functions(_GeluMutator(mod))

    return rewrite


@relax.expr_functor.mutator
class _GeluMutator(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.gelu = tvm.ir.Op.get("relax.nn.gelu")
        self.gelu_tanh = tvm.ir.Op.get("relax.nn.gelu_tanh")

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        exact, tanh = call.op.same_as(self.gelu), call.op.same_as(self.gelu_tanh)
        if not (exact or tanh) or not str(call.args[0].ty.dtype).startswith("float"):
            return call
        x = call.args[0]
        dtype = str(x.ty.dtype)
        emit = self.builder_.emit

        def const(value: float) -> relax.Expr:
            return relax.const(value, dtype)

        if exact:
            inner = emit(relax.op.erf(emit(relax.op.multiply(x, const(1 / math.sqrt(2))))))
        else:
            cube = emit(relax.op.multiply(emit(relax.op.multiply(x, x)), x))
            poly = emit(relax.op.add(x, emit(relax.op.multiply(cube, const(0.044715)))))
            inner = emit(relax.op.tanh(emit(relax.op.multiply(poly, const(math.sqrt(2 / math.pi))))))
        half_x = emit(relax.op.multiply(x, const(0.5)))
        return relax.op.multiply(half_x, emit(relax.op.add(inner, const(1.0))))
