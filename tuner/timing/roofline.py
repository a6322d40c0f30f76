"""This machine's limits, measured: its fp32 FMA peak and its memory bandwidth, the two roofs of a roofline.

Both come from small kernels TVM compiles for the target, run on all its cores:

* **FMA peak**: each thread keeps ``chains`` vector accumulators in registers and applies a fused
  multiply-add to each of them ``iterations`` times. The chains are independent, so the FMA pipes stay
  full whatever their latency (12 chains cover two pipes of latency 4 with room to spare, and still fit
  AVX2's 16 registers). Counting the clock from ``/proc/cpuinfo`` instead is wrong on a VM or a boosting
  CPU: the Zen 4 VMs Kiln runs on report 2.6 GHz and run at 3.7.
* **Memory bandwidth**: STREAM's triad, ``c = a + 3 b``, over arrays several times the last-level cache,
  counted as STREAM counts it (three arrays moved per pass, no write-allocate traffic).

Each figure is the best of several repeats: a limit is what the machine can do, and a repeat disturbed
by another process only ever lowers it. A process busy through all the repeats (a fork server loading
TVM beside the job, another job) would still halve the peak of a 2-core machine, and the figure is kept
per host: so each figure is taken again, after a pause, while other processes used more than
:data:`~tuner.timing.cpu_share.BUSY_CPU_SHARE` of the CPUs, and the limits say when they never let it be.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kiln_tvm import tir_script as T
from kiln_tvm import tvm
from schedules.loops import fp32_lanes
from schedules.poly.caches import SYSFS_CACHE_DIR, read_sysfs_caches
from tuner.entities import MachineLimits
from tuner.entities.profile import LIMITS_VERSION
from tuner.targets import to_tvm_target
from tuner.timing.cpu_share import BUSY_CPU_SHARE, OtherCpuSampler
from tuner.timing.dot_peaks import DOT_CHAINS, dot_peak_timer, target_dot_products
from tuner.timing.peak_timer import REPEATS, best_seconds, rate_timer

#: Independent accumulator chains per thread in the FMA kernel.
FMA_CHAINS = 12
#: Smallest array the triad streams, per array: large enough to leave any cache on a small machine.
MIN_STREAM_BYTES = 64 << 20
#: Largest, per array (three are allocated): a VM can report its host's whole last-level cache (480 MB was
#: seen, which made the first job on a host allocate ~6 GB), and 128 MiB already leaves any cache a worker's
#: cores can use.
MAX_STREAM_BYTES = 128 << 20
#: Pauses before each new try of a figure measured while the machine was busy (a job's own helpers are
#: busy for a few seconds at most: a fork server loading TVM, a runtime's thread pool spinning down).
QUIET_PAUSES_S = (0.5, 1.0, 2.0)


def fma_peak_kernel(lanes: int, chains: int, threads: int) -> tvm.tirx.PrimFunc:
    """``out[t] = fma(...fma(seed[:lanes], 1, step)...)``: ``threads`` x ``chains`` accumulators of ``lanes``
    fp32 each, advanced by one FMA per iteration.

    The accumulators are a ``global``-scope buffer below 1 KiB allocated inside the thread's loop: TVM
    then gives it a stack slot that LLVM promotes to registers. A ``local`` buffer would be allocated
    through the runtime's workspace and every FMA's result stored to memory.
    """
    width = lanes * chains
    vector = f"float32x{lanes}"
    fma = f"llvm.fma.v{lanes}f32"

    @T.prim_func
    def fma_peak(
        seed: T.Buffer((2 * lanes,), "float32"),
        out: T.Buffer((threads, width), "float32"),
        iterations: T.int32,
    ):
        T.func_attr({"global_symbol": "fma_peak", "tirx.noalias": True})
        for t in T.parallel(threads):
            acc = T.alloc_buffer((width,), "float32", scope="global")
            for c in T.unroll(chains):
                acc[T.Ramp(c * lanes, 1, lanes)] = seed[T.Ramp(0, 1, lanes)]
            for _ in T.serial(iterations):
                for c in T.unroll(chains):
                    acc[T.Ramp(c * lanes, 1, lanes)] = T.call_llvm_pure_intrin(
                        vector,
                        fma,
                        acc[T.Ramp(c * lanes, 1, lanes)],
                        seed[T.Ramp(0, 1, lanes)],
                        seed[T.Ramp(lanes, 1, lanes)],
                    )
            for c in T.unroll(chains):
                out[t, T.Ramp(c * lanes, 1, lanes)] = acc[T.Ramp(c * lanes, 1, lanes)]

    return fma_peak


def triad_kernel(length: int, lanes: int, threads: int) -> tvm.tirx.PrimFunc:
    """STREAM triad ``c = a + 3 b`` on ``length`` fp32, one contiguous slice per thread, vectorized by
    ``lanes``. ``length`` must be a multiple of ``threads * lanes``."""
    per_thread = length // threads
    steps = per_thread // lanes

    @T.prim_func
    def triad(
        a: T.Buffer((length,), "float32"),
        b: T.Buffer((length,), "float32"),
        c: T.Buffer((length,), "float32"),
    ):
        T.func_attr({"global_symbol": "triad", "tirx.noalias": True})
        for t in T.parallel(threads):
            for i in T.serial(steps):
                for v in T.vectorized(lanes):
                    c[t * per_thread + i * lanes + v] = (
                        a[t * per_thread + i * lanes + v] + T.float32(3.0) * b[t * per_thread + i * lanes + v]
                    )

    return triad


def last_level_cache_bytes(cache_dir: Path = SYSFS_CACHE_DIR) -> int | None:
    """Size of cpu0's highest cache level from sysfs (``None`` where sysfs does not say)."""
    caches = read_sysfs_caches(cache_dir)
    return caches.levels[-1].bytes if caches.known else None


def stream_array_bytes(last_level_cache: int | None) -> int:
    """Bytes of each of the triad's three arrays: 4x the last-level cache, within the bounds above."""
    return min(MAX_STREAM_BYTES, max(MIN_STREAM_BYTES, 4 * (last_level_cache or 0)))


def fma_peak_timer(target: dict[str, Any], threads: int, repeats: int = REPEATS) -> Callable[[], float]:
    """:func:`fma_peak_kernel` compiled for ``threads`` threads of this machine: each call times it and
    returns its fp32 GFLOP/s (the compile paid once, outside every timing)."""
    tvm_target = to_tvm_target(target)
    lanes = fp32_lanes(tvm_target)
    lib = tvm.compile(
        tvm.IRModule({"fma_peak": fma_peak_kernel(lanes, FMA_CHAINS, threads)}), target=tvm_target
    )
    func = lib.mod["fma_peak"]
    seed = tvm.runtime.tensor(np.array([1.0] * lanes + [1e-7] * lanes, dtype="float32"))
    out = tvm.runtime.tensor(np.zeros((threads, lanes * FMA_CHAINS), dtype="float32"))
    return rate_timer(func, [seed, out], 2 * lanes * FMA_CHAINS * threads, repeats)


def bandwidth_timer(
    target: dict[str, Any], threads: int, repeats: int = REPEATS, array_bytes: int | None = None
) -> Callable[[], float]:
    """The triad compiled for ``threads`` threads over three arrays of ``array_bytes`` each (default: 4x the
    last-level cache, within :data:`MIN_STREAM_BYTES` and :data:`MAX_STREAM_BYTES`): each call times it
    and returns its GB/s."""
    tvm_target = to_tvm_target(target)
    lanes = fp32_lanes(tvm_target)
    if array_bytes is None:
        array_bytes = stream_array_bytes(last_level_cache_bytes())
    chunk = threads * lanes
    length = max(chunk, array_bytes // 4 // chunk * chunk)
    lib = tvm.compile(tvm.IRModule({"triad": triad_kernel(length, lanes, threads)}), target=tvm_target)
    arrays = [tvm.runtime.tensor(np.full(length, value, dtype="float32")) for value in (1.0, 2.0, 0.0)]
    return lambda: 3 * 4 * length / best_seconds(lib.mod["triad"], arrays, repeats) / 1e9


def measure_bandwidth(
    target: dict[str, Any], threads: int, repeats: int = REPEATS, array_bytes: int | None = None
) -> float:
    """STREAM triad GB/s on ``threads`` threads (see :func:`bandwidth_timer`)."""
    return bandwidth_timer(target, threads, repeats, array_bytes)()


def quiet_best(
    measure: Callable[[], float],
    pauses_s: tuple[float, ...] = QUIET_PAUSES_S,
    sampler: Callable[[], OtherCpuSampler] = OtherCpuSampler,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[float, float | None]:
    """The best of ``measure()``, taken again after each pause while other processes used more than
    :data:`BUSY_CPU_SHARE` of the CPUs; with the share they used during the quietest try (None where it
    cannot be read: the first figure is then kept)."""
    best, quietest = 0.0, None
    for pause_s in (*pauses_s, None):
        others = sampler()
        best = max(best, measure())
        share = others.share()
        if share is None:
            return best, quietest
        quietest = share if quietest is None else min(quietest, share)
        if share <= BUSY_CPU_SHARE or pause_s is None:
            break
        sleep(pause_s)
    return best, quietest


def measure_limits(
    target: dict[str, Any], repeats: int = REPEATS, pauses_s: tuple[float, ...] = QUIET_PAUSES_S
) -> MachineLimits:
    """Measure this machine's FMA peak (one thread and all), triad bandwidth, and int8 and bf16 peaks (all
    threads, :mod:`tuner.timing.dot_peaks`) for a host CPU ``target``, each taken again while other
    processes keep the machine busy (:func:`quiet_best`)."""

    threads = int(target.get("num-cores") or 1)
    lanes = fp32_lanes(to_tvm_target(target))
    figures = [quiet_best(fma_peak_timer(target, 1, repeats), pauses_s)]
    if threads > 1:
        figures.append(quiet_best(fma_peak_timer(target, threads, repeats), pauses_s))
    figures.append(quiet_best(bandwidth_timer(target, threads, repeats), pauses_s))
    peak_one, peak_all, bandwidth = figures[0][0], figures[-2][0], figures[-1][0]
    dots = target_dot_products(target)
    dot_peaks = {
        name: quiet_best(dot_peak_timer(dot, target, threads, repeats), pauses_s)
        for name, dot in dots.items()
    }
    figures.extend(dot_peaks.values())
    shares = [share for _, share in figures if share is not None]
    other_cpu_share = max(shares) if shares else None
    how = (
        f"FMA peak: {FMA_CHAINS} independent chains of {lanes}-lane fp32 FMAs per thread on {threads} "
        f"thread(s), best of {repeats}; bandwidth: STREAM triad c = a + 3b over arrays of at least "
        f"{MIN_STREAM_BYTES >> 20} MiB (4x the last-level cache, at most {MAX_STREAM_BYTES >> 20} MiB), 3 arrays "
        f"counted per pass, best of {repeats}; each taken again (up to {len(pauses_s)} times) while other "
        f"processes used more than {100 * BUSY_CPU_SHARE:.0f} % of the CPUs"
    )
    if dots:
        how += "; " + ", ".join(
            f"{name} peak: {DOT_CHAINS} independent chains of {dot.instruction} per thread, operations "
            "counted as FLOPs (a multiply-accumulate counts 2)"
            for name, dot in dots.items()
        )
    return MachineLimits(
        peak_gflops=peak_all,
        peak_gflops_one_thread=peak_one,
        bandwidth_gbs=bandwidth,
        threads=threads,
        vector_lanes=lanes,
        how=how,
        other_cpu_share=other_cpu_share,
        disturbed=other_cpu_share is not None and other_cpu_share > BUSY_CPU_SHARE,
        int8_gops=dot_peaks["int8"][0] if "int8" in dot_peaks else None,
        int8_instruction=dots["int8"].instruction if "int8" in dots else None,
        bf16_gflops=dot_peaks["bf16"][0] if "bf16" in dot_peaks else None,
        bf16_instruction=dots["bf16"].instruction if "bf16" in dots else None,
        version=LIMITS_VERSION,
    )
