"""What a kernel is, read from its TIR: whether it contracts two operands (a matmul or a convolution),
over how many elements, and how many FLOP it does per byte of its arguments."""

from __future__ import annotations

from typing import Any

from kiln_tvm import estimate_flops, ms, normalize_prim_func, s_tir, tvm

REDUCTION_ITER = 2  # tirx IterVar.CommReduce
#: A contraction at least this deep is GEMM-like: each loaded element feeds enough FMAs to be
#: compute-bound. A 3x3 depthwise convolution (depth 9) or a 3-channel stem (27) is bound by memory.
GEMM_MIN_DEPTH = 32
#: ... and its arguments must each be reused: a matrix-vector product (0.5 FLOP per byte) streams its
#: matrix once and is bound by memory however deep it is.
GEMM_MIN_INTENSITY = 4.0


def contraction_depth(func: Any) -> int:
    """The deepest reduction of ``func`` over two operands (a matmul's ``C += A * B``, a convolution's
    ``out += data * weight``): the product of its reduction extents; 0 when no block contracts two inputs.

    An input read at a point that does not move with the reduction (layer norm's mean, in its variance)
    is a broadcast, not a second operand. A symbolic extent counts as deep.
    """
    sch = s_tir.Schedule(func)
    deepest = 0
    for info in normalize_prim_func(sch) or []:
        if info.is_injective():
            continue
        block = sch.get(info.block_rv)
        reduce_iters = [iv for iv in block.iter_vars if int(iv.iter_type) == REDUCTION_ITER]
        reduce_vars = [iv.var for iv in reduce_iters]
        written = [w.source for w in block.writes]
        operands: list[Any] = []
        for read in block.reads:
            if any(read.source.same_as(b) for b in written + operands):
                continue
            used = [v for rng in read.region for v in tvm.tirx.analysis.undefined_vars(rng.min)]
            if any(u.same_as(r) for u in used for r in reduce_vars):
                operands.append(read.source)
        if len(operands) >= 2:
            depth = 1
            for iv in reduce_iters:
                extent = iv.dom.extent
                depth *= int(extent) if isinstance(extent, tvm.tirx.IntImm) else GEMM_MIN_DEPTH
            deepest = max(deepest, depth)
    return deepest


def argument_bytes(func: Any) -> int:
    """Bytes of ``func``'s tensor arguments (inputs and outputs), each counted once; symbolic shapes
    count as 0."""
    total = 0
    for arg in ms.arg_info.ArgInfo.from_prim_func(func):
        shape = getattr(arg, "shape", None)
        if shape is None:  # a scalar argument
            continue
        elements = 1
        for dim in shape:
            if not isinstance(dim, int | tvm.tirx.IntImm):
                return 0
            elements *= int(dim)
        total += elements * tvm.runtime.DataType(str(arg.dtype)).bits // 8
    return total


def kernel_precision(func: Any) -> str | None:
    """What a kernel computes in, read from its tensor arguments' dtypes: "bf16" with a bfloat16 argument,
    "int8" with an 8-bit integer one (a quantized operator's), "fp32" when all are float32, else None
    (fp16, index or mixed kernels: no roof of their own). Each precision has its own compute roof
    (:meth:`tuner.entities.MachineLimits.peak_for`)."""
    dtypes = {str(arg.dtype) for arg in ms.arg_info.ArgInfo.from_prim_func(func)}
    if "bfloat16" in dtypes:
        return "bf16"
    if dtypes & {"int8", "uint8"}:
        return "int8"
    if dtypes == {"float32"}:
        return "fp32"
    return None


def arithmetic_intensity(func: Any) -> float | None:
    """FLOP (TVM's estimate) per byte of the arguments; None when either is unknown."""
    flop = estimate_flops(tvm.IRModule({"main": func}))
    moved = argument_bytes(func)
    return flop / moved if flop and moved else None


def is_gemm_like(func: Any) -> bool:
    """Whether ``func`` is a matmul, dense or convolution that can be compute-bound: deep enough, and
    reusing its arguments."""
    intensity = arithmetic_intensity(func)
    return contraction_depth(func) >= GEMM_MIN_DEPTH and (
        intensity is None or intensity >= GEMM_MIN_INTENSITY
    )
