"""Convolutions on Intel AMX tiles, bf16 and int8: a pointwise (1x1) one whose pixels and channels are whole
AMX blocks becomes the AMX matmul of its (strided) pixels by its channels; a windowed stride-1 one whose
channels are becomes an implicit GEMM over its flattened padded input (tuner.passes.windowed_gemm). What the
rewrites compute is checked here on any CPU (the packed kernels built plainly, the bit-exact reference
path: the same packing, the same bf16 or 8-bit operands, fp32 or int32 sums; on a VNNI CPU the int8
implicit GEMM also tensorized with vpdpbusd); the tile code is built for an AMX CPU everywhere and run
only on one."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest

from kiln_tvm import relax, tvm
from kiln_tvm.x86_amx import BF16, request_amx_permission
from schedules.amx import has_amx_bf16, has_amx_int8
from schedules.vnni import PACKED_BLOCKS, has_avx512_bf16, has_vnni
from tests.artifacts import onnxruntime_output
from tests.model_builders import build_bottleneck
from tests.quant_models import output_step, quantized_by_onnxruntime, reference_output
from tests.schedule_candidates import sampled_candidates
from tuner.compile import LoadedModel, build_untuned
from tuner.entities import PlanningOptions
from tuner.frontend import load_model
from tuner.passes.bf16_packing import Bf16AmxReport, pack_for_amx_bf16
from tuner.passes.int8_packing import VnniReport, pack_for_vnni, pack_matmul_weight
from tuner.passes.plan import plan_graph
from tuner.passes.windowed_gemm import pack_windowed_weight
from tuner.targets import host_target, to_tvm_target

HOST = to_tvm_target(host_target())
AMX_TARGET = (
    HOST if has_amx_bf16(HOST) else to_tvm_target({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2})
)
runs_amx_bf16 = pytest.mark.skipif(not has_amx_bf16(HOST), reason="this CPU has no AMX-BF16: built, not run")

#: (input pixels, input channels, output channels, kernel size, stride, padding) of each convolution.
CONVOLUTIONS = [
    ((16, 16), 64, 64, 1, 1, 0),  # 256 pixels: AMX
    ((16, 16), 64, 32, 1, 2, 0),  # strided: 64 pixels, AMX
    ((7, 7), 64, 64, 1, 1, 0),  # 49 pixels: no whole tile of 16
    ((16, 16), 64, 32, 3, 1, 1),  # a padded window: bf16 implicit GEMM (int8 comes padded: not this one)
    ((9, 9), 64, 32, 3, 1, 0),  # an unpadded window, as QDQ lowering leaves int8 ones: implicit GEMM
    ((7, 7), 64, 64, 3, 1, 1),  # 81 flat rows of 49 pixels, computed as 96
    ((8, 8), 64, 32, 3, 2, 1),  # strided window: bf16 space-to-depth, a 2x2 window over 256 channels
    ((9, 9), 64, 32, 3, 2, 0),  # unpadded, odd: one zero row and column to whole strides
]
#: What the passes make of them: bf16 (AMX) and int8 (AMX).
BF16_ON_TILES = [
    "conv2d 1x16x16x64 * 64x1x1x64 as matmul 256x64 @ 64x64",
    "conv2d 1x16x16x64 * 32x1x1x64 as matmul 64x64 @ 64x32",
    "conv2d 1x16x16x64 * 32x3x3x64 as implicit GEMM 352x576 @ 576x32",
    "conv2d 1x9x9x64 * 32x3x3x64 as implicit GEMM 96x576 @ 576x32",
    "conv2d 1x7x7x64 * 64x3x3x64 as implicit GEMM 96x576 @ 576x64",
    "conv2d 1x8x8x64 * 32x3x3x64 as implicit GEMM 32x1024 @ 1024x32 (space-to-depth 2)",
    "conv2d 1x9x9x64 * 32x3x3x64 as implicit GEMM 32x1024 @ 1024x32 (space-to-depth 2)",
]
INT8_ON_TILES = {
    "conv2d 1x16x16x64 * 64x1x1x64 as matmul 256x64 @ 64x64": (256, 64, 64),
    "conv2d 1x16x16x64 * 32x1x1x64 as matmul 64x64 @ 64x32": (64, 32, 64),
    "conv2d 1x9x9x64 * 32x3x3x64 as implicit GEMM 96x576 @ 576x32": (96, 32, 576),
    "conv2d 1x9x9x64 * 32x3x3x64 as implicit GEMM 32x1024 @ 1024x32 (space-to-depth 2)": (32, 32, 1024),
}


def _operands(rng: np.random.Generator, dtype: str, data: tuple[int, ...], weight: tuple[int, ...]) -> tuple:
    """An input and a weight of ``dtype``'s convolution: bf16 (scaled to unit outputs) or u8 x s8."""
    if dtype == "int8":
        return rng.integers(0, 256, data, dtype=np.uint8), rng.integers(-128, 128, weight, dtype=np.int8)
    fan_in = float(np.prod(weight[1:]))
    x, w = rng.standard_normal(data), rng.standard_normal(weight) / np.sqrt(fan_in)
    return x.astype(ml_dtypes.bfloat16), w.astype(ml_dtypes.bfloat16)


def _convolutions(dtype: str = "bf16") -> tuple[tvm.IRModule, list[np.ndarray], list[np.ndarray]]:
    """One NHWC convolution of each :data:`CONVOLUTIONS`, its inputs and weights (OHWI): bf16 operands with
    fp32 results, or (``dtype`` int8) u8 x s8 with int32 results, as QDQ lowering leaves them."""
    x_dtype, w_dtype, out_dtype = (
        ("uint8", "int8", "int32") if dtype == "int8" else ("bfloat16",) * 2 + ("float32",)
    )
    rng = np.random.default_rng(4)
    bb = relax.BlockBuilder()
    params, inputs, weights, outputs = [], [], [], []
    for index, ((h, w), c, o, k, *_) in enumerate(CONVOLUTIONS):
        params.append(relax.Var(f"x{index}", relax.TensorType((1, h, w, c), x_dtype)))
        x, weight = _operands(rng, dtype, (1, h, w, c), (o, k, k, c))
        inputs.append(x)
        weights.append(weight)
    with bb.function("main", params):
        for index, (*_, s, pad) in enumerate(CONVOLUTIONS):
            conv = relax.op.nn.conv2d(
                params[index],
                relax.const(weights[index], w_dtype),
                strides=[s, s],
                padding=[pad] * 4,
                data_layout="NHWC",
                kernel_layout="OHWI",
                out_dtype=out_dtype,
            )
            outputs.append(bb.emit(conv))
        bb.emit_func_output(relax.Tuple(outputs))
    return bb.get(), inputs, weights


def _reference(x: np.ndarray, weight: np.ndarray, stride: int, pad: int) -> np.ndarray:
    """The convolution on the bf16 values in float64 (products of bf16 values are exact in fp32)."""
    o, k, _, c = weight.shape
    data = np.pad(x.astype(np.float64), [(0, 0), (pad, pad), (pad, pad), (0, 0)])
    _, hp, wp, _ = data.shape
    out_h, out_w = (hp - k) // stride + 1, (wp - k) // stride + 1
    out = np.zeros((1, out_h, out_w, o))
    for i in range(k):
        for j in range(k):
            window = data[:, i : i + stride * out_h : stride, j : j + stride * out_w : stride, :]
            out += window @ weight[:, i, j, :].astype(np.float64).T
    return out


def test_convolutions_of_whole_blocks_go_on_amx_as_matmuls_or_implicit_gemms() -> None:
    mod, _, _ = _convolutions()
    report = Bf16AmxReport(amx=True, dot=True)
    pack_for_amx_bf16(report)(mod)
    assert report.packed == BF16_ON_TILES
    # The 49-pixel pointwise one stays a convolution, on vdpbf16ps.
    assert report.dot_convolutions == ["conv2d 1x7x7x64 * 64x1x1x64"]


def test_the_rewritten_convolutions_compute_the_convolutions_on_their_bf16_operands() -> None:
    """The packed kernels built plainly (no tile instruction): the rewrite's strides, reshapes and packing
    against the convolutions themselves."""
    mod, inputs, weights = _convolutions()
    packed = pack_for_amx_bf16(Bf16AmxReport(amx=True, dot=True))(mod)
    got = LoadedModel(build_untuned(packed, HOST)).run(inputs)
    for index, (*_, stride, pad) in enumerate(CONVOLUTIONS):
        want = _reference(inputs[index], weights[index], stride, pad)
        assert got[index].shape == want.shape
        np.testing.assert_allclose(got[index], want, rtol=1e-5, atol=1e-5, err_msg=f"convolution {index}")


def _pointwise_kernel() -> tvm.IRModule:
    mod, _, _ = _convolutions()
    lowered = relax.get_pipeline("zero")(pack_for_amx_bf16(Bf16AmxReport(amx=True, dot=False))(mod))
    kernels = [
        f
        for f in lowered.functions.values()
        if isinstance(f, tvm.tirx.PrimFunc) and any(mark in f.script() for mark in PACKED_BLOCKS)
    ]
    assert len(kernels) == len(BF16_ON_TILES)
    return tvm.IRModule({"main": kernels[0].with_attr("global_symbol", "main")})


def test_a_pointwise_convolutions_matmul_goes_on_tdpbf16ps() -> None:
    (candidate,) = sampled_candidates(_pointwise_kernel(), AMX_TARGET, 1)
    assert "llvm.x86.tdpbf16ps" in candidate.mod.script()
    assert "tdpbf16ps" in tvm.compile(candidate.mod, target=AMX_TARGET).mod.inspect_source("asm")


@runs_amx_bf16
def test_amx_candidates_of_a_pointwise_convolution_compute_it() -> None:
    assert request_amx_permission()
    _, inputs, weights = _convolutions()
    pixels = inputs[0].reshape(256, 64)
    weight = np.ascontiguousarray(weights[0][:, 0, 0, :].T)
    expected = pixels.astype(np.float64) @ weight.astype(np.float64)
    for attempt, candidate in enumerate(sampled_candidates(_pointwise_kernel(), HOST, 3)):
        lib = tvm.compile(candidate.mod, target=HOST)
        out = tvm.runtime.tensor(np.zeros(expected.shape, np.float32))
        lib(tvm.runtime.tensor(pixels), tvm.runtime.tensor(pack_matmul_weight(weight, BF16.pair)), out)
        np.testing.assert_allclose(
            out.numpy(), expected, rtol=1e-5, atol=1e-4, err_msg=f"candidate {attempt}"
        )


def test_a_bf16_plan_for_an_amx_cpu_puts_a_models_convolutions_on_tiles(tmp_path: Path) -> None:
    """Planned for an AMX CPU (run on one by the bf16 job tests): the three convolutions on AMX-BF16 tiles;
    the rewritten graph, built plainly here, computes the model within bf16's rounding."""
    path = tmp_path / "bottleneck.onnx"
    onnx.save(build_bottleneck(), path)
    plan = plan_graph(load_model(path).mod, AMX_TARGET, PlanningOptions(precision="bf16"))
    fusion = plan.fusion
    # The rewritten graph (packing, padding, flat rows, slices) built plainly for this CPU.
    x = np.random.default_rng(0).standard_normal((1, 64, 16, 16)).astype(np.float32)
    (got,) = LoadedModel(build_untuned(plan.prepared, HOST)).run([x])
    want = onnxruntime_output(path, x)
    assert got.shape == want.shape
    assert np.linalg.norm(got - want) <= 0.02 * np.linalg.norm(want)  # bf16 operands: ~2^-8 each
    assert fusion.amx_bf16_matmuls == [
        "conv2d 1x16x16x64 * 64x1x1x64 as matmul 256x64 @ 64x64",
        "conv2d 1x16x16x64 * 64x3x3x64 as implicit GEMM 352x576 @ 576x64",
        "conv2d 1x16x16x64 * 32x1x1x64 as matmul 64x64 @ 64x32",
    ]
    assert fusion.precision_compute == "native"


def test_int8_pointwise_convolutions_of_whole_blocks_go_on_the_matmul_amx_tiles() -> None:
    mod, inputs, weights = _convolutions("int8")
    report = VnniReport(amx=True)
    packed = pack_for_vnni(report)(mod)
    assert report.matmul_extents == INT8_ON_TILES
    on_tiles = list(INT8_ON_TILES)
    assert report.packed == [
        *on_tiles[:2],
        "conv2d 1x7x7x64 * 64x1x1x64",
        "conv2d 1x16x16x64 * 32x3x3x64",  # padded: QDQ lowering's come padded already
        on_tiles[2],
        "conv2d 1x7x7x64 * 64x3x3x64",
        "conv2d 1x8x8x64 * 32x3x3x64",
        on_tiles[3],
    ]
    # Integer sums are exact: the rewritten kernels, built plainly, equal the convolutions.
    got = LoadedModel(build_untuned(packed, HOST)).run(inputs)
    for index, (*_, stride, pad) in enumerate(CONVOLUTIONS):
        want = _reference(inputs[index], weights[index], stride, pad).astype(np.int64)
        np.testing.assert_array_equal(got[index], want, err_msg=f"convolution {index}")
    # Without AMX they stay convolutions on vpdpbusd.
    plain = VnniReport()
    pack_for_vnni(plain)(mod)
    assert not plain.matmul_extents and len(plain.packed) == len(CONVOLUTIONS)


def test_an_int8_pointwise_convolutions_matmul_goes_on_tdpbusd() -> None:
    mod, _, _ = _convolutions("int8")
    lowered = relax.get_pipeline("zero")(pack_for_vnni(VnniReport(amx=True))(mod))
    (kernel, *_) = [
        f
        for f in lowered.functions.values()
        if isinstance(f, tvm.tirx.PrimFunc) and "vnni_matmul" in f.script()
    ]
    (candidate,) = sampled_candidates(
        tvm.IRModule({"main": kernel.with_attr("global_symbol", "main")}), AMX_TARGET, 1
    )
    assert "llvm.x86.tdpbusd" in candidate.mod.script()


def _windowed_kernel(dtype: str) -> tuple[tvm.IRModule, list[np.ndarray], np.ndarray]:
    """The implicit GEMM of the unpadded 9x9 window (convolution 4) as a PrimFunc, its flat input and
    packed weight, and the convolution it computes (``[Ho, Wo, O]``)."""
    mod, inputs, weights = _convolutions(dtype)
    if dtype == "int8":
        packed_mod = pack_for_vnni(VnniReport(amx=True))(mod)
    else:
        packed_mod = pack_for_amx_bf16(Bf16AmxReport(amx=True, dot=False))(mod)
    lowered = relax.get_pipeline("zero")(packed_mod)
    (kernel,) = [
        f
        for f in lowered.functions.values()
        if isinstance(f, tvm.tirx.PrimFunc)
        and any(mark in f.script() for mark in PACKED_BLOCKS)
        # 96 computed rows + 2 window rows of 9 + 2 read, into 32 channels
        and (int(f.params[0].shape[0]), int(f.params[-1].shape[-1])) == (116, 32)
    ]
    x, weight = inputs[4], weights[4]
    flat = np.zeros((116, 64), x.dtype)
    flat[:81] = x.reshape(81, 64)
    packed = pack_windowed_weight(weight, 16, 4 if dtype == "int8" else BF16.pair)
    expected = _reference(x, weight, 1, 0)[0]
    return tvm.IRModule({"main": kernel.with_attr("global_symbol", "main")}), [flat, packed], expected


def _kept_pixels(out: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """The flat output's rows that are the convolution's pixels (row ``oh * 9 + ow``), as ``[Ho, Wo, O]``."""
    out_h, out_w, cols = expected.shape
    return out[: 9 * out_h].reshape(out_h, 9, cols)[:, :out_w]


@pytest.mark.parametrize(("dtype", "instruction"), [("int8", "tdpbusd"), ("bf16", "tdpbf16ps")])
def test_a_windowed_convolutions_implicit_gemm_goes_on_tiles(dtype: str, instruction: str) -> None:
    kernel, _, _ = _windowed_kernel(dtype)
    (candidate,) = sampled_candidates(kernel, AMX_TARGET, 1)
    script = candidate.mod.script()
    assert f"llvm.x86.{instruction}" in script
    # The taps are reduction loops around the tile multiply: one intrinsic call per tap and tile row.
    assert "ri" in script and "rj" in script
    assert instruction in tvm.compile(candidate.mod, target=AMX_TARGET).mod.inspect_source("asm")


def _tensorized_here(dtype: str) -> str | None:
    """The instruction this CPU's schedules tensorize a packed ``dtype`` block with, or None."""
    if dtype == "int8":
        return "tdpbusd" if has_amx_int8(HOST) else ("vpdpbusd" if has_vnni(HOST) else None)
    return "tdpbf16ps" if has_amx_bf16(HOST) else ("vdpbf16ps" if has_avx512_bf16(HOST) else None)


@pytest.mark.parametrize("dtype", ["int8", "bf16"])
def test_tensorized_candidates_of_an_implicit_gemm_compute_the_convolution(dtype: str) -> None:
    """Run on this CPU's dot-product or tile instruction: AMX where it has AMX, else the same packing on
    vpdpbusd/vdpbf16ps (the packing, the flat rows and the taps checked; the tiles built above)."""
    instruction = _tensorized_here(dtype)
    if instruction is None:
        pytest.skip(f"this CPU has no {dtype} dot-product instruction for the packed kernel to run on")
    request_amx_permission()
    kernel, (flat, packed), expected = _windowed_kernel(dtype)
    acc = np.int32 if dtype == "int8" else np.float32
    for attempt, candidate in enumerate(sampled_candidates(kernel, HOST, 3)):
        assert instruction in tvm.compile(candidate.mod, target=HOST).mod.inspect_source("asm")
        lib = tvm.compile(candidate.mod, target=HOST)
        out = tvm.runtime.tensor(np.zeros((96, expected.shape[-1]), acc))
        lib(tvm.runtime.tensor(flat), tvm.runtime.tensor(packed), out)
        got = _kept_pixels(out.numpy(), expected)
        if dtype == "int8":
            np.testing.assert_array_equal(got, expected.astype(np.int64), err_msg=f"candidate {attempt}")
        else:
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4, err_msg=f"candidate {attempt}")


def test_an_int8_plan_for_an_amx_cpu_puts_a_quantized_models_convolutions_on_tiles(tmp_path: Path) -> None:
    """A model as users quantize it, planned for an AMX CPU: its three convolutions on AMX-INT8 tiles, the
    3x3 one over its input padded with the zero point by the QDQ lowering; the rewritten graph, built
    plainly here, within one step of ONNX's reference semantics."""
    _, path = quantized_by_onnxruntime(build_bottleneck(), (1, 64, 16, 16), tmp_path, "bottleneck")
    plan = plan_graph(load_model(path).mod, AMX_TARGET)
    assert plan.fusion.integer_kernels == "amx"
    assert plan.fusion.amx_matmuls == [
        "conv2d 1x16x16x64 * 64x1x1x64 as matmul 256x64 @ 64x64",
        "conv2d 1x18x18x64 * 64x3x3x64 as implicit GEMM 352x576 @ 576x64",
        "conv2d 1x16x16x64 * 32x1x1x64 as matmul 64x64 @ 64x32",
    ]
    x = np.random.default_rng(3).standard_normal((1, 64, 16, 16)).astype(np.float32)
    (got,) = LoadedModel(build_untuned(plan.prepared, HOST)).run([x])
    step = output_step(onnx.load(path))
    assert np.abs(got - reference_output(path, x)).max() <= 1.001 * step
