"""Quantized elementwise chains as 256-entry tables (a Relax pass run after :mod:`tuner.passes.qdq_lowering`).

A QDQ model quantizes around every operator, so an activation that is not a ReLU arrives as a chain of float
operators between an 8-bit tensor and a quantize. onnxruntime's ``quantize_static`` writes a GELU as

    q1 -> dequantize -> /1.414 -> erf -> quantize -> dequantize -> +1 -> quantize -> dequantize
       -> * dequantize(q1) -> quantize -> dequantize -> *0.5 -> quantize -> q2

13 operators, an erf polynomial and four requantizations per element, all fused into the epilogue of the
matmul before it: on an AMX machine that epilogue, not the tile products, was the kernel's cost
(bench/RESULTS.md). Every value in such a chain is a function of one 8-bit input, so the whole chain is a
table of 256 output bytes: :func:`tabulate_qdq_chains` computes it once, at compile time, in numpy with the
ONNX operators' float32 semantics (round half to even, saturation; erf, tanh, exp computed in float64 and
rounded), and replaces the chain by one lookup kernel that fuses into its producer's epilogue like any
elementwise operator. The table is exact where the float chain is (the requantizations are in it), and
nearer the ONNX semantics than the chain under fast math, whose polynomials it replaces.

A chain is tabulated when it ends in a quantize to 8 bits, depends on exactly one 8-bit tensor of the same
shape (its other operands scalar constants), and is worth a lookup: it holds a transcendental operator or a
requantization. Anything else (a per-channel bias, two inputs, a broadcast) is left to the other passes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln_tvm import RelaxConstant, relax, tvm
from tuner.passes.qdq_lowering import QuantReport
from tuner.passes.rewrite import rewrite_functions

te = tvm.te
_EIGHT_BIT = ("uint8", "int8")
#: Marks the lookup kernels: TVM's AnnotateTIROpPattern sees the table read at a computed index as injective,
#: and FuseOps fuses only elementwise operators into a matmul's epilogue, so :func:`lookups_as_elementwise`
#: (run between the two) restores what the kernel is, elementwise in its 8-bit input.
LOOKUP_ATTR = "kiln.elementwise_lookup"
_ELEMENTWISE = 0  # FuseOps' kElemWise


def tabulate_qdq_chains(report: QuantReport | None = None) -> tvm.transform.Pass:
    """A module pass replacing quantized elementwise chains by table lookups; ``report`` lists them in
    ``lowered`` ("GELU chain 1x128x1024 uint8 -> uint8: 13 operators as a 256-entry table")."""
    sink = report if report is not None else QuantReport()

    @tvm.transform.module_pass(opt_level=0, name="KilnTabulateQDQChains")
    def rewrite(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        mutator = _TableMutator(mod)
        rewritten = relax.transform.DeadCodeElimination()(rewrite_functions(mutator))
        # A chain inside a longer one was tabulated too, then left unused: only the kernels kept count.
        kept = {gvar.name_hint for gvar in rewritten.get_global_vars()}
        sink.lowered.extend(what for name, what in mutator.tabulated.items() if name in kept)
        return rewritten

    return rewrite


def lookups_as_elementwise() -> tvm.transform.Pass:
    """A module pass, run after AnnotateTIROpPattern: the lookup kernels' pattern is elementwise, so that
    FuseOps puts them in their producer's epilogue."""

    @tvm.transform.module_pass(opt_level=0, name="KilnLookupsAsElementwise")
    def mark(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        marked = [gvar for gvar, func in mod.functions.items() if func.attrs and LOOKUP_ATTR in func.attrs]
        if not marked:
            return mod
        functions = dict(mod.functions)
        for gvar in marked:
            functions[gvar] = functions[gvar].with_attr("op_pattern", _ELEMENTWISE)
        return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)

    return mark


# --------------------------------------------------------------------------------------------------
# The operators a chain may hold, in numpy with the ONNX semantics (float32 unless said)


class _NotTabulable(Exception):
    """The expression is not a chain this pass tabulates."""


def _float64(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[relax.Call, list[np.ndarray]], np.ndarray]:
    """A transcendental computed in float64, rounded once to the call's dtype."""
    return lambda call, args: fn(args[0].astype(np.float64)).astype(_dtype(call))


def _arithmetic(fn: Callable[..., np.ndarray]) -> Callable[[relax.Call, list[np.ndarray]], np.ndarray]:
    def apply(call: relax.Call, args: list[np.ndarray]) -> np.ndarray:
        dtype = _dtype(call)
        if not np.issubdtype(dtype, np.floating):
            raise _NotTabulable(f"integer {call.op.name}")
        return np.asarray(fn(*(a.astype(dtype) for a in args))).astype(dtype)

    return apply


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _quantize(call: relax.Call, args: list[np.ndarray]) -> np.ndarray:
    x, scale, zero = args
    dtype = _dtype(call)
    info = np.iinfo(dtype)
    scaled = np.rint(x.astype(np.float32) / scale.astype(np.float32)) + zero.astype(np.float32)
    return np.clip(scaled, info.min, info.max).astype(dtype)


def _dequantize(call: relax.Call, args: list[np.ndarray]) -> np.ndarray:
    x, scale, zero = args
    return (
        (x.astype(np.int32) - zero.astype(np.int32)).astype(np.float32) * scale.astype(np.float32)
    ).astype(_dtype(call))


def _astype(call: relax.Call, args: list[np.ndarray]) -> np.ndarray:
    dtype = _dtype(call)
    x = args[0]
    if np.issubdtype(dtype, np.integer) and np.issubdtype(x.dtype, np.floating):
        info = np.iinfo(dtype)
        if np.any(np.isnan(x)) or x.min() <= info.min - 1 or x.max() >= info.max + 1:
            raise _NotTabulable("a float cast to integers out of their range")  # undefined in C, so in TVM
    return x.astype(dtype)


_OPERATORS: dict[str, Callable[[relax.Call, list[np.ndarray]], np.ndarray]] = {
    "relax.add": _arithmetic(np.add),
    "relax.subtract": _arithmetic(np.subtract),
    "relax.multiply": _arithmetic(np.multiply),
    "relax.divide": _arithmetic(np.divide),
    "relax.maximum": _arithmetic(np.maximum),
    "relax.minimum": _arithmetic(np.minimum),
    "relax.negative": _arithmetic(np.negative),
    "relax.abs": _arithmetic(np.abs),
    "relax.round": _arithmetic(np.rint),
    "relax.floor": _arithmetic(np.floor),
    "relax.ceil": _arithmetic(np.ceil),
    "relax.nn.relu": _arithmetic(lambda x: np.maximum(x, 0)),
    "relax.erf": _float64(_erf),
    "relax.tanh": _float64(np.tanh),
    "relax.exp": _float64(np.exp),
    "relax.sqrt": _float64(np.sqrt),
    "relax.sigmoid": _float64(lambda x: 1 / (1 + np.exp(-x))),
    "relax.nn.silu": _float64(lambda x: x / (1 + np.exp(-x))),
    "relax.nn.gelu": _float64(lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2)))),
    "relax.nn.gelu_tanh": _float64(
        lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    ),
    "relax.quantize": _quantize,
    "relax.dequantize": _dequantize,
    "relax.astype": _astype,
}
_TRANSCENDENTAL = {
    "relax.erf": "erf",
    "relax.tanh": "tanh",
    "relax.exp": "exp",
    "relax.sqrt": "sqrt",
    "relax.sigmoid": "sigmoid",
    "relax.nn.silu": "SiLU",
    "relax.nn.gelu": "GELU",
    "relax.nn.gelu_tanh": "GELU",
}


def _dtype(expr: relax.Expr) -> np.dtype:
    return np.dtype(str(expr.ty.dtype))


def _shape(expr: relax.Expr) -> tuple[int, ...] | None:
    shape = getattr(expr.ty, "shape", None)
    try:
        return tuple(int(d) for d in shape) if shape is not None else None
    except TypeError:  # a symbolic dimension
        return None


# --------------------------------------------------------------------------------------------------
# Tracing a chain back to its 8-bit input


@dataclass(frozen=True)
class _Trace:
    """What an expression is, seen from the quantize that ends a chain: a constant (``value``), or a
    function of the 8-bit variable ``root``."""

    value: np.ndarray | None = None
    root: relax.Var | None = None
    requantizations: int = 0
    transcendental: str = ""


@relax.expr_functor.mutator
class _TableMutator(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.tabulated: dict[str, str] = {}  # lookup kernel's name -> what it replaced
        self.quantize = tvm.ir.Op.get("relax.quantize")
        self.traces: dict[Any, _Trace | None] = {}  # keyed by the input function's variables
        # The input module's bindings: a chain is traced as the model wrote it, though its inner
        # quantizes (chains of their own) may already be rewritten when the outer one is reached.
        self.bindings: dict[Any, relax.Expr] = {
            binding.var: binding.value
            for func in mod.functions.values()
            if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr)
            for block in func.body.blocks
            for binding in block.bindings
            if isinstance(binding, relax.VarBinding)
        }

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        if not call.op.same_as(self.quantize) or str(call.ty.dtype) not in _EIGHT_BIT:
            return super().visit_call_(call)
        try:
            trace = self._trace_call(call)
        except _NotTabulable:
            return super().visit_call_(call)
        worth = trace.transcendental or trace.requantizations > 1
        if trace.root is None or not worth:
            return super().visit_call_(call)
        root = trace.root
        values = np.arange(256, dtype=np.int64) + (-128 if str(root.ty.dtype) == "int8" else 0)
        try:
            evaluated: dict[Any, np.ndarray] = {}
            table = self._evaluate(call, root, values.astype(_dtype(root)), evaluated)
        except _NotTabulable:
            return super().visit_call_(call)
        lookup = self._lookup(self.visit_expr(root), table, str(root.ty.dtype))
        what = f"{trace.transcendental} chain" if trace.transcendental else "requantization chain"
        shape = "x".join(str(d) for d in _shape(call) or ())
        self.tabulated[lookup.args[0].name_hint] = (
            f"{what} {shape} {root.ty.dtype} -> {call.ty.dtype}: {len(evaluated) + 1} operators as a 256-entry table"
        )
        return lookup

    def _lookup(self, data: relax.Expr, table: np.ndarray, dtype: str) -> relax.Expr:
        offset = 128 if dtype == "int8" else 0

        def kernel(q: Any, entries: Any) -> Any:
            return te.compute(q.shape, lambda *i: entries[q(*i).astype("int32") + offset], name="qdq_table")

        call = self.builder_.call_te(kernel, data, relax.const(table), primfunc_name_hint="qdq_table")
        gvar = call.args[0]
        self.builder_.update_func(gvar, self.builder_.get()[gvar].with_attr(LOOKUP_ATTR, True))
        return call

    def _trace_expr(self, expr: relax.Expr) -> _Trace:
        if isinstance(expr, tvm.tirx.FloatImm | tvm.tirx.IntImm):  # an immediate (relax.clip's bounds)
            return _Trace(value=np.asarray(expr.value))
        if isinstance(expr, RelaxConstant):
            return _Trace(value=expr.value.numpy())
        if not isinstance(expr, relax.Var):
            raise _NotTabulable(type(expr).__name__)
        if expr in self.traces:
            cached = self.traces[expr]
            if cached is None:
                raise _NotTabulable("seen")
            return cached
        trace: _Trace | None = None
        bound = self.bindings.get(expr)
        if isinstance(bound, relax.Call):
            try:
                trace = self._trace_call(bound)
            except _NotTabulable:
                trace = None
        if trace is None and str(getattr(expr.ty, "dtype", "")) in _EIGHT_BIT and _shape(expr) is not None:
            trace = _Trace(root=expr)  # the deepest 8-bit tensor the chain reaches
        self.traces[expr] = trace
        if trace is None:
            raise _NotTabulable("not a chain")
        return trace

    def _trace_call(self, call: relax.Call) -> _Trace:
        name = str(getattr(call.op, "name", ""))
        if name not in _OPERATORS:
            raise _NotTabulable(name or "a call of a function")
        args = [self._trace_expr(a) for a in call.args]
        if any(t.value is not None and t.value.size != 1 for t in args):
            raise _NotTabulable("a constant of more than one value")  # per channel: not one table
        roots: list[relax.Var] = []
        for t in args:
            if t.root is not None and not any(t.root.same_as(r) for r in roots):
                roots.append(t.root)
        if not roots:  # a scalar computed from constants (onnxruntime quantizes the GELU's 1 and 0.5)
            return _Trace(value=_OPERATORS[name](call, [t.value for t in args]))  # type: ignore[misc]
        if len(roots) > 1:
            raise _NotTabulable("two inputs")
        (root,) = roots
        if _shape(call) != _shape(root):
            raise _NotTabulable("a broadcast")
        derived = [t for t in args if t.root is not None]
        return _Trace(
            root=root,
            requantizations=(name == "relax.quantize") + sum(t.requantizations for t in derived),
            transcendental=_TRANSCENDENTAL.get(name, "")
            or next((t.transcendental for t in derived if t.transcendental), ""),
        )

    def _evaluate(
        self, expr: relax.Expr, root: relax.Var, values: np.ndarray, memo: dict[Any, np.ndarray]
    ) -> np.ndarray:
        """``expr`` for each value of ``root`` (``values``, in order), constants as 0-d arrays."""
        if expr.same_as(root):
            return values
        trace = self._trace_call(expr) if isinstance(expr, relax.Call) else self._trace_expr(expr)
        if trace.root is None:
            return np.asarray(trace.value).reshape(())
        if isinstance(expr, relax.Var):
            if expr not in memo:
                memo[expr] = self._evaluate(self.bindings[expr], root, values, memo)
            return memo[expr]
        args = [self._evaluate(a, root, values, memo) for a in expr.args]
        return _OPERATORS[str(expr.op.name)](expr, args)
