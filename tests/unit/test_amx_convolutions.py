"""Pointwise (1x1) convolutions on Intel AMX tiles under the bf16 policy: each one whose pixels and
channels are whole AMX blocks becomes the AMX matmul of its (strided) pixels by its channels. What the
rewrite computes is checked here on any CPU (the packed kernel built plainly, the bit-exact reference path:
the same packing, the same bf16 operands, fp32 sums); the tile code is built for an AMX CPU everywhere
and run only on one."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kiln_tvm import relax, tvm
from kiln_tvm.x86_amx import BF16, request_amx_permission
from schedules.amx import has_amx_bf16
from schedules.vnni import PACKED_BLOCKS
from tests.schedule_candidates import sampled_candidates
from tuner.compile import LoadedModel, build_untuned
from tuner.entities import PlanningOptions
from tuner.frontend import load_model
from tuner.passes.bf16_packing import Bf16AmxReport, pack_for_amx_bf16
from tuner.passes.int8_packing import VnniReport, pack_for_vnni, pack_matmul_weight
from tuner.passes.plan import plan_graph
from tuner.targets import host_target, to_tvm_target

HOST = to_tvm_target(host_target())
AMX_TARGET = (
    HOST if has_amx_bf16(HOST) else to_tvm_target({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2})
)
runs_amx_bf16 = pytest.mark.skipif(not has_amx_bf16(HOST), reason="this CPU has no AMX-BF16: built, not run")

#: (input pixels, input channels, output channels, kernel size, stride) of each convolution of the graph.
CONVOLUTIONS = [
    ((16, 16), 64, 64, 1, 1),  # 256 pixels: AMX
    ((16, 16), 64, 32, 1, 2),  # strided: 64 pixels, AMX
    ((7, 7), 64, 64, 1, 1),  # 49 pixels: no whole tile of 16
    ((16, 16), 64, 32, 3, 1),  # a window: not a matmul
]


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
    for index, ((h, w), c, o, k, _) in enumerate(CONVOLUTIONS):
        params.append(relax.Var(f"x{index}", relax.TensorType((1, h, w, c), x_dtype)))
        x, weight = _operands(rng, dtype, (1, h, w, c), (o, k, k, c))
        inputs.append(x)
        weights.append(weight)
    with bb.function("main", params):
        for index, (*_, k, s) in enumerate(CONVOLUTIONS):
            conv = relax.op.nn.conv2d(
                params[index],
                relax.const(weights[index], w_dtype),
                strides=[s, s],
                padding=[k // 2] * 4,
                data_layout="NHWC",
                kernel_layout="OHWI",
                out_dtype=out_dtype,
            )
            outputs.append(bb.emit(conv))
        bb.emit_func_output(relax.Tuple(outputs))
    return bb.get(), inputs, weights


def _reference(x: np.ndarray, weight: np.ndarray, stride: int) -> np.ndarray:
    """The convolution on the bf16 values in float64 (products of bf16 values are exact in fp32)."""
    o, k, _, c = weight.shape
    data = np.pad(x.astype(np.float64), [(0, 0), (k // 2, k // 2), (k // 2, k // 2), (0, 0)])
    _, hp, wp, _ = data.shape
    out_h, out_w = (hp - k) // stride + 1, (wp - k) // stride + 1
    out = np.zeros((1, out_h, out_w, o))
    for i in range(k):
        for j in range(k):
            window = data[:, i : i + stride * out_h : stride, j : j + stride * out_w : stride, :]
            out += window @ weight[:, i, j, :].astype(np.float64).T
    return out


def test_pointwise_convolutions_of_whole_blocks_go_on_amx_as_matmuls_of_their_pixels() -> None:
    mod, _, _ = _convolutions()
    report = Bf16AmxReport(amx=True, dot=True)
    pack_for_amx_bf16(report)(mod)
    assert report.packed == [
        "conv2d 1x16x16x64 * 64x1x1x64 as matmul 256x64 @ 64x64",
        "conv2d 1x16x16x64 * 32x1x1x64 as matmul 64x64 @ 64x32",
    ]
    # The 49-pixel one and the 3x3 window stay convolutions, on vdpbf16ps.
    assert report.dot_convolutions == ["conv2d 1x7x7x64 * 64x1x1x64", "conv2d 1x16x16x64 * 32x3x3x64"]


def test_the_rewritten_convolutions_compute_the_convolutions_on_their_bf16_operands() -> None:
    """The packed kernels built plainly (no tile instruction): the rewrite's strides, reshapes and packing
    against the convolutions themselves."""
    mod, inputs, weights = _convolutions()
    packed = pack_for_amx_bf16(Bf16AmxReport(amx=True, dot=True))(mod)
    got = LoadedModel(build_untuned(packed, HOST)).run(inputs)
    for index, (*_, stride) in enumerate(CONVOLUTIONS):
        want = _reference(inputs[index], weights[index], stride)
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
    assert len(kernels) == 2
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


def _bottleneck_onnx(path: Path) -> Path:
    """An NCHW float model: a 1x1 convolution, ReLU, a strided 1x1 one (ResNet's bottleneck projections)."""
    rng = np.random.default_rng(2)
    inits = [
        numpy_helper.from_array((rng.standard_normal((64, 64, 1, 1)) / 8).astype(np.float32), "w1"),
        numpy_helper.from_array((rng.standard_normal((32, 64, 1, 1)) / 8).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="pointwise"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        helper.make_node("Conv", ["r1", "w2"], ["y"], name="projection", strides=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "bottleneck",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 8, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


def test_a_bf16_plan_for_an_amx_cpu_puts_a_models_pointwise_convolutions_on_tiles(tmp_path: Path) -> None:
    """Planned for an AMX CPU (run on one by the bf16 job tests): both convolutions on AMX-BF16 tiles."""
    imported = load_model(_bottleneck_onnx(tmp_path / "bottleneck.onnx"))
    fusion = plan_graph(imported.mod, AMX_TARGET, PlanningOptions(precision="bf16")).fusion
    assert fusion.amx_bf16_matmuls == [
        "conv2d 1x16x16x64 * 64x1x1x64 as matmul 256x64 @ 64x64",
        "conv2d 1x16x16x64 * 32x1x1x64 as matmul 64x64 @ 64x32",
    ]
    assert fusion.precision_compute == "native"


def test_int8_pointwise_convolutions_of_whole_blocks_go_on_the_matmul_amx_tiles() -> None:
    mod, inputs, weights = _convolutions("int8")
    report = VnniReport(amx=True)
    packed = pack_for_vnni(report)(mod)
    assert report.matmul_extents == {
        "conv2d 1x16x16x64 * 64x1x1x64 as matmul 256x64 @ 64x64": (256, 64, 64),
        "conv2d 1x16x16x64 * 32x1x1x64 as matmul 64x64 @ 64x32": (64, 32, 64),
    }
    assert report.packed == [
        *report.matmul_extents,
        "conv2d 1x7x7x64 * 64x1x1x64",
        "conv2d 1x16x16x64 * 32x3x3x64",
    ]
    # Integer sums are exact: the rewritten kernels, built plainly, equal the convolutions.
    got = LoadedModel(build_untuned(packed, HOST)).run(inputs)
    for index, (*_, stride) in enumerate(CONVOLUTIONS):
        want = _reference(inputs[index], weights[index], stride).astype(np.int64)
        np.testing.assert_array_equal(got[index], want, err_msg=f"convolution {index}")
    # Without AMX they stay convolutions on vpdpbusd.
    plain = VnniReport()
    pack_for_vnni(plain)(mod)
    assert not plain.matmul_extents and len(plain.packed) == 4


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
