"""Budget arithmetic of the tuner: validation, the size of search rounds, and the seeds' share of the time."""

from __future__ import annotations

import math
import time

import pytest

from tuner.entities import Budget, Task
from tuner.errors import InvalidSpec
from tuner.metaschedule.builder import BUILD_TIMEOUT_STEP_S, PooledBuilder, build_timeout
from tuner.metaschedule.scheduler import KilnTaskScheduler
from tuner.tune import _seed_phase_stop, trials_per_iter


def test_budget_rejects_negative_trials_and_zero_per_task_cap() -> None:
    with pytest.raises(InvalidSpec, match="trials must be >= 0"):
        Budget(-1)
    with pytest.raises(InvalidSpec, match="per task must be >= 1"):
        Budget(10, max_trials_per_task=0)
    assert Budget(0).trials == 0


def test_a_budget_is_trials_time_or_both() -> None:
    assert Budget(None, time_s=20).trials is None
    assert Budget(50, time_s=1.5).time_s == 1.5
    with pytest.raises(InvalidSpec, match="trials, a time budget, or both"):
        Budget(None)
    for bad in (0, -5.0, float("inf"), float("nan"), "30m", True):
        with pytest.raises(InvalidSpec, match="positive number of seconds"):
            Budget(10, time_s=bad)  # type: ignore[arg-type]


def test_a_time_only_budget_uses_full_rounds() -> None:
    assert trials_per_iter(Budget(None, time_s=60), 40, preferred=16) == 16
    assert trials_per_iter(Budget(None, 4, time_s=60), 40, preferred=16) == 4


@pytest.mark.parametrize(
    ("trials", "tasks", "cap", "expected"),
    [
        (300, 6, None, 16),  # plenty: the preferred round size
        (8, 2, None, 4),  # a small budget is shared so every task gets measured
        (4, 6, None, 2),  # never below 2 candidates a round
        (300, 6, 8, 8),  # a per-task cap bounds the round
    ],
)
def test_rounds_shrink_for_small_budgets(trials: int, tasks: int, cap: int | None, expected: int) -> None:
    assert trials_per_iter(Budget(trials, cap), tasks, preferred=16) == expected


def test_a_tasks_gflops_are_its_flops_over_its_best_latency_or_none_while_unknown() -> None:
    def task(flops: float, latency_us: float | None) -> Task:
        return Task(1, "j", 1, "t", 1, flops, "h", best_latency_us=latency_us)

    assert task(2e9, 1e6).gflops == pytest.approx(2.0)
    assert task(1e6, None).gflops is None
    assert task(0.0, 5.0).gflops is None
    assert task(1e6, math.nan).gflops is None


def test_the_seeds_stop_when_cancelled_or_past_their_share_of_the_time_left() -> None:
    assert not _seed_phase_stop(None, None)()  # no time budget, not cancelled: all tasks get seeds
    assert not _seed_phase_stop(None, lambda: None)()
    assert not _seed_phase_stop(lambda: False, lambda: 3600.0)()
    assert _seed_phase_stop(lambda: True, lambda: 3600.0)()  # cancelled
    assert _seed_phase_stop(None, lambda: 0.0)()  # the budget is spent
    assert _seed_phase_stop(None, lambda: -5.0)()
    stop = _seed_phase_stop(None, lambda: 0.2)  # half of 0.2 s: over in 0.1 s
    time.sleep(0.15)
    assert stop()


def test_build_timeouts_shrink_to_the_time_left_in_whole_steps() -> None:
    assert build_timeout(60.0, None) == 60.0  # no time budget
    assert build_timeout(60.0, 500.0) == 60.0
    assert build_timeout(60.0, 35.0) == 30.0
    assert build_timeout(60.0, 3.0) == BUILD_TIMEOUT_STEP_S  # at least one step
    assert build_timeout(5.0, 3.0) == 5.0  # never above the builder's own


def test_a_builder_under_a_time_budget_builds_with_the_time_left() -> None:
    from kiln_tvm import ms, tvm
    from tuner.targets import host_target, to_tvm_target

    te = tvm.te
    a = te.placeholder((64,), name="a")
    mod = tvm.IRModule({"main": te.create_prim_func([a, te.compute((64,), lambda i: a[i] * 2.0, name="b")])})
    left = [500.0]
    builder = PooledBuilder(max_workers=1, time_left_s=lambda: left[0])
    try:
        inputs = [ms.builder.BuilderInput(mod, to_tvm_target(host_target()))]
        assert builder.current_timeout() == 60.0 and builder.build(inputs)[0].error_msg is None
        left[0] = 25.0  # the pool is started again with the shorter timeout, and still builds
        assert builder.current_timeout() == 20.0 and builder.build(inputs)[0].error_msg is None
    finally:
        builder.shutdown()


def test_a_task_s_expected_gain_is_its_weighted_headroom_over_its_roofline() -> None:
    scheduler = KilnTaskScheduler(known_ms={0: 2.0, 1: 2.0, 2: 1.0}, floor_ms={0: 1.9, 1: 0.5})
    # Task 0 is 0.1 ms above its roofline, task 1 1.5 ms, task 2 has no roofline (its whole 1 ms counts).
    assert scheduler.expected_gain(0, weight=1) == pytest.approx(0.8 * 0.1)
    assert scheduler.expected_gain(1, weight=1) == pytest.approx(0.8 * 1.5)
    assert scheduler.expected_gain(2, weight=3) == pytest.approx(0.8 * 1.0 * 3)
    assert scheduler.expected_gain(3, weight=1) is None  # nothing measured
    assert scheduler._steepest([0, 1, 2], [1.0, 1.0, 1.0]) == 1
    assert scheduler._steepest([0, 1, 2], [1.0, 1.0, 2.0]) == 2  # twice the calls: 1.6 > 1.2
    # Within 5 % of its roofline a task is done; 0.5 ms off a 2 ms best it is not.
    assert [scheduler.within_roofline(i) for i in range(4)] == [True, False, False, False]
    assert scheduler.stopped_at_roofline == set()  # asking stops nothing


def test_a_task_is_done_within_5_percent_of_its_roofline_and_not_before() -> None:
    scheduler = KilnTaskScheduler(known_ms={0: 1.0, 1: 1.0, 2: 1.0}, floor_ms={0: 0.951, 1: 0.949, 2: 1.2})
    assert [scheduler.within_roofline(i) for i in range(3)] == [True, False, True]  # faster than its roof too


def test_the_scheduler_starts_no_batch_that_its_median_batch_says_would_not_fit() -> None:
    """What keeps a time-budgeted job within its budget, checked on the scheduler's own arithmetic (the
    integration test cannot bound a shared machine's wall clock)."""
    left = [5.0]
    scheduler = KilnTaskScheduler(time_left_s=lambda: left[0])
    assert not scheduler._must_stop()  # no batch timed yet: only an exhausted budget stops it
    scheduler.batch_s = [3.0, 6.0, 4.0]  # median 4 s
    assert not scheduler._must_stop()
    left[0] = 4.0
    assert scheduler._must_stop()
    left[0] = 0.0
    assert scheduler._must_stop()
    unlimited = KilnTaskScheduler(time_left_s=lambda: None)
    unlimited.batch_s = [3.0]
    assert not unlimited._must_stop()
    cancelled = KilnTaskScheduler(should_stop=lambda: True, time_left_s=lambda: 100.0)
    assert cancelled._must_stop()
