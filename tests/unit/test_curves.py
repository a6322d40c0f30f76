"""The estimated latency read off a job's curve at checkpoints of measuring time."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from tuner.views.curves import JobCurve, JobCurvePoint, estimates_at

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=timezone.utc)


def _curve(*points: tuple[float, float | None]) -> JobCurve:
    return JobCurve(
        points=[
            JobCurvePoint(i, 1, i, 10.0, 10.0, estimate, T0 + timedelta(seconds=s), s + 5)
            for i, (s, estimate) in enumerate(points, start=1)
        ],
        warm_start_us={},
    )


def test_estimates_are_read_at_each_checkpoint_reached_then_after_the_last_trial() -> None:
    curve = _curve((0, None), (30, 900.0), (70, 800.0), (119, 700.0), (130, 650.0), (200, 600.0))
    assert estimates_at(curve) == [(0.0, None), (60.0, 900.0), (120.0, 700.0), (200.0, 600.0)]
    assert estimates_at(curve, (0.0, 100.0)) == [(0.0, None), (100.0, 800.0), (200.0, 600.0)]


def test_a_job_without_trials_has_no_estimates() -> None:
    assert estimates_at(JobCurve(points=[], warm_start_us={})) == []
    assert estimates_at(_curve((0, 500.0))) == [(0.0, 500.0)]  # one trial: the end is the start
