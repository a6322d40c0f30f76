"""bf16 matmuls on AVX512-BF16's ``vdpbf16ps``: the weights AMX does not take are packed for it where they
fit, their kernels are tensorized with Kiln's LLVM-IR intrinsic, and compute the matmul in fp32."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kiln_tvm import relax, tvm
from kiln_tvm.x86_amx import BF16
from schedules.vnni import BF16_BLOCK, has_avx512_bf16
from tests.schedule_candidates import sampled_candidates
from tuner.bf16_amx import Bf16AmxReport, pack_for_amx_bf16
from tuner.precision import precision_compute
from tuner.quant.vnni import pack_matmul_weight
from tuner.targets import host_target, to_tvm_target

HOST = to_tvm_target(host_target())
#: A CPU with AVX512-BF16 to build for where this machine has none (the code is built, not run).
BF16_TARGET = (
    HOST if has_avx512_bf16(HOST) else to_tvm_target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
)


def _matmuls(x_rows: int, weights: list[np.ndarray]) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    xs = [
        relax.Var(f"x{i}", relax.TensorType((x_rows, w.shape[0]), "bfloat16")) for i, w in enumerate(weights)
    ]
    with bb.function("main", xs):
        outs = [
            bb.emit(relax.op.matmul(x, relax.const(w, "bfloat16"), out_dtype="float32"))
            for x, w in zip(xs, weights, strict=True)
        ]
        bb.emit_func_output(relax.Tuple(outs) if len(outs) > 1 else outs[0])
    return bb.get()


def _packed_kernel(mod: tvm.IRModule) -> tvm.IRModule:
    lowered = relax.get_pipeline("zero")(pack_for_amx_bf16(Bf16AmxReport(amx=False, dot=True))(mod))
    (func,) = [
        f for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc) and BF16_BLOCK in f.script()
    ]
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def test_the_weights_that_fit_16_columns_by_pairs_are_packed_and_the_others_say_why() -> None:
    rng = np.random.default_rng(4)
    fits = rng.standard_normal((64, 32)).astype(ml_dtypes.bfloat16)
    narrow = rng.standard_normal((64, 10)).astype(ml_dtypes.bfloat16)
    report = Bf16AmxReport(amx=False, dot=True)
    pack_for_amx_bf16(report)(_matmuls(4, [fits, narrow]))
    assert report.packed == [] and report.dot_packed == ["matmul 4x64 @ 64x32"]
    assert report.unpacked == ["matmul 4x64 @ 64x10: 10 columns, 64 deep (vdpbf16ps: multiples of 16, 2)"]
    # Which the job then calls mixed, and native when all of them are on the instruction.
    zen4 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
    assert precision_compute("bf16", zen4, reduced=2, on_dot=1).mode == "mixed"
    native = precision_compute("bf16", zen4, reduced=1, on_dot=1)
    assert native.mode == "native" and "vdpbf16ps" in native.note


@pytest.mark.parametrize("shape", [(4, 64, 32), (3, 96, 48)])
def test_vdpbf16ps_candidates_compute_the_matmul_with_fp32_accumulation(shape: tuple[int, int, int]) -> None:
    rows, depth, cols = shape  # rows that are no multiple of 16: AMX does not take them
    rng = np.random.default_rng(5)
    data = rng.standard_normal((rows, depth)).astype(ml_dtypes.bfloat16)
    weight = rng.standard_normal((depth, cols)).astype(ml_dtypes.bfloat16)
    # Products of bf16 values are exact in fp32; only the order of the fp32 sums differs.
    expected = data.astype(np.float64) @ weight.astype(np.float64)
    kernel = _packed_kernel(_matmuls(rows, [weight]))
    for attempt, candidate in enumerate(sampled_candidates(kernel, BF16_TARGET, 3)):
        assert "kiln_dpbf16ps_16x2" in candidate.mod.script()
        lib = tvm.compile(candidate.mod, target=BF16_TARGET)
        asm = lib.mod.inspect_source("asm")
        assert "vdpbf16ps" in asm and "kiln_dpbf16ps_16x2" not in asm  # inlined: no call remains
        if BF16_TARGET is not HOST:
            continue  # built, not run: this CPU has no AVX512-BF16
        out = tvm.runtime.tensor(np.zeros(expected.shape, np.float32))
        lib(tvm.runtime.tensor(data), tvm.runtime.tensor(pack_matmul_weight(weight, BF16.pair)), out)
        np.testing.assert_allclose(
            out.numpy(), expected, rtol=1e-5, atol=1e-4, err_msg=f"candidate {attempt}"
        )
