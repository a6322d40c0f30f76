"""Attention's matmuls of two computed operands (``Q @ K^T``, ``P @ V``) under the bf16 policy: the second
operand packed as the model runs (a reshape and a transpose, fused with the layout operators before it),
the matmul on AMX tiles (or on ``vdpbf16ps`` when asked). The same packing and matmul serve both: what they compute is checked on the plain build and on the
``vdpbf16ps`` candidates where the CPU has AVX512-BF16; the AMX code is built, and run only on AMX."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kiln_tvm import relax, tvm
from kiln_tvm.x86_amx import request_amx_permission
from schedules.amx import has_amx_bf16
from schedules.vnni import PACKED_BLOCKS, has_avx512_bf16
from tests.schedule_candidates import sampled_candidates
from tuner.compile import LoadedModel, build_untuned
from tuner.passes.bf16_packing import Bf16AmxReport, pack_for_amx_bf16
from tuner.passes.int8_packing import pack_matmul_weight
from tuner.targets import host_target, to_tvm_target

HOST = to_tvm_target(host_target())
ZEN4 = HOST if has_avx512_bf16(HOST) else to_tvm_target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
AMX = (
    HOST if has_amx_bf16(HOST) else to_tvm_target({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2})
)
HEADS, SEQ, DIM = 4, 32, 64


def _scores() -> tvm.IRModule:
    """``Q @ K^T`` per head: [1, 4, 32, 64] @ [1, 4, 64, 32] in bf16, fp32 results."""
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((1, HEADS, SEQ, DIM), "bfloat16"))
    k = relax.Var("k", relax.TensorType((1, HEADS, SEQ, DIM), "bfloat16"))
    with bb.function("main", [q, k]):
        with bb.dataflow():  # as imported models are: FuseOps fuses within dataflow blocks only
            kt = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))
            scores = bb.emit_output(relax.op.matmul(q, kt, out_dtype="float32"))
        bb.emit_func_output(scores)
    return bb.get()


def _operands() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(12)
    q = rng.standard_normal((1, HEADS, SEQ, DIM)).astype(ml_dtypes.bfloat16)
    k = rng.standard_normal((1, HEADS, SEQ, DIM)).astype(ml_dtypes.bfloat16)
    # Products of bf16 values are exact in fp32: only the order of the fp32 sums differs.
    return q, k, q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2)


def _kernel(report: Bf16AmxReport) -> tvm.IRModule:
    lowered = relax.get_pipeline("zero")(pack_for_amx_bf16(report)(_scores()))
    (func,) = [
        f
        for f in lowered.functions.values()
        if isinstance(f, tvm.tirx.PrimFunc) and any(mark in f.script() for mark in PACKED_BLOCKS)
    ]
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def _packed_keys(k: np.ndarray) -> np.ndarray:
    kt = k.transpose(0, 1, 3, 2)
    return np.stack([pack_matmul_weight(np.ascontiguousarray(kt[0, h]), 2) for h in range(HEADS)])[None]


def test_a_matmul_of_computed_operands_is_packed_as_it_runs_and_computes_the_matmul() -> None:
    report = Bf16AmxReport(amx=False, dot=True, dot_activations=True)
    packed = pack_for_amx_bf16(report)(_scores())
    assert report.dot_packed == ["matmul 1x4x32x64 @ 1x4x64x32 (packed as it runs)"] and not report.unpacked
    # The packing fuses with the transpose of K before it: one layout kernel, then the matmul.
    lowered = relax.get_pipeline("zero")(packed)
    kernels = [g.name_hint for g, f in lowered.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(kernels) == 2, kernels
    (layout,) = [name for name in kernels if "matmul" not in name]
    assert layout == "fused_transpose_reshape_transpose1", kernels  # K^T, then the packing
    q, k, expected = _operands()
    (got,) = LoadedModel(build_untuned(packed, HOST)).run([q, k])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


def test_without_amx_they_stay_widened_unless_asked_and_say_why() -> None:
    report = Bf16AmxReport(amx=False, dot=True)
    pack_for_amx_bf16(report)(_scores())
    (why,) = report.unpacked
    assert why.startswith("matmul 1x4x32x64 @ 1x4x64x32: two computed operands go on AMX tiles only")
    assert not report.dot_packed


def test_operands_whose_batches_differ_are_left_as_they_were() -> None:
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((1, HEADS, SEQ, DIM), "bfloat16"))
    k = relax.Var("k", relax.TensorType((1, 1, DIM, SEQ), "bfloat16"))
    with bb.function("main", [q, k]):
        bb.emit_func_output(bb.emit(relax.op.matmul(q, k, out_dtype="float32")))
    report = Bf16AmxReport(amx=False, dot=True, dot_activations=True)
    pack_for_amx_bf16(report)(bb.get())
    assert report.unpacked == [
        "matmul 1x4x32x64 @ 1x1x64x32: its operands' batch dimensions differ (a broadcast)"
    ]


def test_vdpbf16ps_candidates_compute_the_scores() -> None:
    kernel = _kernel(Bf16AmxReport(amx=False, dot=True, dot_activations=True))
    candidates = sampled_candidates(kernel, ZEN4, 2)
    assert all("kiln_dpbf16ps" in c.mod.script() for c in candidates)
    if not has_avx512_bf16(HOST):
        pytest.skip("this CPU has no AVX512-BF16: the vdpbf16ps candidates were built, not run")
    q, k, expected = _operands()
    for attempt, candidate in enumerate(candidates):
        lib = tvm.compile(candidate.mod, target=HOST)
        out = tvm.runtime.tensor(np.zeros(expected.shape, np.float32))
        lib(tvm.runtime.tensor(q), tvm.runtime.tensor(_packed_keys(k)), out)
        np.testing.assert_allclose(
            out.numpy(), expected, rtol=1e-5, atol=1e-4, err_msg=f"candidate {attempt}"
        )


def test_on_an_amx_cpu_whole_blocks_go_on_tdpbf16ps() -> None:
    report = Bf16AmxReport(amx=True, dot=True)
    pack_for_amx_bf16(report)(_scores())
    assert report.packed == ["matmul 1x4x32x64 @ 1x4x64x32 (packed as it runs)"] and not report.dot_packed
    (candidate,) = sampled_candidates(_kernel(report), AMX, 1)
    assert "llvm.x86.tdpbf16ps" in candidate.mod.script()
    assert "tdpbf16ps" in tvm.compile(candidate.mod, target=AMX).mod.inspect_source("asm")


@pytest.mark.skipif(not has_amx_bf16(HOST), reason="this CPU has no AMX-BF16: built, not run")
def test_amx_candidates_compute_the_scores() -> None:
    assert request_amx_permission()
    q, k, expected = _operands()
    for attempt, candidate in enumerate(
        sampled_candidates(_kernel(Bf16AmxReport(amx=True, dot=True)), HOST, 3)
    ):
        lib = tvm.compile(candidate.mod, target=HOST)
        out = tvm.runtime.tensor(np.zeros(expected.shape, np.float32))
        lib(tvm.runtime.tensor(q), tvm.runtime.tensor(_packed_keys(k)), out)
        np.testing.assert_allclose(
            out.numpy(), expected, rtol=1e-5, atol=1e-4, err_msg=f"candidate {attempt}"
        )
