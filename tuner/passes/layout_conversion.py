"""Convolutions converted to another layout (NHWC on CPU), with the operators TVM's layout rules fail on
kept in the model's own layout.

``relax.transform.ConvertLayout`` walks the whole program and asks each operator how it follows a layout
(its ``FRelaxInferLayout``). In TVM 0.27 several of those rules raise instead of answering, whether or not
a convolution is near: ``stack`` (ONNX's two-input ``Max`` is a stack and a reduction), the reductions of
the expanded GELU, ``Compress``'s gather, ``Dropout``'s tuple. One such operator anywhere failed the whole
conversion.

:func:`convert_layout` runs the conversion only on a program that has an operator to convert. When it
fails, it finds the operator kinds that make it fail (each tried alone, every other candidate hidden), and
converts again with those kinds already legalized to TIR kernels (:func:`opaque_calls`): a ``call_tir`` has
no layout rule, so the conversion treats it as a barrier and hands it its inputs in the model's layout.
Those operators then compute exactly what they computed before, and everything else is converted. When
that is not enough, every candidate is hidden; then the values of data-dependent shape are kept out of the
conversion (:func:`match_casts_as_outputs`: ``Compress`` after a convolution fails that way); when even
that fails, the program is left as it was. Each way out is noted in :class:`tuner.passes.guarded.SkippedPasses`.
"""

from __future__ import annotations

from typing import Any

from kiln_tvm import relax, tvm
from tuner.errors import KilnError
from tuner.frontend.imported import short_error
from tuner.passes.guarded import SkippedPasses
from tuner.passes.levels import operator_histogram
from tuner.passes.rewrite import rewrite_functions

_STRUCTURAL = ("relax.call_tir", "relax.call_tir_inplace", "relax.call_dps_packed", "relax.call_pure_packed")


def convert_layout(desired: dict[str, list[str]], skipped: SkippedPasses) -> tvm.transform.Pass:
    """A module pass: ``ConvertLayout(desired)``, falling back as the module's description says."""
    layout = "/".join(sorted({layouts[0] for layouts in desired.values()}))

    @tvm.transform.module_pass(opt_level=0, name="ConvertLayout")
    def run(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        present = operator_histogram(mod)
        if not any(op in present for op in desired):
            return mod
        convert = relax.transform.ConvertLayout(desired)
        converted, failure = _converted(convert, mod)
        if converted is not None:
            return converted
        candidates = sorted(op for op in present if op not in desired and _legalizable(op))
        if candidates and _converted(convert, opaque_calls(mod, candidates))[0] is not None:
            breaking = [
                op
                for op in candidates
                if _converted(convert, opaque_calls(mod, [c for c in candidates if c != op]))[0] is None
            ]
            for kept in (breaking, candidates) if breaking else (candidates,):
                converted = _converted(convert, opaque_calls(mod, kept))[0]
                if converted is not None:
                    names = ", ".join(op.removeprefix("relax.") for op in kept)
                    skipped.add(
                        f"layout conversion to {layout}: {names} kept in the model's layout "
                        f"(TVM's layout rule failed: {failure})"
                    )
                    return converted
        converted = _converted(convert, match_casts_as_outputs(mod))[0]
        if converted is not None:
            skipped.add(
                f"layout conversion to {layout}: the values of dynamic shape kept in the model's layout "
                f"(TVM's layout rule failed: {failure})"
            )
            return converted
        skipped.add(f"layout conversion to {layout} skipped: {failure}")
        return mod

    return run


def _converted(convert: tvm.transform.Pass, mod: tvm.IRModule) -> tuple[tvm.IRModule | None, str]:
    """``mod`` converted, or None and why ``convert`` fails on it (one short line)."""
    try:
        return convert(mod), ""
    except (KilnError, MemoryError):
        raise
    except Exception as err:  # noqa: BLE001 - TVM's layout rules raise InternalError and others
        return None, short_error(err, limit=300)


def _legalizable(op_name: str) -> bool:
    if op_name in _STRUCTURAL:
        return False
    return tvm.ir.Op.get(op_name).get_attr("FLegalize") is not None


def opaque_calls(mod: tvm.IRModule, op_names: list[str]) -> tvm.IRModule:
    """``mod`` with every call of the operators ``op_names`` legalized to a TIR kernel now (what
    ``LegalizeOps`` would emit for it later), the other calls left as they are."""
    return rewrite_functions(_OpaqueCalls(mod, op_names))


@relax.expr_functor.mutator
class _OpaqueCalls(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, op_names: list[str]) -> None:
        super().__init__(mod)
        self.legalize = {name: tvm.ir.Op.get(name).get_attr("FLegalize") for name in op_names}

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op):
            return call
        legalize = self.legalize.get(str(call.op.name))
        if legalize is None:
            return call
        return legalize(self.builder_, self.builder_.normalize(call))


def match_casts_as_outputs(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with the variables that dataflow ``match_cast`` bindings define (a value of data-dependent
    shape, such as ``nonzero``'s, given its symbolic shape) made outputs of their dataflow block.

    ``ConvertLayout`` converts only dataflow variables, and fails on a ``match_cast`` of a value whose
    layout it does not know; as a block output the variable stays in the model's layout and the
    conversion goes on around it. What the program computes does not change.
    """
    return rewrite_functions(_MatchCastsAsOutputs(mod))


@relax.expr_functor.mutator
class _MatchCastsAsOutputs(relax.PyExprMutator):
    def visit_match_cast_(self, binding: relax.MatchCast) -> None:
        if not isinstance(binding.var, relax.DataflowVar):
            super().visit_match_cast_(binding)
            return
        var = relax.Var(binding.var.name, binding.var.ty)
        self.builder_.emit_normalized(relax.MatchCast(var, self.visit_expr(binding.value), binding.ty))
        self.set_var_remap(binding.var, var)
