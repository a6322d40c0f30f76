"""Integer kernels on x86's VNNI dot product: weights packed for it, kernels that compute what the integer
operators do, tensorized only where Kiln packed them, and ``vpdpbusd`` in the code."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kiln_tvm import relax, tvm
from kiln_tvm.x86_vnni import (
    AVX2_BYTE_DOT,
    AVX2_WORD_DOT,
    AVX512_BYTE_DOT,
    AVX512_WORD_DOT,
    AVXVNNI_DOT,
    VNNI_DOT,
)
from schedules.vnni import SEVEN_BIT_BLOCK, VNNI_BLOCK, integer_dot, seven_bit_dot, vnni_lanes
from tests.schedule_candidates import sampled_candidates
from tuner.passes.int8_packing import (
    VnniReport,
    conv2d_kernel,
    matmul_kernel,
    pack_conv_weight,
    pack_for_vnni,
    pack_matmul_weight,
)
from tuner.targets import host_target, to_tvm_target

te = tvm.te
HOST = to_tvm_target(host_target())
#: A VNNI CPU to build for where this machine has none (the code is built, not run).
VNNI_TARGET = (
    HOST if vnni_lanes(HOST) == 16 else to_tvm_target({"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2})
)
runs_vnni = pytest.mark.skipif(vnni_lanes(HOST) != 16, reason="this CPU has no AVX512-VNNI: built, not run")
#: AVX-VNNI without AVX-512 (an Alder Lake's integer ISA on a Haswell base, so that CPUs with AVX-VNNI run
#: it): the 256-bit ``vpdpbusd ymm``.
AVXVNNI_TARGET = to_tvm_target({"kind": "llvm", "mcpu": "haswell", "mattr": ["+avxvnni"], "num-cores": 2})
HOST_HAS_AVXVNNI = "avxvnni" in {str(f) for f in tvm.target.codegen.llvm_get_cpu_features(HOST)}


def _rng() -> np.random.Generator:
    return np.random.default_rng(3)


def test_packed_weights_put_16_channels_by_4_reduction_elements_together() -> None:
    w = _rng().integers(-128, 128, (8, 32), dtype=np.int8)  # [K, N]
    p = pack_matmul_weight(w)
    assert p.shape == (2, 2, 16, 4)
    for k, n in [(0, 0), (5, 17), (7, 31), (3, 16)]:
        assert p[n // 16, k // 4, n % 16, k % 4] == w[k, n]
    c = _rng().integers(-128, 128, (32, 3, 3, 8), dtype=np.int8)  # OHWI
    q = pack_conv_weight(c)
    assert q.shape == (2, 3, 3, 2, 16, 4)
    for o, i, j, ch in [(0, 0, 0, 0), (17, 2, 1, 5), (31, 2, 2, 7)]:
        assert q[o // 16, i, j, ch // 4, o % 16, ch % 4] == c[o, i, j, ch]


def _build_te(out: te.Tensor, inputs: list[te.Tensor], target: tvm.target.Target = HOST) -> object:
    func = te.create_prim_func([*inputs, out])
    return tvm.compile(tvm.IRModule({"main": func}), target=target)


def test_the_kernels_compute_the_integer_matmul_and_convolution() -> None:
    rng = _rng()
    x = rng.integers(0, 256, (3, 5, 8), dtype=np.uint8)
    w = rng.integers(-128, 128, (8, 32), dtype=np.int8)
    xt = te.placeholder(x.shape, "uint8", name="x")
    pt = te.placeholder((2, 2, 16, 4), "int8", name="wp")
    lib = _build_te(matmul_kernel(xt, pt), [xt, pt])
    out = tvm.runtime.tensor(np.zeros((3, 5, 32), np.int32))
    lib(tvm.runtime.tensor(x), tvm.runtime.tensor(pack_matmul_weight(w)), out)
    np.testing.assert_array_equal(out.numpy(), x.astype(np.int32) @ w.astype(np.int32))

    image = rng.integers(0, 256, (1, 7, 6, 8), dtype=np.uint8)
    kernel = rng.integers(-128, 128, (16, 3, 3, 8), dtype=np.int8)  # OHWI
    padded = np.pad(image, ((0, 0), (1, 1), (1, 1), (0, 0)))
    it = te.placeholder(padded.shape, "uint8", name="x")
    kt = te.placeholder((1, 3, 3, 2, 16, 4), "int8", name="wp")
    lib = _build_te(conv2d_kernel(it, kt, (2, 1), (1, 1)), [it, kt])
    out = tvm.runtime.tensor(np.zeros((1, 4, 6, 16), np.int32))
    lib(tvm.runtime.tensor(padded), tvm.runtime.tensor(pack_conv_weight(kernel)), out)
    padded = padded.astype(np.int32)
    expected = np.zeros((1, 4, 6, 16), np.int64)
    for h in range(4):
        for w_ in range(6):
            window = padded[0, 2 * h : 2 * h + 3, w_ : w_ + 3, :]
            expected[0, h, w_] = np.einsum("ijc,oijc->o", window, kernel.astype(np.int64))
    np.testing.assert_array_equal(out.numpy(), expected)


def _integer_graph(k: int, n: int, conv_channels: int | None = None) -> tvm.IRModule:
    """A Relax function with an integer matmul x[4, k] @ W[k, n] and, when asked, an NHWC/OHWI integer
    convolution over ``conv_channels`` input channels."""
    rng = _rng()
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, k), "uint8"))
    image = relax.Var("image", relax.TensorType((1, 8, 8, conv_channels or 4), "uint8"))
    params = [x] if conv_channels is None else [x, image]
    with bb.function("main", params):
        w = relax.const(rng.integers(-128, 128, (k, n), dtype=np.int8), "int8")
        out = bb.emit(relax.op.matmul(x, w, out_dtype="int32"))
        if conv_channels is not None:
            weights = relax.const(rng.integers(-128, 128, (16, 3, 3, conv_channels), dtype=np.int8), "int8")
            conv = relax.op.nn.conv2d(
                image,
                weights,
                padding=[1, 1, 1, 1],
                data_layout="NHWC",
                kernel_layout="OHWI",
                out_dtype="int32",
            )
            out = relax.Tuple([out, bb.emit(conv)])
        bb.emit_func_output(out)
    return bb.get()


def test_the_pass_packs_what_fits_and_says_why_not_for_the_rest() -> None:
    report = VnniReport()
    mod = pack_for_vnni(report)(_integer_graph(64, 32, conv_channels=3))
    # An RGB convolution's 3 channels get a zero fourth: packed too.
    assert report.packed == ["matmul 4x64 @ 64x32", "conv2d 1x8x8x3 * 16x3x3x3"]
    report = VnniReport()
    mod = pack_for_vnni(report)(_integer_graph(62, 32, conv_channels=4))
    assert report.packed == ["conv2d 1x8x8x4 * 16x3x3x4"]
    assert report.unpacked == ["matmul 4x62 @ 62x32: 62 inputs (a multiple of 4 is packed)"]
    marked = [
        gv.name_hint
        for gv, f in mod.functions.items()
        if isinstance(f, tvm.tirx.PrimFunc) and VNNI_BLOCK in f.script()
    ]
    assert marked == ["vnni_conv2d"]


def _lowered_kernel(mod: tvm.IRModule, mark: str = VNNI_BLOCK) -> tvm.IRModule:
    """The packed kernel of the pass' output (its block marked ``mark``), alone, as its tuning task sees it."""
    lowered = relax.get_pipeline("zero")(mod)
    (func,) = [
        f
        for f in lowered.functions.values()
        if isinstance(f, tvm.tirx.PrimFunc) and f'"{mark}"' in f.script()
    ]
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def test_only_packed_blocks_are_tensorized_and_their_code_uses_vpdpbusd() -> None:
    packed = _lowered_kernel(pack_for_vnni()(_integer_graph(64, 32)))
    (candidate,) = sampled_candidates(packed, VNNI_TARGET)
    assert "vpdpbusd" in candidate.mod.script()
    asm = tvm.compile(candidate.mod, target=VNNI_TARGET).mod.inspect_source("asm")
    assert "vpdpbusd" in asm

    # The same integer matmul unpacked: the VNNI rule leaves it to the plain tiling.
    x = te.placeholder((4, 64), "uint8", name="x")
    w = te.placeholder((64, 32), "int8", name="w")
    k = te.reduce_axis((0, 64), name="k")
    plain = te.compute(
        (4, 32), lambda i, j: te.sum(x[i, k].astype("int32") * w[k, j].astype("int32"), axis=k), name="mm"
    )
    unpacked = tvm.IRModule({"main": te.create_prim_func([x, w, plain])})
    assert "vpdpbusd" not in sampled_candidates(unpacked, VNNI_TARGET)[0].mod.script()


def _conv_reference(padded: np.ndarray, kernel: np.ndarray, stride: tuple[int, int]) -> np.ndarray:
    """NHWC x OHWI integer convolution of an already padded input, in numpy."""
    (sh, sw), (o, kh, kw, _) = stride, kernel.shape
    out_h, out_w = (padded.shape[1] - kh) // sh + 1, (padded.shape[2] - kw) // sw + 1
    expected = np.zeros((padded.shape[0], out_h, out_w, o), np.int64)
    for h in range(out_h):
        for w in range(out_w):
            window = padded[:, h * sh : h * sh + kh, w * sw : w * sw + kw, :].astype(np.int64)
            expected[:, h, w] = np.einsum("bijc,oijc->bo", window, kernel.astype(np.int64))
    return expected


@runs_vnni
@pytest.mark.parametrize("kind", ["matmul", "conv2d"])
def test_tensorized_candidates_compute_the_integer_operator(kind: str) -> None:
    rng = _rng()
    bb = relax.BlockBuilder()
    if kind == "matmul":
        data = rng.integers(0, 256, (4, 64), dtype=np.uint8)
        weight = rng.integers(-128, 128, (64, 32), dtype=np.int8)
        packed, expected = pack_matmul_weight(weight), data.astype(np.int32) @ weight.astype(np.int32)
        op = lambda x: relax.op.matmul(x, relax.const(weight, "int8"), out_dtype="int32")  # noqa: E731
    else:
        data = rng.integers(0, 256, (1, 9, 9, 8), dtype=np.uint8)  # padded already
        weight = rng.integers(-128, 128, (32, 3, 3, 8), dtype=np.int8)
        packed, expected = pack_conv_weight(weight), _conv_reference(data, weight, (2, 2))
        op = lambda x: relax.op.nn.conv2d(  # noqa: E731
            x,
            relax.const(weight, "int8"),
            strides=[2, 2],
            data_layout="NHWC",
            kernel_layout="OHWI",
            out_dtype="int32",
        )
    var = relax.Var("x", relax.TensorType(data.shape, "uint8"))
    with bb.function("main", [var]):
        bb.emit_func_output(bb.emit(op(var)))
    kernel = _lowered_kernel(pack_for_vnni()(bb.get()))
    for attempt, candidate in enumerate(sampled_candidates(kernel, HOST, 3)):
        assert "vpdpbusd" in candidate.mod.script()
        lib = tvm.compile(candidate.mod, target=HOST)
        out = tvm.runtime.tensor(np.zeros(expected.shape, np.int32))
        lib(tvm.runtime.tensor(data), tvm.runtime.tensor(packed), out)
        np.testing.assert_array_equal(out.numpy(), expected, f"candidate {attempt}")


def test_avx_vnni_cpus_get_8_lane_kernels_on_vpdpbusd_ymm() -> None:
    assert vnni_lanes(AVXVNNI_TARGET) == 8 and vnni_lanes(VNNI_TARGET) == 16
    rng = _rng()
    weight = rng.integers(-128, 128, (64, 24), dtype=np.int8)  # 24 columns: 3 blocks of 8, not of 16
    packed = pack_matmul_weight(weight, lanes=8)
    assert packed.shape == (3, 16, 8, 4) and packed[2, 5, 3, 1] == weight[5 * 4 + 1, 2 * 8 + 3]
    conv = rng.integers(-128, 128, (8, 3, 3, 4), dtype=np.int8)
    assert pack_conv_weight(conv, lanes=8).shape == (1, 3, 3, 1, 8, 4)

    report = VnniReport(dot=AVXVNNI_DOT)
    graph = relax.BlockBuilder()
    var = relax.Var("x", relax.TensorType((4, 64), "uint8"))
    with graph.function("main", [var]):
        graph.emit_func_output(
            graph.emit(relax.op.matmul(var, relax.const(weight, "int8"), out_dtype="int32"))
        )
    kernel = _lowered_kernel(pack_for_vnni(report)(graph.get()))
    assert report.packed == ["matmul 4x64 @ 64x24"]
    data = rng.integers(0, 256, (4, 64), dtype=np.uint8)
    expected = data.astype(np.int32) @ weight.astype(np.int32)
    for attempt, candidate in enumerate(sampled_candidates(kernel, AVXVNNI_TARGET, 3)):
        assert "kiln_dot_8x4_avxvnni" in str(candidate.trace) or "vpdpbusd" in candidate.mod.script()
        lib = tvm.compile(candidate.mod, target=AVXVNNI_TARGET)
        asm = lib.mod.inspect_source("asm")
        assert re.search(r"vpdpbusd[^\n]*%ymm", asm) and "zmm" not in asm, f"candidate {attempt}"
        if HOST_HAS_AVXVNNI:  # elsewhere built only: the skip below says why
            out = tvm.runtime.tensor(np.zeros(expected.shape, np.int32))
            lib(tvm.runtime.tensor(data), tvm.runtime.tensor(packed), out)
            np.testing.assert_array_equal(out.numpy(), expected, f"candidate {attempt}")
    if not HOST_HAS_AVXVNNI:
        pytest.skip("the 8-lane candidates built on vpdpbusd ymm, but this CPU has no AVX-VNNI to run them")


#: CPUs without VNNI: AVX2 (this machine, where it has AVX2) and AVX-512 without VNNI (a Skylake-SP).
AVX2_TARGET = to_tvm_target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
AVX512_TARGET = to_tvm_target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
HOST_FEATURES = {str(f) for f in tvm.target.codegen.llvm_get_cpu_features(HOST)}


def test_each_cpu_class_gets_its_integer_dot_product() -> None:
    assert integer_dot(VNNI_TARGET) == VNNI_DOT and integer_dot(AVXVNNI_TARGET) == AVXVNNI_DOT
    assert integer_dot(AVX512_TARGET) == AVX512_WORD_DOT and integer_dot(AVX2_TARGET) == AVX2_WORD_DOT
    sse = to_tvm_target({"kind": "llvm", "mcpu": "nehalem", "num-cores": 2})
    assert integer_dot(sse) is None


@pytest.mark.parametrize("dot", [AVX2_WORD_DOT, AVX512_WORD_DOT], ids=lambda d: d.kind)
@pytest.mark.parametrize("kind", ["matmul", "conv2d", "conv2d-rgb"])
def test_cpus_without_vnni_compute_exact_int16_products_on_vpmaddwd(kind: str, dot: object) -> None:
    """Full-range u8 inputs by full-range s8 weights (where vpmaddubsw would saturate its int16 sums): the
    kernels packed as int16 for vpmaddwd compute the integer operator exactly."""
    target = AVX2_TARGET if dot is AVX2_WORD_DOT else AVX512_TARGET
    runs = ("avx512bw" in HOST_FEATURES) if dot is AVX512_WORD_DOT else ("avx2" in HOST_FEATURES)
    rng = _rng()
    bb = relax.BlockBuilder()
    lanes = dot.lanes
    if kind == "matmul":
        data = np.full((4, 64), 255, np.uint8)
        data[1:] = rng.integers(0, 256, (3, 64), dtype=np.uint8)
        weight = rng.integers(-128, 128, (64, 2 * lanes), dtype=np.int8)
        weight[:, 0] = 127  # 255 * 127 * 2 > 32767: beyond vpmaddubsw's int16
        packed = pack_matmul_weight(weight.astype(np.int16), pair=2, lanes=lanes)
        expected = data.astype(np.int32) @ weight.astype(np.int32)
        op = lambda x: relax.op.matmul(x, relax.const(weight, "int8"), out_dtype="int32")  # noqa: E731
    else:
        # An RGB image's 3 channels: the pass gives the weight (and the input) a zero fourth channel.
        channels = 6 if kind == "conv2d" else 3
        data = rng.integers(0, 256, (1, 9, 9, channels), dtype=np.uint8)  # padded already
        weight = rng.integers(-128, 128, (lanes, 3, 3, channels), dtype=np.int8)
        weight[0] = -128
        extra = channels % 2
        padded_weight = np.pad(weight, [(0, 0), (0, 0), (0, 0), (0, extra)])
        packed = pack_conv_weight(padded_weight.astype(np.int16), lanes, 2)
        expected = _conv_reference(data, weight, (2, 2))
        op = lambda x: relax.op.nn.conv2d(  # noqa: E731
            x,
            relax.const(weight, "int8"),
            strides=[2, 2],
            data_layout="NHWC",
            kernel_layout="OHWI",
            out_dtype="int32",
        )
    var = relax.Var("x", relax.TensorType(data.shape, "uint8"))
    with bb.function("main", [var]):
        bb.emit_func_output(bb.emit(op(var)))
    report = VnniReport(dot=dot)
    kernel = _lowered_kernel(pack_for_vnni(report)(bb.get()))
    assert len(report.packed) == 1 and report.unpacked == []
    if kind == "conv2d-rgb":  # the kernel reads the input with its zero channel
        data = np.pad(data, [(0, 0), (0, 0), (0, 0), (0, 1)])
    for attempt, candidate in enumerate(sampled_candidates(kernel, target, 3)):
        assert dot.intrinsic in str(candidate.trace), f"candidate {attempt}"
        lib = tvm.compile(candidate.mod, target=target)
        asm = lib.mod.inspect_source("asm")
        assert re.search(r"vpmaddwd[^\n]*%" + ("zmm" if lanes == 16 else "ymm"), asm), f"candidate {attempt}"
        assert "vpmaddubsw" not in asm
        if runs:
            out = tvm.runtime.tensor(np.zeros(expected.shape, np.int32))
            lib(tvm.runtime.tensor(data), tvm.runtime.tensor(packed), out)
            np.testing.assert_array_equal(out.numpy(), expected, f"candidate {attempt}")
    if not runs:
        pytest.skip(f"the {dot.instruction} candidates built, but this CPU cannot run them")


@pytest.mark.parametrize(
    "dots", [(AVX2_WORD_DOT, AVX2_BYTE_DOT), (AVX512_WORD_DOT, AVX512_BYTE_DOT)], ids=["avx2", "avx512"]
)
def test_seven_bit_weights_go_on_vpmaddubsw_and_stay_exact(dots: tuple) -> None:
    """Without VNNI, a weight whose values all lie within +-64 gets vpmaddubsw (u8 x s8 pairs summed in an
    int16 that cannot saturate: 255 x 64 x 2 = 32640), exact at the extremes; one value beyond keeps the
    weight on int16 products."""
    word, byte = dots
    target = AVX2_TARGET if word is AVX2_WORD_DOT else AVX512_TARGET
    assert seven_bit_dot(target) == byte and integer_dot(target) == word
    runs = ("avx512bw" in HOST_FEATURES) if word is AVX512_WORD_DOT else ("avx2" in HOST_FEATURES)
    rng = _rng()
    lanes = byte.lanes
    data = rng.integers(0, 256, (4, 64), dtype=np.uint8)
    data[0] = 255
    seven = rng.integers(-64, 65, (64, 2 * lanes), dtype=np.int8)
    seven[:, 0], seven[:, 1] = 64, -64  # the extremes, against inputs of 255
    eight = seven.copy()
    eight[3, 5] = 65

    def graph(weight: np.ndarray) -> tvm.IRModule:
        bb = relax.BlockBuilder()
        var = relax.Var("x", relax.TensorType(data.shape, "uint8"))
        with bb.function("main", [var]):
            bb.emit_func_output(bb.emit(relax.op.matmul(var, relax.const(weight, "int8"), out_dtype="int32")))
        return bb.get()

    report = VnniReport(dot=word, seven_bit=byte)
    wide = pack_for_vnni(report)(graph(eight))
    assert report.packed == [f"matmul 4x64 @ 64x{2 * lanes}"] and report.seven_bit_packed == []
    assert SEVEN_BIT_BLOCK not in _lowered_kernel(wide).script()
    report = VnniReport(dot=word, seven_bit=byte)
    kernel = _lowered_kernel(pack_for_vnni(report)(graph(seven)), SEVEN_BIT_BLOCK)
    assert report.seven_bit_packed == report.packed and len(report.packed) == 1
    packed = pack_matmul_weight(seven, lanes=lanes)
    expected = data.astype(np.int32) @ seven.astype(np.int32)
    for attempt, candidate in enumerate(sampled_candidates(kernel, target, 3)):
        assert byte.intrinsic in str(candidate.trace), f"candidate {attempt}"
        lib = tvm.compile(candidate.mod, target=target)
        asm = lib.mod.inspect_source("asm")
        assert "vpmaddubsw" in asm and "vpmaddwd" in asm, f"candidate {attempt}"
        if runs:
            out = tvm.runtime.tensor(np.zeros(expected.shape, np.int32))
            lib(tvm.runtime.tensor(data), tvm.runtime.tensor(packed), out)
            np.testing.assert_array_equal(out.numpy(), expected, f"candidate {attempt}")
    if not runs:
        pytest.skip(f"the {byte.instruction} candidates built, but this CPU cannot run them")
