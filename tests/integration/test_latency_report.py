"""A job's side-by-side latencies come from interleaved rounds, and say so everywhere they are shown."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import onnx
import pytest

from tests.host_jobs import run_host_job
from tests.model_builders import build_mlp
from tuner.entities import JobStatus
from tuner.settings import Settings
from tuner.store import Store
from tuner.timing.verify import TUNED, UNTUNED

pytestmark = pytest.mark.slow


def test_a_jobs_latencies_are_medians_of_interleaved_rounds(
    store: Store, settings: Settings, tmp_path: Path
) -> None:
    settings = settings.model_copy(update={"latency_rounds": 3})  # the suite's default is one round
    path = tmp_path / "mlp.onnx"
    onnx.save(build_mlp(seed=11), str(path))
    result = run_host_job(store, settings, path, trials=0)

    finished = store.get_job(result.job.id)
    assert finished.status is JobStatus.SUCCEEDED, finished.error
    report = finished.latency_report
    assert report is not None and report == result.latency.report
    assert set(report.timings) == {UNTUNED, TUNED, "onnxruntime"}
    assert all(len(t.rounds_ms) == 3 for t in report.timings.values())
    assert all(t.min_ms <= t.median_ms <= t.max_ms for t in report.timings.values())
    assert finished.baseline_latency_ms == report.timings[UNTUNED].median_ms
    assert finished.tuned_latency_ms == report.timings[TUNED].median_ms
    assert finished.reference_latency_ms == {"onnxruntime": report.timings["onnxruntime"].median_ms}
    assert report.other_cpu_share is None or 0.0 <= report.other_cpu_share <= 1.0

    with tarfile.open(result.artifact.path) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
    latency = manifest["latency"]
    assert latency["rounds_ms"] == {name: list(t.rounds_ms) for name, t in report.timings.items()}
    assert latency["warnings"] == list(report.warnings)
    assert "interleaved rounds" in latency["method"]
