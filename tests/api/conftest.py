"""Fixtures of the API tests: an app on a fresh SQLite data directory, a client, uploaded models."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from tests.model_builders import build_mlp
from tuner.settings import Settings


def onnx_bytes(model: onnx.ModelProto) -> bytes:
    buffer = io.BytesIO()
    onnx.save(model, buffer)
    return buffer.getvalue()


@pytest.fixture
def api_settings(tmp_path: Path) -> Settings:
    """Service settings on the test's own data directory; short timings so fault tests stay quick."""
    return Settings(
        data_dir=tmp_path / "data",
        database_url=None,
        api_tokens=None,
        embedded_workers=0,
        heartbeat_s=0.5,
        num_trials_per_iter=8,
        # The importers' fork server starts at the first upload and serves the whole test session
        # (the real server's tests keep the default, started with the service).
        import_warm_processes=0,
    )


@pytest.fixture
def client(api_settings: Settings) -> Iterator[TestClient]:
    """A client of an app without embedded workers (tests run jobs with a Worker when they need to)."""
    with TestClient(create_app(api_settings)) as c:
        yield c


@pytest.fixture
def mlp_bytes() -> bytes:
    return onnx_bytes(build_mlp(seed=0))


@pytest.fixture
def mlp_model(client: TestClient, mlp_bytes: bytes) -> dict:
    """An uploaded MLP (input x [1, 256] -> y [1, 10])."""
    response = client.post("/api/v1/models", files={"file": ("mlp.onnx", mlp_bytes)})
    assert response.status_code == 201, response.text
    return response.json()
