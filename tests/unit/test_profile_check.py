"""A profile's figures checked against each other and the job's: agreeing ones pass, a busy machine's are
flagged with the numbers that disagree."""

from __future__ import annotations

from tuner.entities import KernelProfile, ModelProfile, Task
from tuner.timing.profile_check import check_profile, kernel_bests


def _profile(conv_us: float, dense_us: float, run_us: float, latency_ms: float) -> ModelProfile:
    kernels = (
        KernelProfile("fused_conv2d_add_relu_prepacked", "kernel", 2, conv_us, 0.0, flops=1e6, bytes=10_000),
        KernelProfile("fused_matmul_add", "kernel", 1, dense_us, 0.0, flops=1e5, bytes=1_000),
        KernelProfile("VM runtime (the rest of the run)", "runtime", 9, 5.0, 0.0),
    )
    return ModelProfile(
        kernels, runs=5, total_us=conv_us + dense_us + 5.0, latency_ms=latency_ms, run_us=run_us
    )


def _task(name: str, best_us: float | None) -> Task:
    return Task(1, "j", 1, name, 2, 1e6, "hash", trials=8, best_latency_us=best_us)


TASKS = [_task("fused_conv2d_add_relu", 21.2), _task("fused_matmul_add", 3.0)]


def test_figures_that_agree_raise_nothing() -> None:
    profile = _profile(conv_us=44.0, dense_us=3.1, run_us=55.0, latency_ms=0.052)
    bests = kernel_bests(profile, TASKS)
    # The per-inference half of a prepacked kernel is its task's kernel.
    assert bests == {"fused_conv2d_add_relu_prepacked": 21.2, "fused_matmul_add": 3.0}
    check = check_profile(profile, bests)
    assert check.warnings == [] and not check.disturbed and check.slow_kernels == {}


def test_a_busy_machines_profile_says_what_disagrees_and_by_how_much() -> None:
    # The figures: kernels 186.3 µs against a 106.6 µs run, the job measured 73.8 µs, and a
    # convolution at 87.8 µs per call whose tuned best is 21.2 µs.
    profile = _profile(conv_us=2 * 87.8, dense_us=10.7, run_us=106.6, latency_ms=0.0738)
    check = check_profile(profile, kernel_bests(profile, TASKS))
    assert check.disturbed and len(check.warnings) == 3
    kernels, run, slow = check.warnings
    assert "186.3 µs: 175 % of the 106.6 µs run" in kernels and "up to 1.7×" in kernels
    assert "106.6 µs, 1.4× the 73.8 µs the job measured" in run
    assert "2 of the kernels" in slow
    assert "fused_conv2d_add_relu_prepacked, 87.8 µs against 21.2 µs, 4.1×" in slow
    assert check.slow_kernels["fused_matmul_add"] == 10.7 / 3.0


def test_a_job_latency_far_above_the_profiled_run_is_said_too() -> None:
    # The README's CNN: rounds of 54 and 105 µs in the job's measurement, a 54 µs run while profiling.
    profile = _profile(conv_us=44.0, dense_us=3.1, run_us=54.0, latency_ms=0.1054)
    (warning,) = check_profile(profile, kernel_bests(profile, TASKS)).warnings
    assert warning.startswith("The job measured 105.4 µs, 2.0× the 54.0 µs run timed while profiling")


def test_a_kernel_without_a_tuned_best_is_not_compared() -> None:
    profile = _profile(conv_us=44.0, dense_us=30.0, run_us=80.0, latency_ms=0.08)
    check = check_profile(profile, kernel_bests(profile, [_task("fused_matmul_add", None)]))
    assert check.warnings == [] and check.tuned_best_us == {}


def test_a_job_that_measured_fewer_trials_than_asked_says_why() -> None:
    from datetime import datetime, timezone

    from tuner.entities import Job, JobSpec, JobStatus, trials_shortfall

    def job(trials: int, budget: float | None, tuning_s: float) -> Job:
        spec = JobSpec(model_id="m", target={"kind": "llvm"}, trials=trials, time_budget_s=budget)
        now = datetime.now(timezone.utc)
        return Job("j", spec, "llvm", JobStatus.SUCCEEDED, now, tuning_s=tuning_s)

    tasks = [_task("fused_conv2d", 30.0), _task("transpose1", 1.0), _task("mean1", 1.0)]
    tasks = [
        Task(t.id, t.job_id, t.workload_id, t.name, t.weight, t.flops, t.workload_hash, trials=n)
        for t, n in zip(tasks, (16, 2, 7), strict=True)
    ]
    note = trials_shortfall(job(32, None, 20.0), tasks)
    assert note is not None and note.startswith("25 of the 32 trials were measured: the search had no new")
    assert note.endswith("(fewest trials: transpose1: 2, mean1: 7, fused_conv2d: 16)")
    assert "time budget ended" in (trials_shortfall(job(64, 30.0, 30.0), tasks) or "")
    assert trials_shortfall(job(25, None, 20.0), tasks) is None
