"""Calibration files over the API: uploaded, checked against the job's model when a job names them, bad
files refused with a typed 4xx that says why."""

from __future__ import annotations

import io

import numpy as np
from fastapi.testclient import TestClient

from service.app import create_app
from tuner.settings import Settings


def _npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _upload(client: TestClient, data: bytes, name: str = "inputs.npz") -> object:
    return client.post("/api/v1/calibrations", files={"file": (name, data)})


def test_a_calibration_file_serves_an_int8_job_of_its_model(client: TestClient, mlp_model: dict) -> None:
    samples = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    uploaded = _upload(client, _npz(x=samples))
    assert uploaded.status_code == 201, uploaded.text
    body = uploaded.json()
    assert body["arrays"] == {"x": {"shape": [8, 256], "dtype": "float32"}} and len(body["id"]) == 64
    assert _upload(client, _npz(x=samples)).json()["id"] == body["id"]  # the same bytes, the same id

    job = client.post(
        "/api/v1/jobs",
        json={
            "model_id": mlp_model["id"],
            "trials": 0,
            "precision": "int8",
            "calibration_id": body["id"],
            "calibration_method": "percentile",
            "accuracy_budget": {"max_top1_changed": 0.02},
        },
    )
    assert job.status_code == 202, job.text
    out = job.json()
    assert out["precision"] == "int8" and out["calibration_id"] == body["id"]
    assert out["calibration_method"] == "percentile"
    assert out["accuracy_budget"] == {"max_top1_changed": 0.02, "max_relative_error": 0.05}


def test_bad_calibration_files_and_uses_are_refused_with_the_reason(
    client: TestClient, mlp_model: dict
) -> None:
    refused = _upload(client, b"this is not a zip archive")
    assert refused.status_code == 422 and refused.json()["error"]["kind"] == "invalid_calibration"
    assert "not an .npz" in refused.json()["error"]["message"]

    def submit(calibration_id: str, **more: object) -> object:
        return client.post(
            "/api/v1/jobs",
            json={"model_id": mlp_model["id"], "trials": 0, "calibration_id": calibration_id, **more},
        )

    # Arrays that are not the model's inputs: refused when a job names the file, with what is wrong.
    wrong = _upload(client, _npz(x=np.zeros((8, 255), np.float32))).json()["id"]
    response = submit(wrong, precision="int8")
    assert response.status_code == 422 and response.json()["error"]["kind"] == "invalid_calibration"
    assert "input 'x' is [1, 256]" in response.json()["error"]["message"]
    named = _upload(client, _npz(image=np.zeros((8, 256), np.float32))).json()["id"]
    assert "not inputs of the model" in submit(named, precision="int8").json()["error"]["message"]

    good = _upload(client, _npz(x=np.zeros((8, 256), np.float32))).json()["id"]
    response = submit(good, precision="as-is")  # a calibration file serves int8 and auto only
    assert (
        response.status_code == 422 and "serves precision int8 or auto" in response.json()["error"]["message"]
    )
    response = submit("f" * 64, precision="int8")
    assert response.status_code == 404
    response = submit(good, precision="int8", calibration_method="kmeans")
    assert response.status_code == 422
    response = submit(good, precision="int8", accuracy_budget={"max_top1_changed": 1.5})
    assert response.status_code == 422
    assert client.get("/api/v1/jobs").json()["items"] == []  # nothing was queued


def test_a_calibration_file_over_the_limit_is_413(api_settings: Settings) -> None:
    settings = api_settings.model_copy(update={"max_calibration_mb": 1})
    with TestClient(create_app(settings)) as small:
        big = _npz(x=np.zeros((300_000,), np.float64))  # 2.4 MB
        response = _upload(small, big)
        assert (
            response.status_code == 413 and "KILN_MAX_CALIBRATION_MB" in response.json()["error"]["message"]
        )
