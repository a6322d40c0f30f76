"""End to end through the core: register a model, tune it for real, compile, verify, package, reload."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.artifacts import onnxruntime_output, run_artifact_in_fresh_process
from tests.host_jobs import run_host_job
from tests.model_builders import build_mlp, build_small_cnn
from tuner.entities import JobStatus
from tuner.errors import VerificationFailed
from tuner.settings import Settings
from tuner.store import Store

pytestmark = pytest.mark.slow


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def _tune(store: Store, settings: Settings, path: Path, trials: int, per_task: int | None = None):
    return run_host_job(store, settings, path, trials=trials, max_trials_per_task=per_task)


def test_mlp_tunes_verifies_and_reloads_in_fresh_process(
    sqlite_store: Store, settings: Settings, tmp_path: Path
) -> None:
    path = _save(build_mlp(), tmp_path / "mlp.onnx")
    result = _tune(sqlite_store, settings, path, trials=8)

    job = result.job
    assert job.status is JobStatus.SUCCEEDED, job.error
    assert job.baseline_latency_ms and job.tuned_latency_ms
    assert len(result.tasks) >= 2
    measured = sum(t.trials for t in result.tasks)
    assert 0 < measured <= 8
    # Every measured candidate is in the database, linked to this job.
    assert sqlite_store.count_records(job_id=job.id) == measured
    assert any(t.best_latency_us for t in result.tasks)
    assert {c.reference for c in result.comparisons} == {"untuned TVM", "onnxruntime"}
    assert all(c.ok for c in result.comparisons)

    artifact = Path(result.artifact.path)
    with tarfile.open(artifact, "r:gz") as tar:
        names = set(tar.getnames())
        manifest = json.loads(tar.extractfile("manifest.json").read())
    assert {
        "model.so",
        "manifest.json",
        "run.py",
        "records/database_workload.json",
        "records/database_tuning_record.json",
    } <= names
    assert manifest["model"]["sha256"] == sqlite_store.get_model(job.spec.model_id).sha256
    assert manifest["latency"]["tuned_ms"] == pytest.approx(job.tuned_latency_ms)
    assert manifest["target"]["kind"] == "llvm"
    assert [t["name"] for t in manifest["tasks"]] == [t.name for t in result.tasks]
    assert manifest["inputs"] == [{"name": "x", "shape": [1, 256], "dtype": "float32"}]

    x = np.random.default_rng(7).standard_normal((1, 256)).astype(np.float32)
    got = run_artifact_in_fresh_process(artifact, x, tmp_path)
    np.testing.assert_allclose(got, onnxruntime_output(path, x), rtol=1e-4, atol=1e-5)

    # The bundled run.py works as shipped, with plain TVM, from the unpacked folder.
    ran = subprocess.run(
        [sys.executable, "run.py"], cwd=tmp_path / "unpacked", capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0, ran.stderr
    assert "latency:" in ran.stdout and "(1, 10)" in ran.stdout


def test_artifact_records_load_in_plain_tvm_json_database(
    sqlite_store: Store, settings: Settings, tmp_path: Path
) -> None:
    from kiln_tvm import ms

    path = _save(build_mlp(seed=3), tmp_path / "mlp3.onnx")
    result = _tune(sqlite_store, settings, path, trials=4)
    root = tmp_path / "a"
    with tarfile.open(result.artifact.path, "r:gz") as tar:
        tar.extractall(root, filter="data")
    db = ms.database.JSONDatabase(
        path_workload=str(root / "records/database_workload.json"),
        path_tuning_record=str(root / "records/database_tuning_record.json"),
        allow_missing=False,
    )
    records = db.get_all_tuning_records()
    valid = [r for r in sqlite_store.list_records(job_id=result.job.id) if r.mean_latency_us is not None]
    assert len(records) == len(valid) > 0
    for record in records:
        assert record.run_secs and float(record.run_secs[0]) < 1e9


def test_second_run_starts_from_stored_records(
    sqlite_store: Store, settings: Settings, tmp_path: Path
) -> None:
    path = _save(build_mlp(seed=1), tmp_path / "mlp.onnx")
    first = _tune(sqlite_store, settings, path, trials=8)
    records_after_first = sqlite_store.count_records()

    second = _tune(sqlite_store, settings, path, trials=0)

    assert second.job.status is JobStatus.SUCCEEDED
    assert sqlite_store.count_records() == records_after_first  # nothing new measured
    assert [t.trials for t in second.tasks] == [0] * len(second.tasks)
    # Each task starts from the best record of the first run: the same kernels get compiled.
    assert [t.best_latency_us for t in second.tasks] == [t.best_latency_us for t in first.tasks]
    assert [t.workload_hash for t in second.tasks] == [t.workload_hash for t in first.tasks]
    for task in second.tasks:  # a task the first run measured is compiled with its record
        assert (task.schedule_source == "tuned") == (task.best_latency_us is not None), task
    first_manifest = _manifest(first.artifact.path)
    second_manifest = _manifest(second.artifact.path)
    assert [t["best_latency_us"] for t in second_manifest["tasks"]] == [
        t["best_latency_us"] for t in first_manifest["tasks"]
    ]


def _manifest(path: str) -> dict:
    with tarfile.open(path, "r:gz") as tar:
        return json.loads(tar.extractfile("manifest.json").read())


def test_small_cnn_tunes_and_matches_onnxruntime(
    sqlite_store: Store, settings: Settings, tmp_path: Path
) -> None:
    path = _save(build_small_cnn(), tmp_path / "cnn.onnx")
    result = _tune(sqlite_store, settings, path, trials=12, per_task=2)

    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    assert result.fusion.kernels_after < result.fusion.operators_before
    assert any("conv2d" in t.name for t in result.tasks)
    ort = next(c for c in result.comparisons if c.reference == "onnxruntime")
    assert ort.ok and ort.max_abs_error < 1e-3
    x = np.random.default_rng(5).standard_normal((1, 3, 32, 32)).astype(np.float32)
    got = run_artifact_in_fresh_process(Path(result.artifact.path), x, tmp_path)
    np.testing.assert_allclose(got, onnxruntime_output(path, x), rtol=1e-4, atol=1e-4)


def test_a_zero_trial_artifact_schedules_every_kernel_without_measuring(
    sqlite_store: Store, settings: Settings, tmp_path: Path
) -> None:
    """A cold store and no trials: no kernel is left as serial loops, each says where its schedule came
    from, and the artifact computes what onnxruntime does."""
    path = _save(build_small_cnn(), tmp_path / "cnn.onnx")
    result = _tune(sqlite_store, settings, path, trials=0)

    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    assert sqlite_store.count_records() == 0  # nothing measured
    sources = {t.name: t.schedule_source for t in result.tasks}
    assert "none" not in sources.values() and None not in sources.values(), sources
    assert "tuned" not in sources.values(), sources
    conv = [s for name, s in sources.items() if "conv2d" in name]
    # Convolutions: the analytic register tile (their output channels hold whole vectors on every CPU).
    assert conv and set(conv) == {"analytic"}, sources
    assert {t["schedule_source"] for t in _manifest(result.artifact.path)["tasks"]} == set(sources.values())
    x = np.random.default_rng(6).standard_normal((1, 3, 32, 32)).astype(np.float32)
    got = run_artifact_in_fresh_process(Path(result.artifact.path), x, tmp_path)
    np.testing.assert_allclose(got, onnxruntime_output(path, x), rtol=1e-4, atol=1e-4)


def test_a_new_shape_starts_from_the_records_of_the_same_operators_at_another(
    sqlite_store: Store, settings: Settings, tmp_path: Path
) -> None:
    """A CNN tuned at 32x32 warms the store; the same CNN at 48x48 (its convolutions new workloads) is compiled with no
    trial from the 32x32 records, their tiles adapted to the new extents, and computes what onnxruntime
    does; so does the CNN with other activations fused into its convolutions."""
    small = _tune(sqlite_store, settings, _save(build_small_cnn(), tmp_path / "cnn32.onnx"), trials=24)
    assert small.job.status is JobStatus.SUCCEEDED, small.job.error
    measured = {t.name for t in small.tasks if t.best_latency_us is not None}
    assert {t.name for t in small.tasks if "conv2d" in t.name} <= measured
    records = sqlite_store.count_records()

    path = _save(build_small_cnn(image_size=48), tmp_path / "cnn48.onnx")
    result = _tune(sqlite_store, settings, path, trials=0)
    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    assert sqlite_store.count_records() == records  # nothing measured
    convs = [t for t in result.tasks if "conv2d" in t.name]
    assert len(convs) == 3 and not {t.workload_hash for t in convs} & {t.workload_hash for t in small.tasks}
    assert {t.schedule_source for t in convs} == {"similar"}, [(t.name, t.schedule_source) for t in convs]
    x = np.random.default_rng(7).standard_normal((1, 3, 48, 48)).astype(np.float32)
    got = run_artifact_in_fresh_process(Path(result.artifact.path), x, tmp_path)
    np.testing.assert_allclose(got, onnxruntime_output(path, x), rtol=1e-4, atol=1e-4)

    # Sigmoids in place of the ReLUs, at 40x40: each convolution's fused epilogue is another, so no
    # trace of the store replays on it; the decisions of the ReLU convolutions' records do.
    path = _save(build_small_cnn(image_size=40, activation="Sigmoid"), tmp_path / "cnn40.onnx")
    result = _tune(sqlite_store, settings, path, trials=0)
    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    convs = [t for t in result.tasks if "conv2d" in t.name]
    assert len(convs) == 3 and all("sigmoid" in t.name for t in convs), [t.name for t in convs]
    assert {t.schedule_source for t in convs} == {"similar"}, [(t.name, t.schedule_source) for t in convs]
    x = np.random.default_rng(8).standard_normal((1, 3, 40, 40)).astype(np.float32)
    got = run_artifact_in_fresh_process(Path(result.artifact.path), x, tmp_path)
    np.testing.assert_allclose(got, onnxruntime_output(path, x), rtol=1e-4, atol=1e-4)


def test_mismatching_build_fails_the_job_loudly(
    sqlite_store: Store, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tuned build whose outputs differ (simulated miscompile: other weights) never becomes an artifact."""
    import tuner.jobs.pipeline
    from tuner.compile import build_untuned
    from tuner.frontend import load_model

    other = load_model(_save(build_mlp(seed=99), tmp_path / "other.onnx"))
    monkeypatch.setattr(
        tuner.jobs.pipeline, "build_tuned", lambda plan, target, db: build_untuned(other.mod, target)
    )
    path = _save(build_mlp(seed=2), tmp_path / "mlp.onnx")

    with pytest.raises(VerificationFailed, match="differ beyond tolerance"):
        _tune(sqlite_store, settings, path, trials=0)

    job = sqlite_store.list_jobs()[0]
    assert job.status is JobStatus.FAILED
    assert "differ beyond tolerance" in (job.error or "")
    with pytest.raises(Exception, match="not found|no artifact"):
        sqlite_store.get_artifact(job.id)
