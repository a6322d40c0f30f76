"""Matmuls on Intel AMX tiles: the packed int8 and bf16 matmuls AMX serves are tiled onto Kiln's
``tdpbusd``/``tdpbf16ps`` intrinsics and compute what the operator does; the rest stays on VNNI or on
plain kernels."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kiln_tvm import relax, tvm
from kiln_tvm.x86_amx import BF16, INT8, amx_intrinsic_name, request_amx_permission
from schedules.amx import amx_blocks, has_amx_bf16, has_amx_int8
from schedules.vnni import PACKED_BLOCKS
from tests.schedule_candidates import sampled_candidates
from tuner.passes.bf16_packing import Bf16AmxReport, pack_for_amx_bf16
from tuner.passes.int8_packing import pack_for_vnni, pack_matmul_weight
from tuner.targets import host_target, to_tvm_target

HOST = to_tvm_target(host_target())
#: An AMX CPU to build for where this machine has none (the code is built, not run).
AMX_TARGET = (
    HOST if has_amx_int8(HOST) else to_tvm_target({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2})
)
runs_amx = pytest.mark.skipif(not has_amx_int8(HOST), reason="this CPU has no AMX-INT8: built, not run")
runs_amx_bf16 = pytest.mark.skipif(not has_amx_bf16(HOST), reason="this CPU has no AMX-BF16: built, not run")


def _matmul_graph(
    rows: int, depth: int, cols: int, weight: np.ndarray | None = None, dtype: str = "int8"
) -> tvm.IRModule:
    """``x[rows, depth] @ W[depth, cols]``: u8 x s8 -> int32 (``dtype`` int8) or bf16 x bf16 -> fp32."""
    x_dtype, out = ("uint8", "int32") if dtype == "int8" else ("bfloat16", "float32")
    weight = weight if weight is not None else np.ones((depth, cols), np.int8)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, depth), x_dtype))
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.matmul(x, relax.const(weight, dtype), out_dtype=out)))
    return bb.get()


def _packed_kernel(mod: tvm.IRModule, bf16: bool = False) -> tvm.IRModule:
    packed = pack_for_amx_bf16()(mod) if bf16 else pack_for_vnni()(mod)
    lowered = relax.get_pipeline("zero")(packed)
    (func,) = [
        f
        for f in lowered.functions.values()
        if isinstance(f, tvm.tirx.PrimFunc) and any(mark in f.script() for mark in PACKED_BLOCKS)
    ]
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def test_blocks_take_the_deepest_reduction_and_the_rows_that_fit() -> None:
    assert amx_blocks(INT8, 64, 512) == [(2, 8), (1, 8)]
    assert amx_blocks(INT8, 48, 192) == [(1, 1)]  # 3 reduction tiles: only depth 1 divides
    assert amx_blocks(INT8, 32, 4096) == [(2, 16), (1, 16)]
    assert amx_blocks(BF16, 32, 512) == [(2, 16), (1, 16)]  # 32 bf16 per tile row


@pytest.mark.slow
def test_packed_matmuls_go_on_amx_tiles_and_their_code_uses_tdpbusd() -> None:
    kernel = _packed_kernel(_matmul_graph(32, 128, 64))
    (candidate,) = sampled_candidates(kernel, AMX_TARGET, 1)
    script = candidate.mod.script()
    assert "llvm.x86.tdpbusd" in script and "vpdpbusd" not in script
    assert any(amx_intrinsic_name(INT8, rows, 2, 2) in str(candidate.trace) for rows in (1, 2))
    asm = tvm.compile(candidate.mod, target=AMX_TARGET).mod.inspect_source("asm")
    assert "tdpbusd" in asm and "ldtilecfg" in asm


def test_what_amx_cannot_serve_stays_on_vnni() -> None:
    # 8 rows: less than one tile; the VNNI rule tensorizes it instead.
    (candidate,) = sampled_candidates(_packed_kernel(_matmul_graph(8, 128, 64)), AMX_TARGET, 1)
    script = candidate.mod.script()
    assert "vpdpbusd" in script and "tdpbusd" not in script


@runs_amx
@pytest.mark.parametrize("shape", [(32, 256, 64), (48, 192, 96), (2 * 64, 1024, 32)])
def test_amx_candidates_compute_the_integer_matmul_exactly(shape: tuple[int, int, int]) -> None:
    assert request_amx_permission()
    rows, depth, cols = shape
    rng = np.random.default_rng(5)
    data = rng.integers(0, 256, (rows, depth), dtype=np.uint8)
    weight = rng.integers(-128, 128, (depth, cols), dtype=np.int8)
    expected = data.astype(np.int32) @ weight.astype(np.int32)
    kernel = _packed_kernel(_matmul_graph(rows, depth, cols, weight))
    for attempt, candidate in enumerate(sampled_candidates(kernel, HOST, 3)):
        assert "llvm.x86.tdpbusd" in candidate.mod.script()
        lib = tvm.compile(candidate.mod, target=HOST)
        out = tvm.runtime.tensor(np.zeros(expected.shape, np.int32))
        lib(tvm.runtime.tensor(data), tvm.runtime.tensor(pack_matmul_weight(weight)), out)
        np.testing.assert_array_equal(out.numpy(), expected, f"candidate {attempt}")


def test_bf16_matmuls_that_fit_are_packed_and_go_on_tdpbf16ps() -> None:
    report = Bf16AmxReport()
    weight = np.ones((64, 32), np.float32).astype(ml_dtypes.bfloat16)
    mod = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((32, 64), "bfloat16"))
    y = relax.Var("y", relax.TensorType((4, 64), "bfloat16"))
    with mod.function("main", [x, y]):
        fits = mod.emit(relax.op.matmul(x, relax.const(weight, "bfloat16"), out_dtype="float32"))
        short = mod.emit(relax.op.matmul(y, relax.const(weight, "bfloat16"), out_dtype="float32"))
        mod.emit_func_output(relax.Tuple([fits, short]))
    pack_for_amx_bf16(report)(mod.get())
    assert report.packed == ["matmul 32x64 @ 64x32"]
    assert report.unpacked == ["matmul 4x64 @ 64x32: not whole 16-row x 32-column x 32-deep AMX blocks"]

    kernel = _packed_kernel(_matmul_graph(32, 64, 32, weight, "bfloat16"), bf16=True)
    (candidate,) = sampled_candidates(kernel, AMX_TARGET, 1)
    assert "llvm.x86.tdpbf16ps" in candidate.mod.script()
    asm = tvm.compile(candidate.mod, target=AMX_TARGET).mod.inspect_source("asm")
    assert "tdpbf16ps" in asm


@runs_amx_bf16
@pytest.mark.parametrize("shape", [(32, 256, 64), (48, 96, 96)])
def test_amx_bf16_candidates_compute_the_matmul_with_fp32_accumulation(shape: tuple[int, int, int]) -> None:
    assert request_amx_permission()
    rows, depth, cols = shape
    rng = np.random.default_rng(6)
    data = rng.standard_normal((rows, depth)).astype(ml_dtypes.bfloat16)
    weight = rng.standard_normal((depth, cols)).astype(ml_dtypes.bfloat16)
    # Products of bf16 values are exact in fp32; only the order of the fp32 sums differs.
    expected = data.astype(np.float64) @ weight.astype(np.float64)
    kernel = _packed_kernel(_matmul_graph(rows, depth, cols, weight, "bfloat16"), bf16=True)
    for attempt, candidate in enumerate(sampled_candidates(kernel, HOST, 3)):
        assert "llvm.x86.tdpbf16ps" in candidate.mod.script()
        lib = tvm.compile(candidate.mod, target=HOST)
        out = tvm.runtime.tensor(np.zeros(expected.shape, np.float32))
        lib(tvm.runtime.tensor(data), tvm.runtime.tensor(pack_matmul_weight(weight, BF16.pair)), out)
        np.testing.assert_allclose(
            out.numpy(), expected, rtol=1e-5, atol=1e-4, err_msg=f"candidate {attempt}"
        )
