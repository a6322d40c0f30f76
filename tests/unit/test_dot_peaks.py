"""The int8 and bf16 peaks: which dot product each CPU class gets, kernels that compute what their
instructions do (run where the CPU has them, built for one that has them elsewhere), the roofs they give
each precision, and the tasks' roofline floors that follow."""

from __future__ import annotations

import numpy as np
import pytest

from kiln_tvm import ms, tvm
from schedules.poly.caches import CacheHierarchy, CacheLevel
from tuner.entities import MachineLimits
from tuner.entities.profile import LIMITS_VERSION
from tuner.targets import host_target, to_tvm_target
from tuner.timing.dot_peaks import DOT_CHAINS, compile_dot_peak, dot_peak_timer, dot_products
from tuner.timing.profile import host_limits
from tuner.tune import roofline_floors_ms

HOST = host_target()
HOST_FEATURES = {str(f) for f in tvm.target.codegen.llvm_get_cpu_features(to_tvm_target(HOST))}

LIMITS = MachineLimits(
    peak_gflops=100.0,
    peak_gflops_one_thread=50.0,
    bandwidth_gbs=10.0,
    threads=2,
    vector_lanes=8,
    how="test",
    int8_gops=400.0,
    int8_instruction="vpdpbusd zmm",
    version=LIMITS_VERSION,
)

#: CPU classes these machines have been, and what each computes int8 and bf16 with.
CLASSES = {
    "zen3 (AVX2)": ({"avx", "avx2", "fma"}, "vpmaddubsw + vpmaddwd ymm", None),
    "skylake-avx512": ({"avx2", "avx512f", "avx512bw"}, "vpmaddubsw + vpmaddwd zmm", None),
    "alder lake (AVX-VNNI)": ({"avx2", "avxvnni"}, "vpdpbusd ymm", None),
    "zen 4": ({"avx2", "avx512f", "avx512bw", "avx512vnni", "avx512bf16"}, "vpdpbusd zmm", "vdpbf16ps zmm"),
    "sse only": ({"sse4.2"}, None, None),
}


@pytest.mark.parametrize("cpu", list(CLASSES))
def test_each_cpu_class_gets_its_widest_dot_product(cpu: str) -> None:
    features, int8, bf16 = CLASSES[cpu]
    found = dot_products(features)
    assert (found["int8"].instruction if "int8" in found else None) == int8
    assert (found["bf16"].instruction if "bf16" in found else None) == bf16
    # Operations per step of one accumulator: four u8 x s8 products per 32-bit lane, two bf16 ones.
    lanes = {"ymm": 8, "zmm": 16}
    for dot in found.values():
        per_lane = 4 if dot.precision == "int8" else 2
        assert dot.ops_per_step == 2 * per_lane * lanes[dot.instruction[-3:]]


def _run(dot_name: str, features: set[str], iterations: int) -> np.ndarray:
    dot = dot_products(features)[dot_name]
    lib = compile_dot_peak(dot, to_tvm_target(HOST), threads=2)
    width = dot.operand_bytes
    a, b = np.ones(width, dtype=np.int8), np.full(width, 2, dtype=np.int8)
    ones = np.tile(np.array([1, 0], dtype=np.int8), width // 2)
    out = tvm.runtime.tensor(np.zeros((2, width), dtype=np.int8))
    lib.mod["dot_peak"](*[tvm.runtime.tensor(x) for x in (a, b, ones)], out, iterations)
    return out.numpy().view(np.int32).reshape(-1)


@pytest.mark.skipif("avx2" not in HOST_FEATURES, reason="this CPU has no AVX2 to run vpmaddubsw ymm")
def test_the_avx2_kernel_computes_its_chains() -> None:
    """Each step: u8 ones times the accumulator's own bytes as s8, paired into s16 (vpmaddubsw), pairs
    summed into s32 by ones (vpmaddwd), added to the accumulator; every thread stores its chains' sum."""
    for iterations in (1, 3):
        acc = np.full(8, 0x02020202, dtype=np.int32)  # the seed: b's bytes
        for _ in range(iterations):
            signed = acc.view(np.int8).astype(np.int32)
            pairs = np.clip(signed[0::2] + signed[1::2], -32768, 32767)
            acc = (acc + pairs[0::2] + pairs[1::2]).astype(np.int32)
        got = _run("int8", {"avx2"}, iterations)
        np.testing.assert_array_equal(got, np.tile((acc.astype(np.int64) * DOT_CHAINS).astype(np.int32), 2))


@pytest.mark.skipif(
    not {"avx512vnni", "avx512f"} <= HOST_FEATURES, reason="this CPU has no AVX512-VNNI: built, not run"
)
def test_the_vnni_kernel_computes_its_chains() -> None:
    got = _run("int8", {"avx512vnni", "avx512f"}, 5)
    per_chain = 0x02020202 + 5 * 4 * 2  # four products of 1 x 2 per lane and step
    np.testing.assert_array_equal(got, np.full(32, per_chain * DOT_CHAINS, dtype=np.int32))


@pytest.mark.parametrize(
    ("mcpu", "precision", "instructions"),
    [
        ("haswell", "int8", {"vpmaddubsw", "vpmaddwd"}),
        ("skylake-avx512", "int8", {"vpmaddubsw", "vpmaddwd"}),
        ("cascadelake", "int8", {"vpdpbusd"}),
        ("alderlake", "int8", {"vpdpbusd"}),
        ("cooperlake", "bf16", {"vdpbf16ps"}),
    ],
)
def test_each_kernel_builds_on_its_instructions_for_a_cpu_that_has_them(
    mcpu: str, precision: str, instructions: set[str]
) -> None:
    target = to_tvm_target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    features = {str(f) for f in tvm.target.codegen.llvm_get_cpu_features(target)}
    dot = dot_products(features)[precision]
    asm = compile_dot_peak(dot, target, threads=2).mod.inspect_source("asm")
    for instruction in instructions:
        assert asm.count(instruction) >= DOT_CHAINS, (instruction, dot.instruction)


@pytest.mark.skipif("avx2" not in HOST_FEATURES, reason="this CPU has no int8 dot product to time")
def test_this_cpu_s_int8_peak_is_a_rate() -> None:
    (dot,) = [d for name, d in dot_products(HOST_FEATURES).items() if name == "int8"]
    assert dot_peak_timer(dot, {**HOST, "num-cores": 1}, threads=1, repeats=1)() > 0


def test_each_precision_is_judged_against_its_own_roof() -> None:
    assert LIMITS.peak_for("fp32") == LIMITS.peak_for(None) == 100.0
    assert LIMITS.peak_for("int8") == 400.0
    assert LIMITS.peak_for("bf16") == 100.0  # no vdpbf16ps: bf16 computes in fp32
    assert LIMITS.attainable_gflops(100.0, "int8") == 400.0 and LIMITS.attainable_gflops(100.0) == 100.0
    assert LIMITS.attainable_gflops(20.0, "int8") == 200.0  # under the bandwidth roof
    assert LIMITS.ridge_intensity_for("int8") == 40.0 and LIMITS.ridge_intensity == 10.0
    again = MachineLimits(100.0, 50.0, 10.0, 2, 8, "test", int8_gops=450.0, bf16_gflops=None)
    assert LIMITS.best_of(again).int8_gops == 450.0 and LIMITS.best_of(again).bf16_gflops is None


def _task(dtype: str, n: int = 64) -> ms.ExtractedTask:
    te = tvm.te
    acc = "int32" if dtype in ("int8", "uint8") else "float32"
    a = te.placeholder((n, n), dtype, name="A")
    b = te.placeholder((n, n), dtype, name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k].astype(acc) * b[k, j].astype(acc), axis=k), name="C")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    return ms.ExtractedTask(f"matmul_{dtype}", mod, to_tvm_target(HOST), [mod], 1)


def test_a_task_s_roofline_floor_is_its_precision_s_peak_or_its_memory_traffic() -> None:
    tasks = [_task("float32"), _task("int8"), _task("float16"), _task("bfloat16")]
    flops = 2 * 64**3
    unknown = CacheHierarchy((), "unknown")
    floors = roofline_floors_ms(tasks, LIMITS, unknown)
    assert floors[0] == pytest.approx(flops / 100e6)  # ms at 100 GFLOP/s
    assert floors[1] == pytest.approx(flops / 400e6)  # the int8 peak
    assert 2 not in floors  # fp16: no roof of its own
    assert floors[3] == pytest.approx(flops / 100e6)  # bf16 without vdpbf16ps: the fp32 peak
    # Arguments outgrowing the last-level cache: their bytes at the bandwidth, where that is slower.
    small_cache = CacheHierarchy((CacheLevel("L2", 2, 16 << 10),), "test")
    slow_memory = MachineLimits(100.0, 50.0, 0.1, 2, 8, "test", int8_gops=400.0, version=LIMITS_VERSION)
    bytes_moved = 3 * 64 * 64 * 4
    assert roofline_floors_ms(tasks[:1], slow_memory, small_cache)[0] == pytest.approx(bytes_moved / 0.1e6)
    assert roofline_floors_ms(tasks[:1], slow_memory, unknown)[0] == pytest.approx(flops / 100e6)


def test_limits_kept_by_an_older_kiln_are_measured_again_with_the_new_peaks(store) -> None:  # type: ignore[no-untyped-def]
    from tuner.timing.profile import host_key

    old = MachineLimits(100.0, 50.0, 10.0, 2, 8, "an older Kiln's")
    assert old.version == 1 and old.int8_gops is None
    store.save_machine_limits(host_key(HOST), old)
    measured: list[dict] = []

    def measure(target: dict) -> MachineLimits:
        measured.append(target)
        return LIMITS

    first = host_limits(store, HOST, measure)
    assert len(measured) == 1 and first.int8_gops == 400.0 and first.version == LIMITS_VERSION
    assert host_limits(store, HOST, measure).int8_gops == 400.0 and len(measured) == 1  # kept now
