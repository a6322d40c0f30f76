"""bf16 matmuls and convolutions on AVX512-BF16's ``vdpbf16ps``: the weights AMX does not take are packed
for it where they fit, their kernels are tensorized with Kiln's LLVM-IR intrinsic, and compute the
operator in fp32."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kiln_tvm import relax, tvm
from kiln_tvm.x86_amx import BF16
from schedules.vnni import BF16_BLOCK, has_avx512_bf16
from tests.schedule_candidates import sampled_candidates
from tuner.passes.bf16_packing import Bf16AmxReport, pack_for_amx_bf16
from tuner.passes.int8_packing import pack_conv_weight, pack_matmul_weight
from tuner.passes.precision import precision_compute
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


def _convolutions(data_shape: tuple[int, ...], weights: list[np.ndarray], **conv: object) -> tvm.IRModule:
    """NHWC x OHWI bf16 convolutions of one input, fp32 out."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(data_shape, "bfloat16"))
    with bb.function("main", [x]):
        outs = [
            bb.emit(
                relax.op.nn.conv2d(
                    x,
                    relax.const(w, "bfloat16"),
                    data_layout="NHWC",
                    kernel_layout="OHWI",
                    out_dtype="float32",
                    **conv,
                )
            )
            for w in weights
        ]
        bb.emit_func_output(relax.Tuple(outs) if len(outs) > 1 else outs[0])
    return bb.get()


def _packed_kernel(mod: tvm.IRModule, report: Bf16AmxReport | None = None) -> tvm.IRModule:
    pass_ = pack_for_amx_bf16(report or Bf16AmxReport(amx=False, dot=True))
    lowered = relax.get_pipeline("zero")(pass_(mod))
    (func,) = [
        f for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc) and BF16_BLOCK in f.script()
    ]
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def _checked_candidates(kernel: tvm.IRModule, args: list[np.ndarray], expected: np.ndarray) -> None:
    """Three sampled candidates of ``kernel`` hold ``vdpbf16ps`` (inlined) and, on a CPU with it, compute
    ``expected`` (products of bf16 values are exact in fp32: only the order of the sums differs)."""
    for attempt, candidate in enumerate(sampled_candidates(kernel, BF16_TARGET, 3)):
        assert "kiln_dpbf16ps_16x2" in candidate.mod.script()
        lib = tvm.compile(candidate.mod, target=BF16_TARGET)
        asm = lib.mod.inspect_source("asm")
        assert "vdpbf16ps" in asm and "kiln_dpbf16ps_16x2" not in asm  # inlined: no call remains
        if BF16_TARGET is not HOST:
            continue  # built only: the skip below says why
        out = tvm.runtime.tensor(np.zeros(expected.shape, np.float32))
        lib(*(tvm.runtime.tensor(a) for a in args), out)
        np.testing.assert_allclose(
            out.numpy(), expected, rtol=1e-5, atol=1e-4, err_msg=f"candidate {attempt}"
        )
    if BF16_TARGET is not HOST:
        pytest.skip("the candidates built and hold vdpbf16ps, but this CPU has no AVX512-BF16 to run them")


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
    expected = data.astype(np.float64) @ weight.astype(np.float64)
    packed = pack_matmul_weight(weight, BF16.pair)
    _checked_candidates(_packed_kernel(_matmuls(rows, [weight])), [data, packed], expected)


def _conv_reference(padded: np.ndarray, kernel: np.ndarray, stride: int) -> np.ndarray:
    """NHWC x OHWI convolution of an already padded input, in float64."""
    o, kh, kw, _ = kernel.shape
    out_h, out_w = (padded.shape[1] - kh) // stride + 1, (padded.shape[2] - kw) // stride + 1
    expected = np.zeros((padded.shape[0], out_h, out_w, o))
    for h in range(out_h):
        for w in range(out_w):
            window = padded[:, h * stride : h * stride + kh, w * stride : w * stride + kw, :]
            expected[:, h, w] = np.einsum(
                "bijc,oijc->bo", window.astype(np.float64), kernel.astype(np.float64)
            )
    return expected


def test_convolutions_with_16_output_channels_are_packed_odd_channels_filled_and_the_others_say_why() -> None:
    rng = np.random.default_rng(6)
    fits = rng.standard_normal((32, 3, 3, 3)).astype(ml_dtypes.bfloat16)  # 3 channels: one zero channel added
    narrow = rng.standard_normal((10, 1, 1, 3)).astype(ml_dtypes.bfloat16)
    report = Bf16AmxReport(amx=False, dot=True)
    packed_mod = pack_for_amx_bf16(report)(_convolutions((1, 8, 8, 3), [fits, narrow], padding=[1, 1, 1, 1]))
    assert report.dot_convolutions == ["conv2d 1x8x8x3 * 32x3x3x3"] and report.dot_packed == []
    assert report.unpacked == ["conv2d 1x8x8x3 * 10x1x1x3: 10 output channels (vdpbf16ps: a multiple of 16)"]
    # The input is padded by the convolution's border and the filled channel, in a kernel of its own.
    pads = [c for c in _calls(packed_mod) if c.op.name == "relax.nn.pad"]
    assert [int(w) for w in pads[0].attrs.pad_width] == [0, 0, 1, 1, 1, 1, 0, 1]
    packed = pack_conv_weight(np.pad(fits, [(0, 0)] * 3 + [(0, 1)]), 16, 2)
    assert packed.shape == (2, 3, 3, 2, 16, 2) and packed[1, 2, 0, 1, 5, 0] == fits[21, 2, 0, 2]
    assert packed[1, 2, 0, 1, 5, 1] == 0  # the filled channel
    # Without AVX512-BF16 (an AMX-BF16 CPU without it has no such kernel), convolutions stay as they were.
    amx_only = Bf16AmxReport(amx=True, dot=False)
    pack_for_amx_bf16(amx_only)(_convolutions((1, 8, 8, 3), [fits]))
    assert amx_only.dot_convolutions == [] and amx_only.unpacked == []


@pytest.mark.parametrize(("channels", "stride"), [(16, 1), (5, 2)])
def test_vdpbf16ps_candidates_compute_the_convolution_with_fp32_accumulation(
    channels: int, stride: int
) -> None:
    rng = np.random.default_rng(7)
    data = rng.standard_normal((1, 9, 9, channels)).astype(ml_dtypes.bfloat16)
    weight = rng.standard_normal((32, 3, 3, channels)).astype(ml_dtypes.bfloat16)
    kernel = _packed_kernel(_convolutions(data.shape, [weight], strides=[stride, stride]))
    # The kernel reads an input padded already: here only by the filled channel of an odd count.
    extra = channels % 2
    padded = np.pad(data, [(0, 0)] * 3 + [(0, extra)])
    packed = pack_conv_weight(np.pad(weight, [(0, 0)] * 3 + [(0, extra)]), 16, 2)
    _checked_candidates(kernel, [padded, packed], _conv_reference(data, weight, stride))


def _calls(mod: tvm.IRModule) -> list[relax.Call]:
    found: list[relax.Call] = []
    relax.analysis.post_order_visit(
        mod["main"],
        lambda e: found.append(e) if isinstance(e, relax.Call) and hasattr(e.op, "name") else None,
    )
    return found
