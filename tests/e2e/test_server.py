"""The real thing: `kiln serve` under uvicorn on a loopback port, driven over HTTP like a curl user would."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest

from tests.artifacts import onnxruntime_output, run_artifact_in_fresh_process
from tests.model_builders import build_mlp

pytestmark = pytest.mark.slow


def test_a_whole_job_over_http(start_server: Callable[..., str], database_url: str, tmp_path: Path) -> None:
    """Upload, job, live events, artifact: on SQLite, and on PostgreSQL where the suite has a server."""
    server = start_server(KILN_DATABASE_URL=database_url)
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

        _assert_downloaded_artifact_matches_onnxruntime(http, job_id, model_path, tmp_path, seed=3)


def _assert_downloaded_artifact_matches_onnxruntime(
    http: httpx.Client, job_id: str, model_path: Path, tmp_path: Path, seed: int
) -> None:
    """The job's artifact, downloaded and run by plain TVM in a fresh process, computes what onnxruntime
    computes on the MLP's input."""
    artifact = http.get(f"/api/v1/jobs/{job_id}/artifact")
    assert artifact.status_code == 200
    downloaded = tmp_path / "artifact.tar.gz"
    downloaded.write_bytes(artifact.content)
    x = np.random.default_rng(seed).standard_normal((1, 256)).astype(np.float32)
    got = run_artifact_in_fresh_process(downloaded, x, tmp_path)
    np.testing.assert_allclose(got, onnxruntime_output(model_path, x), rtol=1e-4, atol=1e-5)


def _wait_for_job(http: httpx.Client, job_id: str, done: Callable[[dict], bool], what: str) -> dict:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        job = http.get(f"/api/v1/jobs/{job_id}").json()
        if done(job):
            return job
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}: {job}")


def test_cancelling_a_running_job_over_http_stops_it_and_keeps_its_records(
    start_server: Callable[..., str],
) -> None:
    server = start_server()
    with httpx.Client(base_url=server, timeout=60) as http:
        model = http.post(
            "/api/v1/models", files={"file": ("mlp.onnx", _onnx_bytes(build_mlp(seed=12)))}
        ).json()
        job_id = http.post("/api/v1/jobs", json={"model_id": model["id"], "trials": 400}).json()["id"]
        running = _wait_for_job(
            http,
            job_id,
            lambda j: j["status"] == "running" and j["progress"]["trials_done"] > 0,
            "the job to measure",
        )
        cancel = http.post(f"/api/v1/jobs/{job_id}/cancel")
        assert cancel.status_code == 202, cancel.text
        ended = _wait_for_job(http, job_id, lambda j: j["status"] != "running", "the job to stop")
        assert ended["status"] == "cancelled", ended
        assert "records" in ended["error"]
        assert running["progress"]["trials_done"] <= ended["progress"]["trials_done"] < 400
        assert http.get(f"/api/v1/jobs/{job_id}/artifact").status_code == 409
        # The worker is free: the next job runs to the end.
        nxt = http.post("/api/v1/jobs", json={"model_id": model["id"], "trials": 4}).json()["id"]
        assert (
            _wait_for_job(http, nxt, lambda j: j["status"] not in ("queued", "running"), "the next job")[
                "status"
            ]
            == "succeeded"
        )


@pytest.fixture
def rpc_device() -> Iterator[tuple[str, str]]:
    """A TVM RPC tracker and one server registered under a key, on loopback: (tracker address, key)."""
    from tuner.rpc.processes import start_server as start_rpc_server
    from tuner.rpc.processes import start_tracker

    key = "kiln-e2e"
    with start_tracker("127.0.0.1", 0) as tracker, start_rpc_server(tracker.address, key, "127.0.0.1", 0):
        yield tracker.address, key


def test_a_job_submitted_over_http_measures_on_an_rpc_device(
    start_server: Callable[..., str], rpc_device: tuple[str, str], tmp_path: Path
) -> None:
    tracker, key = rpc_device
    server = start_server(KILN_RPC_TRACKER=tracker)
    model_path = tmp_path / "mlp.onnx"
    onnx.save(build_mlp(seed=13), str(model_path))
    with httpx.Client(base_url=server, timeout=60) as http:
        assert [d["key"] for d in http.get("/api/v1/devices").json()["devices"]] == [key]
        model = http.post("/api/v1/models", files={"file": ("mlp.onnx", model_path.read_bytes())}).json()
        created = http.post(
            "/api/v1/jobs", json={"model_id": model["id"], "trials": 8, "runner": {"kind": "rpc", "key": key}}
        )
        assert created.status_code == 202, created.text
        assert created.json()["runner"] == {"kind": "rpc", "tracker": tracker, "key": key}
        job = _wait_for_job(
            http, created.json()["id"], lambda j: j["status"] not in ("queued", "running"), "the RPC job"
        )
        assert job["status"] == "succeeded", job["error"]
        assert job["progress"]["trials_done"] > 0
        _assert_downloaded_artifact_matches_onnxruntime(http, job["id"], model_path, tmp_path, seed=13)


def _onnx_bytes(model: onnx.ModelProto) -> bytes:
    return model.SerializeToString()
