"""Precision policies for float models: matmuls and convolutions in bf16 or fp16, accumulated in fp32.

``as-is`` (the default) keeps the model's precision. ``auto`` is ``bf16`` on a CPU with bf16 instructions
(AMX-BF16, AVX512-BF16) and ``as-is`` elsewhere (:func:`auto_precision`); a job under ``auto`` also keeps
``as-is`` when bf16 would take its outputs beyond the bf16 tolerance. ``bf16`` and ``fp16`` cast the two operands of every
float32 matmul and convolution to the low precision and keep the accumulation and the result in float32
(``out_dtype``): the weights, constants, fold to low-precision constants at compile time (half the bytes
to load), while everything sensitive to rounding (softmax, normalisation, reductions, exp, the epilogues
fused after the matmul) keeps float32, since only these operators' inputs are cast.

How the CPU computes it is reported as it is: TVM 0.27 legalizes bf16 arithmetic to float32
(``BF16ComputeLegalize``: each bf16 value widened when loaded) and fp16 likewise (F16C conversions), so
the products are *emulated* in fp32 on the low-precision values (the numerics of the low precision, the
speed of fp32 on the arithmetic, half the weight bytes on the memory side), except where the CPU has
AMX-BF16 or AVX512-BF16: there the bf16 matmuls that are whole AMX blocks run *natively* on ``tdpbf16ps``
tiles, and the other matmuls and the NHWC convolutions whose weights pack for it on ``vdpbf16ps``
(:mod:`tuner.passes.bf16_packing`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln_tvm import RelaxConstant, Target, relax, tvm
from schedules.amx import has_amx_bf16
from schedules.isa import isa_profile
from schedules.vnni import has_avx512_bf16
from tuner.entities.job import check_precision
from tuner.passes.qdq_lowering import describe_core
from tuner.passes.rewrite import rewrite_functions

_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
#: Per policy, the largest norm-wise relative error of an output against the float32 reference
#: (``||a - e|| / ||e||``) that verification accepts. A bf16 operand carries a relative rounding error up to
#: 2^-8 and an fp16 one 2^-11; products of two rounded operands summed in fp32 stay near that, a few layers
#: deep compound it: 16 unit roundoffs leaves room for a deep model and still fails a wrong kernel
#: (whose error is of the order of the output itself).
RELATIVE_TOLERANCE = {"bf16": 16 * 2.0**-8, "fp16": 16 * 2.0**-11}


def native_bf16(target: Target) -> list[str]:
    """The bf16 instructions of ``target``'s CPU, as LLVM names them (``amx-bf16``, ``avx512bf16``): those
    the schedules tensorize with (:func:`schedules.amx.has_amx_bf16`, :func:`schedules.vnni.has_avx512_bf16`)."""
    found = (("amx-bf16", has_amx_bf16(target)), ("avx512bf16", has_avx512_bf16(target)))
    return [name for name, present in found if present]


def auto_precision(target: Target) -> tuple[str, str]:
    """What ``auto`` is on ``target``: ``bf16`` where its CPU multiplies bf16 natively, else ``as-is``;
    and why, in a sentence."""
    native = native_bf16(target)
    if native:
        return "bf16", f"auto: bf16, which this CPU multiplies natively ({', '.join(native)})"
    return "as-is", "auto: as-is, since this CPU has no bf16 instructions (AMX-BF16, AVX512-BF16)"


@dataclass
class PrecisionReport:
    """What a precision policy did to one module: the operators now computed on low-precision operands."""

    reduced: list[str] = field(default_factory=list)  # "matmul 32x512 * 512x2048 -> bf16"


@dataclass(frozen=True)
class PrecisionCompute:
    """How a target computes a policy's low-precision operators: natively, or emulated in fp32 (why)."""

    mode: str  # "native", "emulated", or "" for as-is
    note: str


def precision_compute(
    policy: str, target: Target, reduced: int = 0, on_amx: int = 0, on_dot: int = 0
) -> PrecisionCompute:
    """Whether ``target`` computes ``policy``'s products on low-precision instructions, and why not;
    ``on_amx`` of the ``reduced`` operators are bf16 matmuls on AMX-BF16 kernels, ``on_dot`` on
    AVX512-BF16's ``vdpbf16ps``."""
    if policy == "as-is":
        return PrecisionCompute("", "")
    features = isa_profile(target).features
    widened = "bf16 values widened to fp32 and multiplied in fp32 (TVM's BF16ComputeLegalize)"
    if policy == "bf16" and (on_amx or on_dot):
        native = [
            *([f"{on_amx} of {reduced} on AMX-BF16 tiles (tdpbf16ps, fp32 accumulation)"] if on_amx else []),
            *([f"{on_dot} of {reduced} on AVX512-BF16 (vdpbf16ps, fp32 accumulation)"] if on_dot else []),
        ]
        said = "; ".join(native)
        if on_amx + on_dot >= reduced:
            return PrecisionCompute("native", said)
        return PrecisionCompute("mixed", f"{said}; the others (bf16_unpacked says why): {widened}")
    if policy == "bf16":
        has = native_bf16(target)
        if has:
            why = f"the CPU has {', '.join(has)}, but no operator's weight packs for it"
        else:
            why = "the CPU has no AVX512-BF16 or AMX-BF16"
        return PrecisionCompute("emulated", f"{widened}: {why}")
    why = (
        "the CPU has avx512fp16, which TVM 0.27 does not emit"
        if "avx512fp16" in features
        else "x86 before AVX512-FP16 has no fp16 arithmetic"
    )
    return PrecisionCompute("emulated", f"fp16 values converted to fp32 (F16C) and multiplied in fp32: {why}")


def reduce_precision(policy: str, report: PrecisionReport | None = None) -> tvm.transform.Pass:
    """A module pass casting the operands of float32 matmuls and convolutions to ``policy``'s dtype, with
    float32 accumulation and result; ``as-is`` is the identity. ``report`` collects what it cast."""
    check_precision(policy)
    sink = report if report is not None else PrecisionReport()

    @tvm.transform.module_pass(opt_level=0, name="KilnReducePrecision")
    def rewrite(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        if policy == "as-is":
            return mod
        return rewrite_functions(_ReducingMutator(mod, _DTYPES[policy], policy, sink))

    return rewrite


#: The operators whose operands are cast (each rebuilt on the cast operands with an fp32 result).
_REDUCED_OPS = ("relax.matmul", "relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d")


def read_bf16_round_trips(report: PrecisionReport | None = None) -> tvm.transform.Pass:
    """A module pass computing each float32 matmul and convolution whose two operands the model itself
    rounds to bf16 (ONNX's ``Cast`` to bfloat16 and back, :mod:`tuner.quantization.bf16_operands`; the
    importer folds a constant weight's round trip into values that bf16 holds exactly) on those bf16
    values, with float32 accumulation and result: the same numbers, half the operand bytes, and the bf16
    kernels of :mod:`tuner.passes.bf16_packing` on CPUs that have them. ``report`` collects what it read."""
    sink = report if report is not None else PrecisionReport()

    @tvm.transform.module_pass(opt_level=0, name="KilnReadBf16RoundTrips")
    def rewrite(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        return rewrite_functions(_RoundTripMutator(mod, sink))

    return rewrite


class _CoreRebuilder(relax.PyExprMutator):
    """Rebuilds a matmul or convolution on low-precision operands with a float32 result."""

    ops = {name: tvm.ir.Op.get(name) for name in _REDUCED_OPS}

    def core_name(self, call: relax.Call) -> str | None:
        """The core operator ``call`` is, when both its operands are float32."""
        name = next((n for n, op in self.ops.items() if call.op.same_as(op)), None)
        if name is None or not all(_dtype(arg) == "float32" for arg in call.args[:2]):
            return None
        return name

    @staticmethod
    def rebuilt(call: relax.Call, name: str, a: relax.Expr, b: relax.Expr) -> relax.Expr:
        if name == "relax.matmul":
            return relax.op.matmul(a, b, out_dtype="float32")
        attrs = call.attrs
        conv = {"relax.nn.conv1d": relax.op.nn.conv1d, "relax.nn.conv2d": relax.op.nn.conv2d}.get(
            name, relax.op.nn.conv3d
        )
        return conv(
            a,
            b,
            strides=attrs.strides,
            padding=attrs.padding,
            dilation=attrs.dilation,
            groups=attrs.groups,
            data_layout=attrs.data_layout,
            kernel_layout=attrs.kernel_layout,
            out_layout=attrs.out_layout,
            out_dtype="float32",
        )


@relax.expr_functor.mutator
class _ReducingMutator(_CoreRebuilder):
    def __init__(self, mod: tvm.IRModule, dtype: str, policy: str, report: PrecisionReport) -> None:
        super().__init__(mod)
        self.dtype, self.policy, self.report = dtype, policy, report

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        name = self.core_name(call)
        if name is None:
            return call
        a, b = (relax.op.astype(arg, self.dtype) for arg in call.args[:2])
        self.report.reduced.append(f"{describe_core(call)} -> {self.policy}")
        return self.rebuilt(call, name, a, b)


@relax.expr_functor.mutator
class _RoundTripMutator(_CoreRebuilder):
    def __init__(self, mod: tvm.IRModule, report: PrecisionReport) -> None:
        super().__init__(mod)
        self.report = report
        self.astype = tvm.ir.Op.get("relax.astype")

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        name = self.core_name(call)
        if name is None:
            return call
        a, b = (self._bf16_value(arg) for arg in call.args[:2])
        if a is None or b is None:
            return call
        self.report.reduced.append(f"{describe_core(call)} -> bf16 (rounded so by the model)")
        return self.rebuilt(call, name, a, b)

    def _bf16_value(self, operand: relax.Expr) -> relax.Expr | None:
        """``operand`` as the bf16 tensor it holds: the narrow side of a round trip, or a constant whose
        values bf16 holds exactly, cast; None for anything else."""
        value = self.lookup_binding(operand) if isinstance(operand, relax.Var) else operand
        if isinstance(value, RelaxConstant):
            data = value.value.numpy()
            exact = data.dtype == np.float32 and not np.any(data.view(np.uint32) & 0xFFFF)
            return relax.op.astype(value, "bfloat16") if exact else None
        if isinstance(value, relax.Call) and value.op.same_as(self.astype):
            narrow = value.args[0]
            return narrow if _dtype(narrow) == "bfloat16" else None
        return None


def _dtype(expr: relax.Expr) -> str:
    return str(getattr(expr.ty, "dtype", ""))
