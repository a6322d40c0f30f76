"""Kiln's task scheduler in real tuning runs: trials go to the task that can take the most off the model's
latency, and a task at its roofline is searched no further."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kiln_tvm import estimate_flops, ms, structural_hash, tvm
from tuner.entities import Budget, MachineLimits, record_latency_s
from tuner.entities.profile import LIMITS_VERSION
from tuner.metaschedule.scheduler import ROOFLINE_STOP
from tuner.targets import host_target, to_tvm_target
from tuner.tune import MeasureConfig, roofline_floors_ms, tune_tasks

# Serial: which task gets the trials follows the latencies measured, which other tests' load would skew.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

TARGET = to_tvm_target(host_target())
CONFIG = MeasureConfig(number=1, min_repeat_ms=5, trials_per_iter=4, default_schedules=False)


def matmul_relu(n: int) -> tvm.IRModule:
    te = tvm.te
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    d = te.compute((n, n), lambda i, j: te.max(c[i, j], 0.0), name="D")
    return tvm.IRModule({"main": te.create_prim_func([a, b, d])})


def _tasks(*sizes: int) -> list[Any]:
    return [
        ms.ExtractedTask(f"matmul_relu_{n}", mod, TARGET, [mod], 1)
        for n, mod in ((n, matmul_relu(n)) for n in sizes)
    ]


def _trials_per_task(database: Any, tasks: list[Any]) -> list[int]:
    counts = Counter(structural_hash(r.workload.mod) for r in database.get_all_tuning_records())
    return [counts[structural_hash(t.dispatched[0])] for t in tasks]


def test_the_heavier_task_of_two_gets_more_trials(tmp_path: Path) -> None:
    tasks = _tasks(256, 24)  # ~33 MFLOP against ~28 kFLOP a call
    database = ms.database.MemoryDatabase()
    tune_tasks(tasks, TARGET, database, budget=Budget(trials=40), config=CONFIG, work_dir=tmp_path / "ms")
    heavy, light = _trials_per_task(database, tasks)
    assert heavy + light <= 40
    # Round robin would give them about the same; the gain of the heavy one's batches is ~1000x larger.
    assert heavy >= 3 * light, (heavy, light)


def _best_ms(database: Any, task: Any) -> float:
    (best,) = database.get_top_k(database.commit_workload(task.dispatched[0]), 1)
    latency = record_latency_s(best.run_secs)
    assert latency is not None
    return latency * 1e3


def test_a_task_at_its_roofline_is_searched_no_further(tmp_path: Path) -> None:
    """Limits measured as this machine could have: an fp32 peak 2 % above what the more efficient task
    reached, so that its roofline (its FLOPs at that peak, :func:`roofline_floors_ms`) is within 5 % of
    its best and the other task's is far below its own. The search then leaves the first alone."""
    tasks = _tasks(128, 16)  # a 128^3 matmul runs far nearer the FMA peak than a 16^3 one
    database = ms.database.MemoryDatabase()
    tune_tasks(tasks, TARGET, database, budget=Budget(trials=16), config=CONFIG, work_dir=tmp_path / "ms")
    gflops = [estimate_flops(t.dispatched[0]) / (_best_ms(database, t) * 1e6) for t in tasks]
    near = max(range(2), key=lambda i: gflops[i])
    far = 1 - near
    limits = MachineLimits(
        peak_gflops=1.02 * gflops[near],
        peak_gflops_one_thread=gflops[near],
        bandwidth_gbs=1e4,  # the matmuls' data stays in the caches anyway
        threads=2,
        vector_lanes=8,
        how="test",
        version=LIMITS_VERSION,
    )
    floors = roofline_floors_ms(tasks, limits, CONFIG.space_options.caches)
    assert floors[near] >= ROOFLINE_STOP * _best_ms(database, tasks[near])
    if floors[far] >= ROOFLINE_STOP * _best_ms(database, tasks[far]):
        pytest.skip(f"both tasks ran within 5 % of one efficiency ({gflops}): no task is far from its roof")

    # The near task called a thousand times a run: without the stop its batches would promise the most.
    weighted = [
        ms.ExtractedTask(t.task_name, t.mod, TARGET, t.dispatched, 1000 if i == near else 1)
        for i, t in enumerate(tasks)
    ]
    before = _trials_per_task(database, tasks)
    tune_tasks(
        weighted,
        TARGET,
        database,
        budget=Budget(trials=12),
        config=CONFIG,
        work_dir=tmp_path / "ms2",
        limits=limits,
    )
    added = [after - was for after, was in zip(_trials_per_task(database, tasks), before, strict=True)]
    assert added[near] == 0 and added[far] > 0, (added, gflops)
