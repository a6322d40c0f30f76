"""Running a Relax expression mutator over a whole module (every Relax function, in place)."""

from __future__ import annotations

from kiln_tvm import relax, tvm


def rewrite_functions(mutator: relax.PyExprMutator) -> tvm.IRModule:
    """The module ``mutator`` was made on, with each of its Relax functions rewritten by ``mutator``
    (PrimFuncs the mutator emitted included)."""
    for gvar, func in list(mutator.builder_.get().functions.items()):
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    return mutator.builder_.get()
