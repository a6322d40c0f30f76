"""Default schedules in a real tuning run: measured and stored before the search, counted in the trial
budget, and compiled into a model that computes what onnxruntime computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from kiln_tvm import ms
from schedules.defaults import default_schedule
from tests.artifacts import onnxruntime_output
from tests.model_builders import build_attention_scores
from tuner.compile import LoadedModel, build_tuned
from tuner.entities import Budget
from tuner.frontend import load_model
from tuner.metaschedule.callback import TrialBatch
from tuner.passes.plan import plan_graph
from tuner.targets import host_target, to_tvm_target
from tuner.tune import MeasureConfig, tune_tasks

pytestmark = pytest.mark.slow

TARGET = to_tvm_target(host_target())


def test_reductions_start_with_their_measured_default_schedule(tmp_path: Path) -> None:
    path = tmp_path / "attention.onnx"
    onnx.save(build_attention_scores(), path)
    plan = plan_graph(load_model(path).mod, TARGET)
    served = [i for i, t in enumerate(plan.tasks) if default_schedule(t.dispatched[0], TARGET) is not None]
    assert len(served) >= 2  # the softmax and the layer norm

    database = ms.database.MemoryDatabase()
    batches: list[TrialBatch] = []
    trials = 3 * len(plan.tasks)
    tune_tasks(
        plan.tasks,
        TARGET,
        database,
        budget=Budget(trials=trials),
        config=MeasureConfig(number=1, min_repeat_ms=5),
        work_dir=tmp_path / "ms",
        on_batch=batches.append,
    )
    # The defaults came first, one batch each, every one measured and stored as a record of its task.
    first = batches[: len(served)]
    assert [b.task_index for b in first] == served
    assert all(b.latencies_us[0] is not None for b in first), [b.errors for b in first]
    for index in served:
        workload = database.commit_workload(plan.tasks[index].dispatched[0])
        assert database.get_top_k(workload, 1), plan.infos[index].name
    # They count against the trial budget.
    measured = sum(len(b.latencies_us) for b in batches)
    assert len(database.get_all_tuning_records()) <= measured <= trials

    x = np.random.default_rng(0).standard_normal((1, 64, 32)).astype(np.float32)
    got = LoadedModel(build_tuned(plan, TARGET, database)).run([x])[0]
    np.testing.assert_allclose(got, onnxruntime_output(path, x), rtol=1e-4, atol=1e-5)
