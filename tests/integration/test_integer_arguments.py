"""A kernel indexed by an integer argument (an embedding's token ids) is measured with valid indices:
MetaSchedule's random bits would make it read far outside its table and crash on every candidate."""

from __future__ import annotations

import pytest

from kiln_tvm import ms
from tests.gather_kernel import built_gather
from tuner.tune import MeasureConfig, make_runner

pytestmark = pytest.mark.slow


def test_a_gather_is_measured_locally() -> None:
    path, args = built_gather()
    config = MeasureConfig(number=1, min_repeat_ms=1)
    (future,) = make_runner(config).run([ms.runner.RunnerInput(path, "cpu", args)])
    result = future.result()
    assert result.error_msg is None, result.error_msg
    assert len(result.run_secs) == config.repeat
