"""The side-by-side timing's pieces: rotated rounds, the busy-machine check, and the report's figures."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from tuner.entities import LatencyReport, Timing
from tuner.timing.cpu_share import OtherCpuSampler
from tuner.timing.side_by_side import busy_warnings, round_orders


def test_rounds_rotate_so_that_nobody_always_runs_first() -> None:
    orders = round_orders(["untuned TVM", "Kiln", "onnxruntime"], 4)
    assert orders == [
        ["untuned TVM", "Kiln", "onnxruntime"],
        ["Kiln", "onnxruntime", "untuned TVM"],
        ["onnxruntime", "untuned TVM", "Kiln"],
        ["untuned TVM", "Kiln", "onnxruntime"],
    ]
    assert all(sorted(order) == sorted(orders[0]) for order in orders)
    assert round_orders([], 3) == []


def test_timing_reports_the_median_and_range_of_its_rounds() -> None:
    t = Timing((2.0, 1.0, 4.0))
    assert (t.median_ms, t.min_ms, t.max_ms) == (2.0, 1.0, 4.0)
    assert t.spread == pytest.approx(1.5)
    assert Timing((1.0, 3.0)).median_ms == 2.0
    assert Timing((5.0,)).spread == 0.0


def test_a_report_survives_its_json_form() -> None:
    report = LatencyReport(
        timings={"Kiln": Timing((1.0, 1.1, 0.9)), "onnxruntime": Timing((2.0, 2.2, 2.1))},
        warnings=("w",),
        other_cpu_share=0.1,
        load_average=0.5,
    )
    assert LatencyReport.from_dict(report.to_dict()) == report


def test_busy_warnings_name_disagreeing_rounds_and_a_busy_machine() -> None:
    calm = {"Kiln": Timing((1.0, 1.05, 0.98)), "onnxruntime": Timing((2.0, 2.1, 2.05))}
    assert busy_warnings(calm, 0.02) == ()
    assert busy_warnings(calm, None) == ()
    skewed = {**calm, "onnxruntime": Timing((2.0, 8.0, 2.1))}
    (warning,) = busy_warnings(skewed, 0.02)
    assert "onnxruntime" in warning and "disagree" in warning and "2.000 to 8.000 ms" in warning
    (busy,) = busy_warnings(calm, 0.6)
    assert "busy" in busy and "60 %" in busy


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the busy check reads /proc/stat (Linux)")
def test_another_process_spinning_shows_as_other_cpu_use() -> None:
    sampler = OtherCpuSampler()
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.5)
        share = sampler.share()  # before the spinner is waited for, its CPU time is not Kiln's own
    finally:
        spinner.kill()
        spinner.wait()
    assert share is not None
    # One process spinning on one of this machine's CPUs.
    cpus = os.cpu_count() or 1
    assert share > 0.6 / cpus, share


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the busy check reads /proc/stat (Linux)")
def test_the_timing_childrens_own_cpu_is_not_other_processes_use(tmp_path: Path) -> None:
    """Kiln's timing children are the fork server's, not the caller's: each reports its CPU time, which the
    busy check then leaves out (it once read every measurement as a busy machine)."""
    from tuner.timing.side_by_side import run_child

    model = tmp_path / "matmul.onnx"
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1024, 1024])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1024, 1024])
    graph = onnx.helper.make_graph([onnx.helper.make_node("MatMul", ["x", "x"], ["y"])], "g", [x], [y])
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), model)
    npz = tmp_path / "inputs.npz"
    np.savez(npz, arg0=np.ones((1024, 1024), np.float32))

    run_child(["onnxruntime", str(model), str(npz), "0.1"])  # the fork server is up: only the child is timed
    sampler = OtherCpuSampler()
    result = run_child(["onnxruntime", str(model), str(npz), "1.5"])
    counted, left_out = sampler.share(), sampler.share(result["cpu_s"])
    assert result["calls"] >= 5 and result["cpu_s"] > 0.5  # 1.5 s of calls, on at least one core
    assert counted is not None and left_out is not None
    cpus = os.cpu_count() or 1
    # Without the child's own time, what it used looks like another process's.
    assert counted - left_out > 0.3 / cpus, (counted, left_out)


class _FakeClock:
    """``time.perf_counter`` of a model whose every call takes ``call_s``."""

    def __init__(self, call_s: float) -> None:
        self.now = 100.0
        self.call_s = call_s
        self.calls = 0

    def perf_counter(self) -> float:
        return self.now

    def call(self) -> None:
        self.calls += 1
        self.now += self.call_s


@pytest.mark.parametrize(
    ("call_s", "budget_s", "timed", "calls"),
    [  # times that binary fractions hold exactly
        # a fast call: ten warm-up calls, then calls until the budget is spent
        (1 / 64, 1.0, 64, 75),
        # over 50 ms, under the budget: no warm-up, MIN_CALLS (5) of it although they overrun the budget
        (1 / 16, 1 / 8, 5, 6),
        # over the budget: timed from its first run, then while the next ends within 5 budgets of its start
        (1 / 4, 1 / 8, 2, 2),
        # a call longer than 5 budgets: its first run alone
        (2.0, 1 / 8, 1, 1),
    ],
)
def test_a_slow_call_is_timed_fewer_times_than_a_fast_one(
    monkeypatch: pytest.MonkeyPatch, call_s: float, budget_s: float, timed: int, calls: int
) -> None:
    import tuner.timing.calls as call_timing

    clock = _FakeClock(call_s)
    monkeypatch.setattr(call_timing.time, "perf_counter", clock.perf_counter)
    median_ms, count = call_timing.median_call_ms(clock.call, budget_s)
    assert (count, clock.calls) == (timed, calls)
    assert median_ms == pytest.approx(call_s * 1e3)
