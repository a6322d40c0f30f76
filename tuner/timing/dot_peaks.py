"""This machine's int8 and bf16 peaks: the roofs of the tasks that compute in those precisions.

An int8 or bf16 kernel is not bounded by the fp32 FMA peak (:mod:`tuner.timing.roofline`): ``vpdpbusd``
does four u8 x s8 products per 32-bit lane where an FMA does one fp32 product, ``vdpbf16ps`` two bf16
products, and on a CPU without VNNI, ``vpmaddubsw`` then ``vpmaddwd`` still do four products per lane in
two instructions (what Kiln's kernels over 7-bit weights use there; those over full 8-bit weights use
``vpmaddwd`` on int16 products, about 0.85x of it on a Zen 3, and are judged against this roof too). Each peak is measured like the FMA peak: ``chains`` independent accumulators per
thread, each advanced by the CPU's widest dot product of the precision ``iterations`` times, on every
thread.

The loop is written in LLVM IR (linked into the kernel by TVM's ``pragma_import_llvm``, as Kiln's
``vdpbf16ps`` intrinsic is): TVM's code generator has no bf16 vector type, and on the
``vpmaddubsw``/``vpmaddwd`` pair LLVM would hoist loop-invariant products out of a loop written in TIR.
Here every product reads its own accumulator (the ``vpmaddubsw`` chain reads it as its signed operand),
so nothing is hoisted and each step's instructions run.

An operation is a multiply or an add, as a FLOP is: one u8 x s8 multiply-accumulate counts 2 (GOP/s for
int8, GFLOP/s for bf16), so the three peaks compare as the kernels' work does. AMX's tile peaks are not
measured here: without them an AMX kernel is judged against the precision's vector peak, which it exceeds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln_tvm import tir_script as T
from kiln_tvm import tvm
from schedules.isa import isa_profile
from tuner.targets import to_tvm_target
from tuner.timing.peak_timer import REPEATS, rate_timer

#: Independent accumulator chains per thread (as the FMA peak's: they fit AVX2's 16 registers).
DOT_CHAINS = 12
_FUNCTION = "kiln_dot_peak"


@dataclass(frozen=True)
class DotProduct:
    """One precision's widest dot product on a CPU: the instructions of one accumulator step, and the
    LLVM IR of that step."""

    precision: str  # "int8" or "bf16"
    instruction: str  # in words, e.g. "vpdpbusd zmm"
    #: operations (2 per multiply-accumulate) one step of one accumulator performs.
    ops_per_step: int
    acc_type: str  # the accumulator's LLVM type
    operand_bytes: int  # bytes of each of the step's two operand vectors
    step_ir: str  # ``%next = ...`` from ``%acc``, ``%a``, ``%b`` (and ``%ones`` for the vpmaddwd pair)
    declarations: str


def _vpdpbusd(lanes: int) -> DotProduct:
    bits = 32 * lanes
    acc, ops = f"<{lanes} x i32>", f"<{4 * lanes} x i8>"
    name = f"llvm.x86.avx512.vpdpbusd.{bits}"
    return DotProduct(
        "int8",
        f"vpdpbusd {'zmm' if lanes == 16 else 'ymm'}",
        2 * 4 * lanes,
        acc,
        4 * lanes,
        f"%next = call {acc} @{name}({acc} %acc, {ops} %a, {ops} %b)",
        f"declare {acc} @{name}({acc}, {ops}, {ops})",
    )


def _vpmaddubsw(lanes: int) -> DotProduct:
    """u8 x s8 pairs to saturated s16 sums (``vpmaddubsw``), pairs of those to s32 (``vpmaddwd`` by ones),
    added to the accumulator: what integer kernels use where there is no VNNI."""
    acc, ops, words = f"<{lanes} x i32>", f"<{4 * lanes} x i8>", f"<{2 * lanes} x i16>"
    if lanes == 16:
        ubsw, wd, reg = "llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512", "zmm"
    else:
        ubsw, wd, reg = "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd", "ymm"
    step = "\n  ".join(
        [
            f"%signed = bitcast {acc} %acc to {ops}",
            f"%pairs = call {words} @{ubsw}({ops} %a, {ops} %signed)",
            f"%quads = call {acc} @{wd}({words} %pairs, {words} %ones)",
            f"%next = add {acc} %acc, %quads",
        ]
    )
    return DotProduct(
        "int8",
        f"vpmaddubsw + vpmaddwd {reg}",
        2 * 4 * lanes,
        acc,
        4 * lanes,
        step,
        f"declare {words} @{ubsw}({ops}, {ops})\ndeclare {acc} @{wd}({words}, {words})",
    )


def _vdpbf16ps() -> DotProduct:
    acc, ops, name = "<16 x float>", "<32 x bfloat>", "llvm.x86.avx512bf16.dpbf16ps.512"
    return DotProduct(
        "bf16",
        "vdpbf16ps zmm",
        2 * 2 * 16,
        acc,
        64,
        f"%next = call {acc} @{name}({acc} %acc, {ops} %a, {ops} %b)",
        f"declare {acc} @{name}({acc}, {ops}, {ops})",
    )


def dot_products(features: set[str]) -> dict[str, DotProduct]:
    """The widest int8 and bf16 dot products of a CPU with LLVM ``features`` (by precision; a precision
    the CPU has no dot product for is absent: bf16 without AVX512-BF16 computes in fp32)."""
    found: dict[str, DotProduct] = {}
    if {"avx512vnni", "avx512f"} <= features:
        found["int8"] = _vpdpbusd(16)
    elif "avxvnni" in features:
        found["int8"] = _vpdpbusd(8)
    elif {"avx512bw", "avx512f"} <= features:
        found["int8"] = _vpmaddubsw(16)
    elif "avx2" in features:
        found["int8"] = _vpmaddubsw(8)
    if {"avx512bf16", "avx512f"} <= features:
        found["bf16"] = _vdpbf16ps()
    return found


def target_dot_products(target: dict[str, Any]) -> dict[str, DotProduct]:
    """:func:`dot_products` of a CPU target."""
    return dot_products(set(isa_profile(to_tvm_target(target)).features))


def peak_ir(dot: DotProduct, chains: int) -> str:
    """``i32 kiln_dot_peak(ptr out, i32 out_offset, ptr a, ptr b, ptr ones, i32 iterations)``: ``chains``
    accumulators, each advanced by ``dot``'s step ``iterations`` times, their sum stored at ``out`` +
    ``out_offset`` bytes."""
    acc, ops = dot.acc_type, f"<{dot.operand_bytes} x i8>"
    words = f"<{dot.operand_bytes // 2} x i16>"
    operand = ops if dot.precision == "int8" else f"<{dot.operand_bytes // 2} x bfloat>"
    lines = [
        f"define i32 @{_FUNCTION}(ptr %out, i32 %out_offset, ptr %a_ptr, ptr %b_ptr, ptr %ones_ptr, i32 %n) {{",
        "entry:",
        f"  %a = load {operand}, ptr %a_ptr, align 1",
        f"  %b = load {operand}, ptr %b_ptr, align 1",
        f"  %ones = load {words}, ptr %ones_ptr, align 1",
        f"  %seed = load {acc}, ptr %b_ptr, align 1",
        "  br label %loop",
        "loop:",
        "  %i = phi i32 [ 0, %entry ], [ %i.next, %loop ]",
    ]
    for c in range(chains):
        lines.append(f"  %acc{c} = phi {acc} [ %seed, %entry ], [ %next{c}, %loop ]")
    for c in range(chains):
        step = dot.step_ir.replace("%acc", f"%acc{c}").replace("%next", f"%next{c}")
        for name in ("%signed", "%pairs", "%quads"):
            step = step.replace(name, f"{name}{c}")
        lines.append(f"  {step}")
    lines += [
        "  %i.next = add i32 %i, 1",
        "  %more = icmp slt i32 %i.next, %n",
        "  br i1 %more, label %loop, label %exit",
        "exit:",
        f"  %sum0 = bitcast {acc} %next0 to {acc}",
    ]
    add = "fadd" if dot.precision == "bf16" else "add"
    for c in range(1, chains):
        lines.append(f"  %sum{c} = {add} {acc} %sum{c - 1}, %next{c}")
    lines += [
        "  %dest = getelementptr i8, ptr %out, i32 %out_offset",
        f"  store {acc} %sum{chains - 1}, ptr %dest, align 1",
        "  ret i32 0",
        "}",
        dot.declarations,
    ]
    return "\n".join(lines) + "\n"


def dot_peak_kernel(dot: DotProduct, chains: int, threads: int) -> tvm.tirx.PrimFunc:
    """Each of ``threads`` threads runs :func:`peak_ir`'s loop; ``out[t]`` receives its sum."""
    ir = peak_ir(dot, chains)
    width = dot.operand_bytes

    @T.prim_func
    def dot_peak(
        a: T.Buffer((width,), "int8"),
        b: T.Buffer((width,), "int8"),
        ones: T.Buffer((width,), "int8"),
        out: T.Buffer((threads, width), "int8"),
        iterations: T.int32,
    ):
        T.func_attr({"global_symbol": "dot_peak", "tirx.noalias": True})
        for t in T.parallel(threads):
            with T.attr(T.int32(0), "pragma_import_llvm", ir):
                T.evaluate(
                    T.call_extern(
                        "int32", _FUNCTION, out.data, t * width, a.data, b.data, ones.data, iterations
                    )
                )

    return dot_peak


def compile_dot_peak(dot: DotProduct, target: Any, threads: int, chains: int = DOT_CHAINS) -> Any:
    """:func:`dot_peak_kernel` compiled for a TVM ``target`` (a CPU that has ``dot``'s instructions, to run
    it; any x86 CPU, to build it)."""
    return tvm.compile(tvm.IRModule({"dot_peak": dot_peak_kernel(dot, chains, threads)}), target=target)


def dot_peak_timer(
    dot: DotProduct, target: dict[str, Any], threads: int, repeats: int = REPEATS
) -> Callable[[], float]:
    """:func:`dot_peak_kernel` compiled for ``threads`` threads of this machine: each call times it and
    returns its G operations per second (the compile paid once, outside every timing)."""
    lib = compile_dot_peak(dot, to_tvm_target(target), threads)
    func = lib.mod["dot_peak"]
    width = dot.operand_bytes
    # Small values (bf16 1.0 is 0x3f80; int8 1 and 2): nothing overflows to infinities or NaNs that could
    # slow the bf16 unit, and the integer sums just wrap.
    pattern = np.array([0x80, 0x3F] * (width // 2), dtype=np.uint8) if dot.precision == "bf16" else None
    a = np.ones(width, dtype=np.int8) if pattern is None else pattern.view(np.int8)
    b = np.full(width, 2, dtype=np.int8) if pattern is None else pattern.view(np.int8)
    ones = np.tile(np.array([1, 0], dtype=np.int8), width // 2)  # int16 ones for vpmaddwd
    args = [tvm.runtime.tensor(x) for x in (a, b, ones, np.zeros((threads, width), dtype=np.int8))]
    return rate_timer(func, args, dot.ops_per_step * DOT_CHAINS * threads, repeats)
