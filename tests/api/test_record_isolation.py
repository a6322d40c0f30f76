"""Tenant isolation of tuning data: with auth on, a user's jobs read and show only their own records,
unless the operator pools them (KILN_SHARE_RECORDS)."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from tuner.jobs.worker import Worker
from tuner.settings import Settings

ALICE = {"Authorization": "Bearer alice-secret"}
BOB = {"Authorization": "Bearer bob-secret"}
TOKENS = "alice:alice-secret,bob:bob-secret"


def _records_in(tarball: bytes) -> int:
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        member = tar.extractfile("records/database_tuning_record.json")
        assert member is not None
        return sum(1 for line in member.read().decode().splitlines() if line.strip())


def _tune(
    client: TestClient, settings: Settings, headers: dict[str, str], mlp_bytes: bytes, trials: int
) -> dict:
    model = client.post("/api/v1/models", files={"file": ("mlp.onnx", mlp_bytes)}, headers=headers).json()
    job = client.post(
        "/api/v1/jobs", json={"model_id": model["id"], "trials": trials, "seed": 1}, headers=headers
    )
    assert job.status_code == 202, job.text
    finished = Worker(settings, "isolation-worker").run_once()
    assert finished is not None and finished.status.value == "succeeded", finished and finished.error
    return job.json()


@pytest.mark.slow
@pytest.mark.parametrize("shared", [False, True], ids=["isolated", "shared"])
def test_one_users_records_are_invisible_to_another(
    api_settings: Settings, mlp_bytes: bytes, shared: bool
) -> None:
    settings = api_settings.model_copy(update={"api_tokens": TOKENS, "share_records": shared})
    with TestClient(create_app(settings)) as client:
        alices = _tune(client, settings, ALICE, mlp_bytes, trials=8)
        # Bob tunes the very same kernels, measuring nothing himself.
        bobs = _tune(client, settings, BOB, mlp_bytes, trials=0)

        alice_tasks = client.get(f"/api/v1/jobs/{alices['id']}/tasks", headers=ALICE).json()
        bob_tasks = client.get(f"/api/v1/jobs/{bobs['id']}/tasks", headers=BOB).json()
        assert [t["workload_hash"] for t in bob_tasks] == [t["workload_hash"] for t in alice_tasks]
        assert all(t["best_latency_us"] for t in alice_tasks)

        bob_records = client.get(f"/api/v1/jobs/{bobs['id']}/records", headers=BOB)
        best = client.get(f"/api/v1/jobs/{bobs['id']}/tasks/{bob_tasks[0]['id']}/best", headers=BOB)
        with tarfile.open(
            fileobj=io.BytesIO(client.get(f"/api/v1/jobs/{bobs['id']}/artifact", headers=BOB).content)
        ) as tar:
            member = tar.extractfile("records/database_tuning_record.json")
            packed = member.read().decode().strip() if member is not None else ""
        if shared:
            # The pool: bob's job starts from alice's bests, and shows and ships them.
            assert [t["best_latency_us"] for t in bob_tasks] == [t["best_latency_us"] for t in alice_tasks]
            assert _records_in(bob_records.content) > 0
            assert best.status_code == 200
            assert packed
        else:
            assert all(t["best_latency_us"] is None for t in bob_tasks)
            assert _records_in(bob_records.content) == 0
            assert best.status_code == 404
            assert not packed
        # Alice's own view is unaffected either way.
        assert _records_in(client.get(f"/api/v1/jobs/{alices['id']}/records", headers=ALICE).content) > 0
        curve = client.get(f"/api/v1/jobs/{alices['id']}/curve", headers=ALICE).json()
        assert json.dumps(curve["warm_start_us"]) == "{}"
