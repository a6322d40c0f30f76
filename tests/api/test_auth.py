"""Multi-user: bearer tokens from KILN_API_TOKENS or `kiln token create`, owners see only their things."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from tuner.settings import Settings
from tuner.store import Store
from tuner.tokens import token_sha256

ALICE = {"Authorization": "Bearer alice-secret"}
BOB = {"Authorization": "Bearer bob-secret"}


def _client(settings: Settings) -> TestClient:
    return TestClient(create_app(settings))


def test_every_api_route_needs_a_token_when_tokens_are_configured(api_settings: Settings) -> None:
    settings = api_settings.model_copy(update={"api_tokens": "alice:alice-secret,bob:bob-secret"})
    with _client(settings) as client:
        for path in ("/api/v1/models", "/api/v1/jobs", "/api/v1/jobs/x", "/api/v1/devices"):
            response = client.get(path)
            assert response.status_code == 401, path
            assert response.headers["www-authenticate"] == "Bearer"
            assert response.json()["error"]["kind"] == "unauthorized"
        wrong = client.get("/api/v1/models", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "not valid" in wrong.json()["error"]["message"]
        assert client.get("/api/v1/models", headers=ALICE).status_code == 200
        # Liveness stays open; the metrics count every user's jobs, so they take a token too.
        assert client.get("/healthz").json()["auth"] is True
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers=ALICE).status_code == 200


def test_other_users_models_and_jobs_are_404(api_settings: Settings, mlp_bytes: bytes) -> None:
    settings = api_settings.model_copy(update={"api_tokens": "alice:alice-secret,bob:bob-secret"})
    with _client(settings) as client:
        model = client.post("/api/v1/models", files={"file": ("m.onnx", mlp_bytes)}, headers=ALICE).json()
        job = client.post("/api/v1/jobs", json={"model_id": model["id"], "trials": 4}, headers=ALICE).json()

        assert client.get(f"/api/v1/models/{model['id']}", headers=BOB).status_code == 404
        assert client.get("/api/v1/models", headers=BOB).json() == []
        assert client.get(f"/api/v1/jobs/{job['id']}", headers=BOB).status_code == 404
        assert client.get("/api/v1/jobs", headers=BOB).json()["total"] == 0
        assert client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=BOB).status_code == 404
        assert client.get(f"/api/v1/jobs/{job['id']}/artifact", headers=BOB).status_code == 404
        stolen = client.post("/api/v1/jobs", json={"model_id": model["id"], "trials": 4}, headers=BOB)
        assert stolen.status_code == 404

        # The same bytes uploaded by bob become bob's own model.
        bobs = client.post("/api/v1/models", files={"file": ("m.onnx", mlp_bytes)}, headers=BOB)
        assert bobs.status_code == 201 and bobs.json()["id"] != model["id"]
        assert client.get(f"/api/v1/jobs/{job['id']}", headers=ALICE).status_code == 200


def test_tokens_created_in_the_database_switch_auth_on(api_settings: Settings) -> None:
    store = Store.from_settings(api_settings)
    store.ensure_schema()
    store.add_token("carol", token_sha256("carol-token"))
    with _client(api_settings) as client:
        assert client.get("/api/v1/jobs").status_code == 401
        ok = client.get("/api/v1/jobs", headers={"Authorization": "Bearer carol-token"})
        assert ok.status_code == 200


def _kiln(args: list[str], data_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    full_env.update({"KILN_DATA_DIR": str(data_dir), **env})
    return subprocess.run(
        [sys.executable, "-m", "cli", *args], capture_output=True, text=True, env=full_env, timeout=120
    )


@pytest.mark.slow
def test_serve_refuses_a_public_address_without_tokens(tmp_path: Path) -> None:
    refused = _kiln(["serve", "--host", "0.0.0.0", "--port", "1"], tmp_path)
    assert refused.returncode == 2
    assert "refusing to serve on 0.0.0.0 without API tokens" in refused.stderr
    assert "--insecure" in refused.stderr


def test_token_cli_creates_lists_and_revokes(tmp_path: Path) -> None:
    created = _kiln(["token", "create", "dave"], tmp_path)
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip().splitlines()[-1]
    assert token.startswith("kiln_")
    store = Store(f"sqlite:///{tmp_path / 'kiln.db'}")
    assert store.token_owner(token_sha256(token)) == "dave"
    assert "dave" in _kiln(["token", "list"], tmp_path).stdout
    assert _kiln(["token", "create", "dave"], tmp_path).returncode == 2  # names are unique
    assert _kiln(["token", "revoke", "dave"], tmp_path).returncode == 0
    assert store.token_owner(token_sha256(token)) is None


@pytest.mark.slow
def test_cli_submits_on_behalf_of_a_token_owner(tmp_path: Path, mlp_bytes: bytes) -> None:
    data_dir = tmp_path / "data"
    model = tmp_path / "mlp.onnx"
    model.write_bytes(mlp_bytes)
    unknown = _kiln(["submit", str(model), "--trials", "4", "--owner", "erin"], data_dir)
    assert unknown.returncode == 2
    message = " ".join(unknown.stderr.split())  # rich wraps long lines
    assert "no API token is named 'erin'" in message and "kiln token create erin" in message

    tune = _kiln(["tune", str(model), "--trials", "0", "--owner", "erin"], data_dir)
    assert tune.returncode == 2 and "no API token is named 'erin'" in " ".join(tune.stderr.split())

    token = _kiln(["token", "create", "erin"], data_dir).stdout.strip().splitlines()[-1]
    queued = _kiln(["submit", str(model), "--trials", "4", "--owner", "erin"], data_dir)
    assert queued.returncode == 0, queued.stderr
    anonymous = _kiln(["submit", str(model), "--trials", "4"], data_dir)
    assert anonymous.returncode == 0, anonymous.stderr
    env_owner = _kiln(
        ["submit", str(model), "--trials", "4", "--owner", "frank"],
        data_dir,
        KILN_API_TOKENS="frank:f-secret",
    )
    assert env_owner.returncode == 0, env_owner.stderr  # a KILN_API_TOKENS name is an owner too

    settings = Settings(data_dir=data_dir, database_url=None, api_tokens=None, embedded_workers=0)
    with _client(settings) as client:
        erin = {"Authorization": f"Bearer {token}"}
        jobs = client.get("/api/v1/jobs", headers=erin).json()
        assert jobs["total"] == 1  # erin's job, not the anonymous one nor frank's
        models = client.get("/api/v1/models", headers=erin).json()
        assert [m["id"] for m in models] == [jobs["items"][0]["model_id"]]
