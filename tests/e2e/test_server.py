"""The real thing: `kiln serve` under uvicorn on a loopback port, driven over HTTP like a curl user would."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest

from tests.artifacts import onnxruntime_output, run_artifact_in_fresh_process
from tests.models import build_mlp

pytestmark = pytest.mark.slow


def test_a_whole_job_over_http(server: str, tmp_path: Path) -> None:
    model_path = tmp_path / "mlp.onnx"
    onnx.save(build_mlp(seed=11), str(model_path))
    with httpx.Client(base_url=server, timeout=60) as http:
        assert http.get("/docs").status_code == 200
        assert "/api/v1/jobs" in http.get("/openapi.json").json()["paths"]

        with model_path.open("rb") as fh:
            uploaded = http.post("/api/v1/models", files={"file": ("mlp.onnx", fh)}, data={"name": "mlp"})
        assert uploaded.status_code == 201, uploaded.text
        model = uploaded.json()

        created = http.post("/api/v1/jobs", json={"model_id": model["id"], "trials": 8, "seed": 2})
        assert created.status_code == 202, created.text
        job_id = created.json()["id"]

        # Watch it live: the event stream reports progress and closes when the job ends.
        events = []
        with http.stream("GET", f"/api/v1/jobs/{job_id}/events", timeout=600) as stream:
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    events.append(line.removeprefix("event: "))
        assert events[-1] == "end" and "progress" in events

        job = http.get(f"/api/v1/jobs/{job_id}").json()
        assert job["status"] == "succeeded", job["error"]
        assert job["progress"]["trials_done"] == 8 and job["speedup"] > 1

        artifact = http.get(f"/api/v1/jobs/{job_id}/artifact")
        assert artifact.status_code == 200
    downloaded = tmp_path / "artifact.tar.gz"
    downloaded.write_bytes(artifact.content)

    x = np.random.default_rng(3).standard_normal((1, 256)).astype(np.float32)
    got = run_artifact_in_fresh_process(downloaded, x, tmp_path)
    np.testing.assert_allclose(got, onnxruntime_output(model_path, x), rtol=1e-4, atol=1e-5)
