"""The cpu-poly space end to end: a job that names it is tuned with its seeds and its pruner, records which
space tuned it (job, API, artifact manifest) and still computes what onnxruntime computes."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.artifacts import onnxruntime_output, run_artifact_in_fresh_process
from tests.model_builders import build_small_cnn
from tuner.entities import JobSpec, JobStatus
from tuner.errors import InvalidSpec
from tuner.jobs.pipeline import run_job
from tuner.jobs.submission import submit_job
from tuner.model_registry import register_model
from tuner.settings import Settings
from tuner.store import Store
from tuner.targets import host_target

pytestmark = pytest.mark.slow


def test_a_small_cnn_tunes_in_the_cpu_poly_space(sqlite_store: Store, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, database_url=None, poly_seeds=2, default_schedules=False)
    path = tmp_path / "cnn.onnx"
    onnx.save(build_small_cnn(), path)
    model, _ = register_model(sqlite_store, settings, path)
    job = submit_job(
        sqlite_store, JobSpec(model_id=model.id, target=host_target(), trials=24, space="cpu-poly")
    )
    assert job.spec.space == "cpu-poly"
    result = run_job(sqlite_store, settings, job.id)
    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    assert all(c.ok for c in result.comparisons)

    convs = [t for t in result.tasks if "conv2d" in t.name]
    assert convs
    for task in convs:
        stats = task.search_stats
        assert stats is not None, task.name
        # Each convolution's seeds were measured first (two per task at most, within the budget).
        assert 1 <= stats["seeds"] <= 2
        assert stats["rejected"] + stats["passed_through"] <= stats["examined"]
    assert sum(t.search_stats["examined"] for t in convs) > 0
    measured = sum(t.trials for t in result.tasks)
    assert 0 < measured <= 24
    assert sqlite_store.count_records(job_id=job.id) == measured

    with tarfile.open(result.artifact.path, "r:gz") as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())
    assert manifest["space"] == "cpu-poly"
    assert any(t["search_stats"] for t in manifest["tasks"])
    x = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)
    got = run_artifact_in_fresh_process(Path(result.artifact.path), x, tmp_path)
    np.testing.assert_allclose(got, onnxruntime_output(path, x), rtol=1e-4, atol=1e-4)

    # Tuned again, every task starts warm from the stored records: no seeds are measured again.
    again = submit_job(
        sqlite_store, JobSpec(model_id=model.id, target=host_target(), trials=8, space="cpu-poly")
    )
    rerun = run_job(sqlite_store, settings, again.id)
    assert rerun.job.status is JobStatus.SUCCEEDED, rerun.job.error
    assert all(t.search_stats is not None and t.search_stats["seeds"] == 0 for t in rerun.tasks)


def test_the_job_records_the_default_space_and_refuses_unknown_ones(
    sqlite_store: Store, settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "cnn.onnx"
    onnx.save(build_small_cnn(), path)
    model, _ = register_model(sqlite_store, settings, path)
    job = submit_job(sqlite_store, JobSpec(model_id=model.id, target=host_target(), trials=4))
    assert job.spec.space == "cpu-poly"  # the default on CPUs since bench/poly.py's third run
    with pytest.raises(InvalidSpec, match="unknown schedule space 'pluto'"):
        submit_job(sqlite_store, JobSpec(model_id=model.id, target=host_target(), trials=4, space="pluto"))
    with pytest.raises(InvalidSpec, match="for cuda targets"):
        submit_job(sqlite_store, JobSpec(model_id=model.id, target=host_target(), trials=4, space="gpu"))
