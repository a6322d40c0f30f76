"""A tuned job profiles its compiled model: the kernels' times account for the model's run, each kernel
sits under this machine's measured roofline, and onnxruntime's own profile is matched to the kernels."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from tests.host_jobs import run_host_job
from tests.model_builders import build_small_cnn
from tuner.entities import JobSpec, JobStatus
from tuner.jobs.pipeline import run_job
from tuner.jobs.submission import submit_job
from tuner.settings import Settings
from tuner.store import Store
from tuner.targets import host_target
from tuner.timing.profile import LIMIT_MEASUREMENTS, RUNTIME_ROW, host_key

pytestmark = pytest.mark.slow

#: How far the kernels' sum may be from the run before the profile is wrong rather than noisy: a unit
#: slip, kernels left out or counted twice. How near they come is a timing, measured in
#: bench/profile_agreement.py: on a 2-core VM this model's run has been 2-25 % outside its kernels from
#: one run to the next, and a test asserts no timing.
GROSS_FACTOR = 2.0


def plausible_peak_range(lanes: int, threads: int) -> tuple[float, float]:
    """GFLOP/s an fp32 FMA peak can have: at least one vector FMA per cycle at 1 GHz per thread, at most
    two FMA pipes at 6 GHz (2 FLOPs per lane per FMA)."""
    return 2 * lanes * 1.0 * threads, 2 * lanes * 2 * 6.0 * threads


def test_a_tuned_cnn_is_profiled_kernel_by_kernel_under_the_roofline(
    sqlite_store: Store, settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "cnn.onnx"
    # 128x128 (~0.8 ms a run): at 64x64 (~0.2 ms) an Intel Xeon VM spent 66 us of a 225 us run outside the
    # kernels (29 %; 17 % at 128x128), the VM's own work between ~14 kernel calls weighing more on a tiny run.
    onnx.save(build_small_cnn(image_size=128), str(path))
    # 24 trials: with 8, some runs left a convolution at twice its tuned time, and its time in place
    # then fell short of its time in the run by a quarter of the run (seen twice in six runs, Zen 4).
    profiled = settings.model_copy(update={"profile_budget_s": 2.0})
    result = run_host_job(sqlite_store, profiled, path, trials=24)
    model_id = result.job.spec.model_id
    assert result.job.status is JobStatus.SUCCEEDED, result.job.error

    profile = sqlite_store.get_job_profile(result.job.id)
    # The kernels, each timed in place, account for the model's run timed uninstrumented beside them.
    assert profile.run_us is not None and profile.run_us > 0
    kernels_us = profile.kernels_us
    assert kernels_us == pytest.approx(sum(k.total_us for k in profile.kernels if k.kind == "kernel"))
    assert profile.run_us / GROSS_FACTOR <= kernels_us <= GROSS_FACTOR * profile.run_us, (
        kernels_us,
        profile.run_us,
    )
    # The run's time outside the kernels is the runtime's row, and the rows add up to the profile's total.
    runtime = next(k for k in profile.kernels if k.name == RUNTIME_ROW)
    assert runtime.total_us == pytest.approx(max(0.0, profile.run_us - kernels_us))
    assert profile.total_us == pytest.approx(sum(k.total_us for k in profile.kernels))
    assert profile.latency_ms == pytest.approx(result.job.tuned_latency_ms)
    assert sum(k.share for k in profile.kernels) == pytest.approx(1.0)
    assert [k.total_us for k in profile.kernels] == sorted(
        (k.total_us for k in profile.kernels), reverse=True
    )

    kernels = [k for k in profile.kernels if k.kind == "kernel"]
    names = {t.name for t in result.tasks}
    convs = [k for k in kernels if "conv2d" in k.name]
    assert len(convs) == 3 and all(any(k.name.startswith(n) for n in names) for k in convs)
    assert any(k.name == RUNTIME_ROW for k in profile.kernels)
    limits = profile.limits
    assert limits is not None and limits.host == host_key(host_target())
    low, high = plausible_peak_range(limits.vector_lanes, limits.threads)
    assert low <= limits.peak_gflops <= high, limits
    assert 1 <= limits.bandwidth_gbs <= 2000, limits

    # onnxruntime's own profile of the same model: each of its three convolutions matched to one of Kiln's.
    matched = [n.kernel for n in profile.onnxruntime_nodes if n.op in ("Conv", "FusedConv")]
    assert len(matched) == 3 and set(matched) == {k.name for k in convs}
    assert all(k.compared and k.onnxruntime_us and k.onnxruntime_us > 0 for k in convs)
    assert profile.onnxruntime_total_us and profile.onnxruntime_total_us > 0 and not profile.onnxruntime_note
    assert profile.onnxruntime_latency_ms and profile.onnxruntime_latency_ms > 0

    # The machine's limits were measured once and kept: a second job reuses them. Limits measured while
    # other processes kept the CPUs busy through every try are measured again, each figure kept at its best.
    again = submit_job(sqlite_store, JobSpec(model_id=model_id, target=host_target(), trials=0))
    assert run_job(sqlite_store, profiled, again.id).job.status is JobStatus.SUCCEEDED
    best = sqlite_store.get_job_profile(again.id).limits
    assert best is not None
    if limits.disturbed and limits.measurements < LIMIT_MEASUREMENTS:
        assert best.measurements == limits.measurements + 1, (best, limits)
        assert best.peak_gflops >= limits.peak_gflops, (best, limits)
    else:
        assert best == limits

    for conv in convs:
        assert conv.flops and conv.bytes and conv.gflops and conv.intensity
        assert conv.gflops > 0 and conv.intensity > 0
        attainable = conv.attainable_gflops(best)
        assert attainable is not None and 0 < attainable <= best.peak_gflops
    if best.disturbed:
        # Other processes kept the CPUs busy through every measurement: the roofs may be low, and the kernels
        # cannot be checked against them here.
        pytest.skip(
            f"other processes used {best.other_cpu_share:.0%} of the CPUs through every limit measured"
        )
    # Each convolution runs under the roofline of the best limits known (a little over it on a CPU that
    # boosts one core's clock).
    for conv in convs:
        assert conv.gflops <= 1.25 * conv.attainable_gflops(best), (
            f"{conv.name}: {conv.gflops:.1f} GFLOP/s over the roof; limits {best.peak_gflops:.1f} GFLOP/s on "
            f"{best.threads} threads, {best.peak_gflops_one_thread:.1f} on one, others' share "
            f"{best.other_cpu_share}, disturbed {best.disturbed}, {best.measurements} measurement(s); the first "
            f"job's: {limits.peak_gflops:.1f}, share {limits.other_cpu_share}, {limits.measurements}"
        )
