"""The machine's measured limits: the FMA kernel keeps its accumulators in registers and computes what it
claims, the triad computes STREAM's triad, the cache size is read from sysfs, and the figures come back."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kiln_tvm import tvm
from schedules.loops import fp32_lanes
from tuner.targets import host_target, to_tvm_target
from tuner.timing.cpu_share import BUSY_CPU_SHARE
from tuner.timing.roofline import (
    FMA_CHAINS,
    fma_peak_kernel,
    last_level_cache_bytes,
    measure_bandwidth,
    measure_limits,
    quiet_best,
    triad_kernel,
)

TARGET = host_target()
LANES = fp32_lanes(to_tvm_target(TARGET))


def _compile(func: tvm.tirx.PrimFunc, name: str) -> tvm.runtime.Module:
    return tvm.compile(tvm.IRModule({name: func}), target=to_tvm_target(TARGET)).mod


def test_vector_lanes_follow_the_cpu_features() -> None:
    flags = Path("/proc/cpuinfo").read_text().split()
    expected = 16 if "avx512f" in flags else 8 if "avx" in flags else 4
    assert expected == LANES


@pytest.mark.parametrize(
    ("mcpu", "lanes"), [("znver4", 16), ("znver3", 8), ("haswell", 8), ("emeraldrapids", 16)]
)
def test_vector_lanes_of_named_cpus_come_from_their_own_features(mcpu: str, lanes: int) -> None:
    # Not this machine's: LLVM's llvm_get_vector_width says 512 bits for znver3.
    assert fp32_lanes(to_tvm_target({"kind": "llvm", "mcpu": mcpu})) == lanes


def test_fma_kernel_computes_its_chains() -> None:
    threads, iterations, step = 2, 1000, 0.25
    lib = _compile(fma_peak_kernel(LANES, FMA_CHAINS, threads), "fma_peak")
    seed = np.array([1.0] * LANES + [step] * LANES, dtype="float32")
    out = tvm.runtime.tensor(np.zeros((threads, LANES * FMA_CHAINS), dtype="float32"))
    lib["fma_peak"](tvm.runtime.tensor(seed), out, iterations)
    # acc <- acc * 1 + step, from acc = 1: exact in fp32 for these values.
    np.testing.assert_array_equal(out.numpy(), np.full_like(out.numpy(), 1.0 + iterations * step))


def test_fma_kernel_keeps_its_accumulators_in_registers() -> None:
    lib = _compile(fma_peak_kernel(LANES, FMA_CHAINS, 2), "fma_peak")
    ll = lib.inspect_source("ll")
    assert "TVMBackendAllocWorkspace" not in ll  # the accumulators are a stack slot, not a heap buffer
    asm = lib.inspect_source("s")
    register = {16: "zmm", 8: "ymm", 4: "xmm"}[LANES]
    loop = _hottest_loop(asm)
    fmas = re.findall(rf"vfmadd\w+\s+[^\n]*%{register}", loop)
    assert len(fmas) >= FMA_CHAINS, loop
    # Nothing of the accumulators goes to memory inside the loop: no store at all.
    assert not re.search(r"\bvmov\w*\s+%[xyz]mm\d+, [^\n]*\(", loop), loop


def _hottest_loop(asm: str) -> str:
    """The body of the innermost loop holding FMAs: the shortest span from a label to a jump back to it.

    Not the first such span: LLVM may place an unrolled loop's remainder above the loop, where a
    conditional jump into it from below looks like a back edge around the outer loop's stores."""
    lines = asm.splitlines()
    labels = {line[:-1]: i for i, line in enumerate(lines) if re.match(r"^\.LBB\w+:$", line)}
    bodies = []
    for j, line in enumerate(lines):
        match = re.match(r"^\s+j\w+\s+(\.LBB\w+)$", line)
        if match and match.group(1) in labels and labels[match.group(1)] < j:
            body = "\n".join(lines[labels[match.group(1)] : j + 1])
            if "vfmadd" in body:
                bodies.append(body)
    if not bodies:
        raise AssertionError("no loop with FMAs in the kernel's assembly")
    return min(bodies, key=len)


def test_triad_kernel_computes_the_triad() -> None:
    length = 2 * LANES * 37
    lib = _compile(triad_kernel(length, LANES, 2), "triad")
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(length).astype("float32") for _ in range(2))
    c = tvm.runtime.tensor(np.zeros(length, dtype="float32"))
    lib["triad"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
    # LLVM may fuse the multiply and add into one FMA, which rounds once instead of twice.
    np.testing.assert_allclose(c.numpy(), a + np.float32(3.0) * b, rtol=1e-6, atol=1e-6)


def test_last_level_cache_is_the_highest_data_level(tmp_path: Path) -> None:
    for name, level, kind, size in [
        ("index0", 1, "Data", "32K"),
        ("index1", 1, "Instruction", "32K"),
        ("index2", 2, "Unified", "1024K"),
        ("index3", 3, "Unified", "32768K"),
    ]:
        index = tmp_path / name
        index.mkdir()
        (index / "level").write_text(f"{level}\n")
        (index / "type").write_text(f"{kind}\n")
        (index / "size").write_text(f"{size}\n")
    assert last_level_cache_bytes(tmp_path) == 32 << 20
    assert last_level_cache_bytes(tmp_path / "missing") is None


# Bounds no machine of this kind crosses, whatever its load: a figure outside them is in the wrong unit or
# counts the wrong work. At most two FMA pipes of LANES fp32 lanes, 2 FLOPs each, at 6 GHz, per thread; at
# least 1 GFLOP/s (a vector FMA loop on one core of a loaded VM does far more). Bandwidth: 0.5 to 2,000 GB/s.
MAX_GFLOPS_PER_THREAD = 2 * LANES * 2 * 6.0
MIN_GFLOPS_PER_THREAD = 1.0
BANDWIDTH_GBS = (0.5, 2000.0)


@pytest.mark.serial  # a rate measured beside other tests is theirs to share
def test_bandwidth_of_a_small_stream_is_a_physical_rate() -> None:
    rate = measure_bandwidth(TARGET, threads=2, repeats=1, array_bytes=1 << 20)
    assert BANDWIDTH_GBS[0] < rate < BANDWIDTH_GBS[1], rate


@pytest.mark.slow
@pytest.mark.serial
def test_measured_limits_are_physical_and_say_how() -> None:
    limits = measure_limits(TARGET, repeats=1)
    threads = limits.threads
    assert MIN_GFLOPS_PER_THREAD < limits.peak_gflops_one_thread < MAX_GFLOPS_PER_THREAD, limits
    assert MIN_GFLOPS_PER_THREAD < limits.peak_gflops < MAX_GFLOPS_PER_THREAD * threads, limits
    assert BANDWIDTH_GBS[0] < limits.bandwidth_gbs < BANDWIDTH_GBS[1], limits
    assert limits.vector_lanes == LANES and limits.threads == TARGET["num-cores"]
    assert f"{FMA_CHAINS} independent chains" in limits.how
    assert set(limits.as_dict()) >= {"peak_gflops", "bandwidth_gbs", "how"}


def test_the_bandwidth_arrays_are_bounded_whatever_cache_the_machine_reports() -> None:
    from tuner.timing.roofline import MAX_STREAM_BYTES, MIN_STREAM_BYTES, stream_array_bytes

    assert stream_array_bytes(None) == MIN_STREAM_BYTES == 64 << 20
    assert stream_array_bytes(24 << 20) == 96 << 20  # 4x a real 24 MiB L3
    # A VM that reports its host's 480 MB as its last-level cache: 3 x 128 MiB, not 3 x 1.9 GB.
    assert stream_array_bytes(480_000_000) == MAX_STREAM_BYTES == 128 << 20


class _Sampler:
    """Stands in for :class:`OtherCpuSampler`: each try's share of the CPUs other processes used."""

    def __init__(self, shares: list[float | None]) -> None:
        self.shares = shares

    def __call__(self) -> _Sampler:
        return self

    def share(self, helpers_cpu_s: float = 0.0) -> float | None:
        return self.shares.pop(0)


def test_a_figure_measured_while_the_machine_is_busy_is_taken_again_and_the_best_kept() -> None:
    figures, pauses = iter([110.0, 230.0, 220.0]), []
    best, share = quiet_best(lambda: next(figures), (0.5, 1.0, 2.0), _Sampler([0.5, 0.1]), pauses.append)
    assert (best, share) == (230.0, 0.1) and pauses == [0.5]
    # Busy through every try: the best of them, with the quietest try's share (over the threshold).
    figures = iter([100.0, 120.0, 90.0])
    best, share = quiet_best(lambda: next(figures), (0.5, 1.0), _Sampler([0.6, 0.5, 0.4]), pauses.append)
    assert (best, share) == (120.0, 0.4) and pauses == [0.5, 0.5, 1.0] and share > BUSY_CPU_SHARE
    # Where the share cannot be read (not Linux), the first figure stands.
    assert quiet_best(lambda: 5.0, (0.5,), _Sampler([None]), pauses.append) == (5.0, None)


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the busy check reads /proc/stat (Linux)")
def test_limits_measured_beside_processes_spinning_on_every_cpu_say_they_were_disturbed() -> None:
    """The check of :func:`measure_limits` is real: processes spinning on every CPU through all its tries
    are seen, and the limits say the machine was busy (so the next jobs measure them again). Whether a
    quiet machine reads as quiet depends on what else runs on it, and how much of the CPUs the measuring
    threads get beside the spinners depends on the scheduler (a 2-thread kernel that waits for its slower
    thread once got 6 %): neither is asserted."""
    cpus = os.cpu_count() or 1
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cpus)]
    try:
        time.sleep(0.5)
        limits = measure_limits(TARGET, repeats=1, pauses_s=(0.1,))
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    share = limits.other_cpu_share
    assert share is not None and share > BUSY_CPU_SHARE and limits.disturbed, limits
