"""Schemathesis generates requests from /openapi.json: whatever it sends, the API never answers 5xx."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error

from service.app import create_app
from tests.api.conftest import onnx_bytes
from tests.model_builders import build_mlp
from tuner.settings import Settings


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> schemathesis.BaseSchema:
    data_dir: Path = tmp_path_factory.mktemp("fuzz")
    app = create_app(Settings(data_dir=data_dir, database_url=None, api_tokens=None, embedded_workers=0))
    # Some real data, so that list routes return rows and not only empty pages.
    with TestClient(app) as client:
        model = client.post("/api/v1/models", files={"file": ("mlp.onnx", onnx_bytes(build_mlp()))}).json()
        client.post("/api/v1/jobs", json={"model_id": model["id"], "trials": 4})
    return schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.mark.slow
def test_no_request_makes_the_server_fail(api_schema: schemathesis.BaseSchema) -> None:
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 14
    for operation, mode in itertools.product(operations, schemathesis.GenerationMode):

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case: schemathesis.Case) -> None:
            case.call_and_validate(checks=[not_a_server_error])

        try:
            check()
        except Unsatisfiable:
            continue  # no invalid request exists for a route without parameters (e.g. /healthz)
        except Exception as exc:
            raise AssertionError(f"{operation.label} ({mode.value} examples): {exc}") from exc
