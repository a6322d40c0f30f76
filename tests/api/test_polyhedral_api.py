"""The polyhedral routes: a job tuned in the cpu-poly space shows each task's analysis, the best schedule's
tiles against the caches and the search's pruning figures; a model's planned task shows its analysis
without tuning."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tuner.jobs.worker import Worker
from tuner.settings import Settings


def test_a_planned_task_has_its_polyhedral_analysis(client: TestClient, mlp_model: dict) -> None:
    base = f"/api/v1/models/{mlp_model['id']}/tasks"
    tasks = client.get(base).json()["tasks"]
    for index, task in enumerate(tasks):
        body = client.get(f"{base}/{index}/polyhedral", params={"target": "host"}).json()
        assert body["exact"] and body["domain"].startswith("{ S0[")
        matmul = next(s for s in body["statements"] if s["name"] == "matmul")
        assert matmul["dependence_summary"] == "carried only by the reduction loop k"
        k = next(loop for loop in body["loops"] if loop["statement"] == "matmul" and loop["loop"] == "k")
        assert k["reduction"] and not k["parallel"] and k["kind"] == "reduction"
        assert any(f["producer"] == "matmul" and f["depth"] >= 1 for f in body["fusion"]), task["name"]
        assert body["best_schedule"] is None and body["search"] is None
        assert body["caches"]["source"] in ("sysfs", "unknown")
    missing = client.get(f"{base}/{len(tasks)}/polyhedral")
    assert missing.status_code == 404 and "there is no task" in missing.json()["error"]["message"]
    assert client.get("/api/v1/models/nope/tasks/0/polyhedral").status_code == 404


@pytest.mark.slow
def test_a_cpu_poly_job_shows_its_tiles_and_its_pruning(
    client: TestClient, api_settings: Settings, mlp_model: dict
) -> None:
    response = client.post(
        "/api/v1/jobs", json={"model_id": mlp_model["id"], "trials": 24, "space": "cpu-poly", "seed": 2}
    )
    assert response.status_code == 202, response.text
    job = response.json()
    assert job["space"] == "cpu-poly"
    settings = api_settings.model_copy(update={"poly_seeds": 2})
    finished = Worker(settings, "test-worker").run_once()
    assert finished is not None and finished.id == job["id"]
    assert client.get(f"/api/v1/jobs/{job['id']}").json()["status"] == "succeeded"

    tasks = client.get(f"/api/v1/jobs/{job['id']}/tasks").json()
    assert all(t["search_stats"]["seeds"] >= 1 for t in tasks)
    tiled = 0
    for task in tasks:
        body = client.get(f"/api/v1/jobs/{job['id']}/tasks/{task['id']}/polyhedral").json()
        assert body["search"]["space"] == "cpu-poly"
        assert body["search"]["seeds"] == task["search_stats"]["seeds"]
        assert body["search"]["rejected"] <= body["search"]["examined"]
        best = body["best_schedule"]
        assert best["latency_us"] == pytest.approx(task["best_latency_us"])
        for tiling in best["tilings"]:
            tiled += 1
            assert tiling["statement"] == "matmul" and tiling["structure"] == "SSRSRS"
            assert [len(f) for f in tiling["factors"]] == [4, 4, 2]
            assert [c["cut"] for c in tiling["cuts"]] == ["S0", "S1", "R0", "S2", "R1", "S3"]
            totals = [c["total_bytes"] for c in tiling["cuts"]]
            assert totals == sorted(totals, reverse=True) and totals[-1] > 0  # deeper cuts hold less
            if body["caches"]["levels"]:
                assert isinstance(tiling["inside_feasible_set"], bool)
        if not best["tilings"]:
            assert best["note"]
    assert tiled >= 1
    assert client.get(f"/api/v1/jobs/{job['id']}/tasks/999999/polyhedral").status_code == 404


def test_an_unknown_space_is_refused(client: TestClient, mlp_model: dict) -> None:
    response = client.post("/api/v1/jobs", json={"model_id": mlp_model["id"], "trials": 4, "space": "pluto"})
    assert response.status_code == 422
    assert "unknown schedule space 'pluto'" in response.json()["error"]["message"]
