"""Kiln's task scheduler in real tuning runs: trials go to the task that can take the most off the model's
latency, and a task at its roofline is searched no further."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kiln_tvm import ms, structural_hash, tvm
from tuner.entities import MachineLimits
from tuner.targets import host_target, to_tvm_target
from tuner.tune import Budget, MeasureConfig, tune_tasks

pytestmark = pytest.mark.slow

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


def test_a_task_at_its_roofline_is_searched_no_further(tmp_path: Path) -> None:
    tasks = _tasks(64, 48)
    # The roofs of a machine a million times slower than this one: each task's best is already faster
    # than its roofline, so after its seeds the search gives it nothing.
    crawling = MachineLimits(
        peak_gflops=1e-4,
        peak_gflops_one_thread=1e-4,
        bandwidth_gbs=1e-4,
        threads=1,
        vector_lanes=1,
        how="test",
    )
    database = ms.database.MemoryDatabase()
    tune_tasks(
        tasks,
        TARGET,
        database,
        budget=Budget(trials=40),
        config=CONFIG,
        work_dir=tmp_path / "ms",
        limits=crawling,
    )
    seeds = _trials_per_task(database, tasks)
    assert all(0 < n <= CONFIG.space_options.seeds for n in seeds), seeds

    unbounded = ms.database.MemoryDatabase()
    tune_tasks(tasks, TARGET, unbounded, budget=Budget(trials=40), config=CONFIG, work_dir=tmp_path / "ms2")
    assert sum(_trials_per_task(unbounded, tasks)) > sum(seeds)  # without the roofs the search goes on
