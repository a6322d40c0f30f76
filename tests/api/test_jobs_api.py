"""Jobs over HTTP: validation, listing, cancellation, and a real tuned job's tasks, curves, schedules, files."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from tests.api.conftest import onnx_bytes
from tests.model_builders import build_mlp
from tuner.jobs.worker import Worker
from tuner.settings import Settings
from tuner.store import Store


def _submit(client: TestClient, model_id: str, **fields) -> dict:
    response = client.post("/api/v1/jobs", json={"model_id": model_id, **fields})
    assert response.status_code == 202, response.text
    return response.json()


def test_submitted_job_is_queued_with_a_resolved_target(client: TestClient, mlp_model: dict) -> None:
    job = _submit(client, mlp_model["id"], trials=8, seed=3)
    assert job["status"] == "queued" and job["stage"] is None
    assert job["target"]["kind"] == "llvm" and "mcpu" in job["target"]
    assert job["target_key"].startswith("llvm -mcpu=")
    assert job["runner"] == {"kind": "local"} and job["cost_model"] == "xgb" and job["seed"] == 3
    assert job["progress"] == {"trials_done": 0, "trials_total": 0, "tasks_done": 0, "tasks_total": 0}
    assert job["precision"] == "auto"  # the default: int8 with calibration inputs, else bf16 or as-is
    assert client.get(f"/api/v1/jobs/{job['id']}").json()["id"] == job["id"]
    assert _submit(client, mlp_model["id"], trials=8, precision="bf16")["precision"] == "bf16"
    assert _submit(client, mlp_model["id"], trials=8, precision="auto")["precision"] == "auto"
    assert job["workers"] == 1 and job["task_groups"] == []


def test_a_split_job_lists_its_task_groups(
    client: TestClient, mlp_model: dict, api_settings: Settings
) -> None:
    job = _submit(client, mlp_model["id"], trials=8, workers=2)
    assert job["workers"] == 2 and job["task_groups"] == []  # split when its worker plans it
    store = Store.from_settings(api_settings)
    store.split_job(job["id"], [([0], 5), ([1], 3)], None)
    groups = client.get(f"/api/v1/jobs/{job['id']}").json()["task_groups"]
    assert [(g["index"], g["task_indices"], g["trials"], g["status"], g["worker"]) for g in groups] == [
        (0, [0], 5, "queued", None),
        (1, [1], 3, "queued", None),
    ]


def test_devices_say_which_bf16_instructions_the_servers_cpu_has(client: TestClient) -> None:
    """What the dashboard's form proposes ``auto`` by, against the kernel's own list of the CPU's flags."""
    flags = next(
        set(line.split(":", 1)[1].split())
        for line in Path("/proc/cpuinfo").read_text().splitlines()
        if line.startswith("flags")
    )
    expected = [
        name for name, flag in (("amx-bf16", "amx_bf16"), ("avx512bf16", "avx512_bf16")) if flag in flags
    ]
    assert client.get("/api/v1/devices").json()["host_bf16"] == expected


def test_a_job_budget_is_trials_time_or_both(client: TestClient, mlp_model: dict) -> None:
    default = _submit(client, mlp_model["id"])
    assert default["trials"] == 64 and default["time_budget_s"] is None
    assert default["tuning_s"] == 0 and default["tuning_remaining_s"] is None
    timed = _submit(client, mlp_model["id"], time_budget_s=1800)
    assert timed["trials"] is None and timed["time_budget_s"] == 1800.0  # no trial limit
    assert timed["tuning_remaining_s"] == 1800.0
    both = _submit(client, mlp_model["id"], trials=100, time_budget_s=90.5)
    assert both["trials"] == 100 and both["time_budget_s"] == 90.5
    assert client.get(f"/api/v1/jobs/{timed['id']}").json()["time_budget_s"] == 1800.0


@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        ({"target": {"kind": "opencl-fpga"}}, "invalid_target"),
        ({"target": "not a target"}, "invalid_target"),
        ({"trials": -1}, "invalid_request"),
        ({"cost_model": "oracle"}, "invalid_request"),
        ({"precision": "int4"}, "invalid_request"),
        ({"runner": {"kind": "ssh"}}, "invalid_request"),
        ({"runner": {"kind": "rpc", "tracker": "no-port", "key": "cpu"}}, "invalid_spec"),
        ({"runner": {"kind": "rpc", "tracker": "127.0.0.1:9190"}}, "invalid_request"),
        ({"input_shapes": {"nope": [1, 2]}}, "invalid_spec"),
        ({"surprise": 1}, "invalid_request"),
        # Strict types: a string or a boolean is not a number.
        ({"trials": "4"}, "invalid_request"),
        ({"trials": True}, "invalid_request"),
        ({"seed": "1"}, "invalid_request"),
        ({"max_trials_per_task": 2.5}, "invalid_request"),
        ({"time_budget_s": 0}, "invalid_request"),
        ({"time_budget_s": -30}, "invalid_request"),
        ({"time_budget_s": "30m"}, "invalid_request"),
        ({"time_budget_s": 10**9}, "invalid_request"),
        ({"workers": 0}, "invalid_request"),
        ({"workers": 65}, "invalid_request"),
        ({"workers": "2"}, "invalid_request"),
        ({"input_shapes": {"x": ["1", 256]}}, "invalid_request"),
        # Targets this machine's local runner cannot run, or that make no sense.
        ({"target": {"kind": "llvm", "num-cores": 10**9}}, "invalid_target"),
        ({"target": {"kind": "llvm", "num-cores": "2"}}, "invalid_target"),
        ({"target": {"kind": "llvm", "num-cores": True}}, "invalid_target"),
        ({"target": {"kind": "cuda"}}, "invalid_target"),
        ({"target": {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "num-cores": 1}}, "invalid_target"),
        ({"target": {"kind": "llvm", "num-cores": 1, "bogus-key": 1}}, "invalid_target"),
        # Instructions this CPU lacks asked for through mattr, not mcpu (APX: none of these machines has it).
        ({"target": {"kind": "llvm", "mattr": ["+egpr", "+ndd"]}}, "invalid_target"),
        # Sizes no real request comes near.
        ({"input_shapes": {"x": [1] * 17}}, "invalid_request"),
        ({"input_shapes": {f"x{i}": [1] for i in range(257)}}, "invalid_request"),
        ({"target": {f"k{i}": 1 for i in range(33)}}, "invalid_request"),
        ({"target": "x" * 300}, "invalid_request"),
        # Shapes that contradict the model's static input x [1, 256].
        ({"input_shapes": {"x": [2, 256]}}, "invalid_spec"),
        ({"input_shapes": {"x": [1, 256, 1]}}, "invalid_spec"),
    ],
)
def test_bad_job_requests_are_422_and_create_nothing(
    client: TestClient, mlp_model: dict, fields: dict, kind: str
) -> None:
    response = client.post("/api/v1/jobs", json={"model_id": mlp_model["id"], **fields})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["kind"] == kind
    assert client.get("/api/v1/jobs").json()["total"] == 0


def test_bad_job_specs_say_why(client: TestClient, mlp_model: dict) -> None:
    def message(**fields: object) -> str:
        response = client.post("/api/v1/jobs", json={"model_id": mlp_model["id"], **fields})
        assert response.status_code == 422, response.text
        return response.json()["error"]["message"]

    assert "no CPU target has more than 1024" in message(target={"kind": "llvm", "num-cores": 10**9})
    assert "not on a 'cuda' device" in message(target={"kind": "cuda"})
    assert "'bogus-key' is not known for kind 'llvm'" in message(target={"kind": "llvm", "bogus-key": 1})
    assert "is fixed to 1 by the model, not 2" in message(input_shapes={"x": [2, 256]})
    assert "trials" in message(trials="4")
    assert "mattr ['+egpr', '+ndd'] asks for instructions this machine's CPU lacks (egpr, ndd)" in message(
        target={"kind": "llvm", "mattr": ["+egpr", "+ndd"]}
    )
    # What the client sent is not echoed back, however much of it there is.
    assert len(message(input_shapes={"x": [-1] * 2000})) < 200
    assert len(message(input_shapes={f"x{i}": "bad" for i in range(200)})) < 1000
    assert client.get("/api/v1/jobs").json()["total"] == 0


def test_job_for_an_unknown_model_is_404(client: TestClient) -> None:
    response = client.post("/api/v1/jobs", json={"model_id": "f" * 32})
    assert response.status_code == 404


def test_dynamic_model_needs_shapes_at_submission(client: TestClient) -> None:
    # Uploaded with a shape: the stored signature is static, so jobs need none.
    data = onnx_bytes(build_mlp(batch="batch"))
    model = client.post(
        "/api/v1/models", files={"file": ("dyn.onnx", data)}, data={"input_shapes": '{"x": [2, 256]}'}
    ).json()
    assert _submit(client, model["id"], trials=4)["status"] == "queued"


def test_jobs_are_listed_newest_first_filtered_and_paginated(client: TestClient, mlp_model: dict) -> None:
    ids = [_submit(client, mlp_model["id"], trials=4, seed=i)["id"] for i in range(5)]
    client.post(f"/api/v1/jobs/{ids[0]}/cancel")
    page = client.get("/api/v1/jobs", params={"limit": 2, "offset": 1}).json()
    assert page["total"] == 5 and page["limit"] == 2 and page["offset"] == 1
    assert [j["id"] for j in page["items"]] == [ids[3], ids[2]]
    queued = client.get("/api/v1/jobs", params={"status": "queued"}).json()
    assert queued["total"] == 4 and ids[0] not in [j["id"] for j in queued["items"]]
    assert client.get("/api/v1/jobs", params={"status": "exploded"}).status_code == 422


def test_cancelling_a_queued_job_cancels_it_at_once(client: TestClient, mlp_model: dict) -> None:
    job = _submit(client, mlp_model["id"], trials=4)
    cancelled = client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert cancelled.status_code == 202
    assert cancelled.json()["status"] == "cancelled"
    again = client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert again.status_code == 409 and again.json()["error"]["kind"] == "conflict"
    artifact = client.get(f"/api/v1/jobs/{job['id']}/artifact")
    assert artifact.status_code == 409
    assert "cancelled" in artifact.json()["error"]["message"]


def test_artifact_of_a_queued_job_is_409(client: TestClient, mlp_model: dict) -> None:
    job = _submit(client, mlp_model["id"], trials=4)
    response = client.get(f"/api/v1/jobs/{job['id']}/artifact")
    assert response.status_code == 409
    assert "queued" in response.json()["error"]["message"]


def test_events_of_a_finished_job_end_at_once(client: TestClient, mlp_model: dict) -> None:
    job = _submit(client, mlp_model["id"], trials=4)
    client.post(f"/api/v1/jobs/{job['id']}/cancel")
    with client.stream("GET", f"/api/v1/jobs/{job['id']}/events") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        text = "".join(response.iter_text())
    assert "event: end" in text
    data = json.loads(text.split("data: ", 1)[1].splitlines()[0])
    assert data["job"]["status"] == "cancelled" and data["tasks"] == []


def test_unknown_job_routes_are_404(client: TestClient) -> None:
    paths = (
        "",
        "/tasks",
        "/tasks/1/curve",
        "/tasks/1/best",
        "/tasks/1/asm",
        "/events",
        "/artifact",
        "/records",
        "/ir",
        "/ir/0",
        "/profile",
    )
    for path in paths:
        response = client.get(f"/api/v1/jobs/nope{path}")
        assert response.status_code == 404, path
        assert response.json()["error"]["kind"] == "not_found"
    assert client.post("/api/v1/jobs/nope/cancel").status_code == 404


@pytest.mark.slow
def test_a_tuned_job_exposes_tasks_curves_schedules_and_files(
    client: TestClient, api_settings: Settings, mlp_model: dict, tmp_path: Path
) -> None:
    from kiln_tvm import ms

    job = _submit(client, mlp_model["id"], trials=16, seed=1)
    worker = Worker(api_settings.model_copy(update={"profile_budget_s": 2.0}), "test-worker")
    finished = worker.run_once()
    assert finished is not None and finished.id == job["id"]

    body = client.get(f"/api/v1/jobs/{job['id']}").json()
    assert body["status"] == "succeeded", body["error"]
    assert body["stage"] is None and body["worker"] == "test-worker" and body["attempts"] == 1
    assert body["progress"] == {"trials_done": 16, "trials_total": 16, "tasks_done": 2, "tasks_total": 2}
    assert body["tuned_latency_ms"] > 0 and body["speedup"] == pytest.approx(
        body["baseline_latency_ms"] / body["tuned_latency_ms"]
    )

    assert body["model_name"] == "mlp"
    assert set(body["reference_latency_ms"]) == {"onnxruntime"}
    assert body["reference_latency_ms"]["onnxruntime"] > 0

    curve = client.get(f"/api/v1/jobs/{job['id']}/curve").json()
    assert [p["index"] for p in curve["points"]] == list(range(1, 17))
    # Against the peer the job measured, and the latency it measured itself.
    assert curve["peer"] == "onnxruntime"
    assert curve["peer_ms"] == body["reference_latency_ms"]["onnxruntime"]
    assert curve["latency_ms"] == body["tuned_latency_ms"]
    estimates = [p["estimate_us"] for p in curve["points"]]
    first = next(i for i, e in enumerate(estimates) if e is not None)
    assert all(e is not None for e in estimates[first:])  # once every task has a best, always
    assert estimates[first:] == sorted(estimates[first:], reverse=True)  # never gets worse
    graph = client.get(f"/api/v1/jobs/{job['id']}/graph").json()
    assert graph["fusion"]["kernels_after"] == 2 and "R.call_tir" in graph["graph"]

    # The lowering, level by level: as imported, then each graph pass, ending in the fused program.
    levels = client.get(f"/api/v1/jobs/{job['id']}/ir").json()
    assert levels[0]["name"] == "imported" and [lv["position"] for lv in levels] == list(range(len(levels)))
    assert "text" not in levels[0]  # listed without their programs
    fuse = client.get(f"/api/v1/jobs/{job['id']}/ir/FuseTIR").json()
    assert fuse["changed"] and fuse["kernels"] == 2 and "R.call_tir" in fuse["text"]
    first = client.get(f"/api/v1/jobs/{job['id']}/ir/0").json()
    assert "R.matmul" in first["text"] and first["kernels"] == 0
    missing = client.get(f"/api/v1/jobs/{job['id']}/ir/NoSuchPass")
    assert missing.status_code == 404 and "0 imported" in missing.json()["error"]["message"]

    tasks = client.get(f"/api/v1/jobs/{job['id']}/tasks").json()
    assert len(tasks) == 2 and sum(t["trials"] for t in tasks) == 16
    assert sum(t["share"] for t in tasks) == pytest.approx(1.0)
    assert curve["points"][-1]["estimate_us"] == pytest.approx(
        sum(t["weight"] * t["best_latency_us"] for t in tasks)
    )
    for task in tasks:
        curve = client.get(f"/api/v1/jobs/{job['id']}/tasks/{task['id']}/curve").json()
        points = curve["points"]
        assert len(points) == task["trials"]
        assert [p["index"] for p in points] == list(range(1, len(points) + 1))
        bests = [p["best_us"] for p in points if p["best_us"] is not None]
        assert bests == sorted(bests, reverse=True)  # best so far never gets worse
        assert bests[-1] == pytest.approx(task["best_latency_us"])

        best = client.get(f"/api/v1/jobs/{job['id']}/tasks/{task['id']}/best").json()
        assert best["latency_us"] == pytest.approx(task["best_latency_us"])
        assert "sch.get_sblock" in best["trace"] and "sch.split" in best["trace"]
        assert "@T.prim_func" in best["tir"] and "@T.prim_func" in best["tir_before"]
        assert best["tir"] != best["tir_before"]

        # The kernel as compiled into the model, as x86 assembly.
        asm = client.get(f"/api/v1/jobs/{job['id']}/tasks/{task['id']}/asm").json()
        assert asm["name"] == task["name"] and "_compute_:" in asm["text"]
        assert asm["mix"]["instructions"] > 0
    # The 256 x 512 matmul's tuned kernel multiplies with packed vector FMAs, not scalar ones. Which width
    # wins is the search's measured choice: with the trials the scheduler now gives this task, a CI run's
    # fastest candidate used 128-bit FMAs (32 xmm, in a kernel whose widest vectors are 512-bit).
    big = max(tasks, key=lambda t: t["flops"])
    mix = client.get(f"/api/v1/jobs/{job['id']}/tasks/{big['id']}/asm").json()["mix"]
    packed = mix["fma"]["zmm"] + mix["fma"]["ymm"] + mix["fma"]["xmm"]
    assert packed > 0 and packed > mix["fma"]["scalar"] and mix["widest_vector_bits"] >= 256, mix

    # The tuned model's profile: both kernels, under the roofline, beside onnxruntime's nodes.
    profile = client.get(f"/api/v1/jobs/{job['id']}/profile").json()
    kernels = [k for k in profile["kernels"] if k["kind"] == "kernel"]
    for task in tasks:  # each task's kernel (renamed "..._prepacked" where its weights were prepacked)
        assert any(k["name"].startswith(task["name"]) for k in kernels), (task["name"], kernels)
    assert sum(k["share"] for k in profile["kernels"]) == pytest.approx(1.0)
    top = next(k for k in kernels if k["name"].startswith(big["name"]))
    assert top["flops"] > 0 and top["gflops"] > 0 and top["bound"] in ("memory", "compute")
    assert 0 < top["attainable_gflops"] <= profile["limits"]["peak_gflops"]
    assert profile["limits"]["bandwidth_gbs"] > 0 and "STREAM" in profile["limits"]["how"]
    assert profile["onnxruntime_total_us"] > 0 and any(n["kernel"] for n in profile["onnxruntime_nodes"])
    assert profile["latency_ms"] == pytest.approx(body["tuned_latency_ms"])

    artifact = client.get(f"/api/v1/jobs/{job['id']}/artifact")
    assert artifact.status_code == 200
    assert artifact.headers["content-type"] == "application/gzip"
    assert "attachment" in artifact.headers["content-disposition"]
    with tarfile.open(fileobj=io.BytesIO(artifact.content), mode="r:gz") as tar:
        names = tar.getnames()
        manifest = json.load(tar.extractfile("manifest.json"))
    assert {"model.so", "manifest.json", "run.py"} <= set(names)
    assert manifest["job_id"] == job["id"]

    records = client.get(f"/api/v1/jobs/{job['id']}/records")
    assert records.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(records.content), mode="r:gz") as tar:
        tar.extractall(tmp_path / "rec", filter="data")
    database = ms.database.JSONDatabase(
        path_workload=str(tmp_path / "rec/records/database_workload.json"),
        path_tuning_record=str(tmp_path / "rec/records/database_tuning_record.json"),
        allow_missing=False,
    )
    assert len(database) == 16

    metrics = client.get("/metrics").text
    assert 'kiln_jobs{status="succeeded"} 1.0' in metrics
    assert "kiln_trials_measured_total 16.0" in metrics
    assert 'kiln_records_stored{valid="true"} 16.0' in metrics
    assert "kiln_queue_wait_seconds_count 1.0" in metrics

    with client.stream("GET", f"/api/v1/jobs/{job['id']}/events") as response:
        assert "event: end" in "".join(response.iter_text())


def test_healthz_reports_the_database(client: TestClient, api_settings: Settings) -> None:
    body = client.get("/healthz").json()
    head = Store.from_settings(api_settings).head_revision()
    assert body == {
        "status": "ok",
        "database": "sqlite",
        "schema_revision": head,
        "embedded_workers": 0,
        "auth": False,
    }


def test_the_dashboard_and_its_vendored_libraries_are_served(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for asset in (
        "/static/app.js",
        "/static/style.css",
        "/static/vendor/uplot/uPlot.iife.min.js",
        "/static/vendor/highlight/highlight.min.js",
    ):
        assert f'"{asset}"' in page.text
        response = client.get(asset)
        assert response.status_code == 200, asset
        assert len(response.content) > 1000
    assert "cdn" not in page.text.lower() and "https://" not in page.text  # nothing from the internet


def test_a_failed_job_says_why_in_one_sentence_without_server_paths(
    client: TestClient, api_settings: Settings, mlp_model: dict, mlp_bytes: bytes
) -> None:
    # The model's stored bytes are lost from the worker's disk after the job was queued.
    job = _submit(client, mlp_model["id"], trials=8, seed=1)
    blob = next(p for p in api_settings.blob_dir.rglob("*") if p.is_file())
    blob.unlink()
    Worker(api_settings, "test-worker").run_once()

    body = client.get(f"/api/v1/jobs/{job['id']}").json()
    assert body["status"] == "failed"
    assert body["error"].startswith(
        "the stored file of model 'mlp' is missing from the server's data directory"
    )
    assert "\n" not in body["error"] and str(api_settings.data_dir) not in body["error"]
    listed = client.get("/api/v1/jobs").json()["items"]
    assert [j["error"] for j in listed if j["id"] == job["id"]] == [body["error"]]

    # As the message says, uploading the same bytes again brings the file back.
    again = client.post("/api/v1/models", files={"file": ("mlp.onnx", mlp_bytes)})
    assert again.status_code == 200 and again.json()["id"] == mlp_model["id"]
    assert blob.read_bytes() == mlp_bytes


def test_a_job_measures_only_through_the_trackers_the_operator_configured(
    api_settings: Settings, mlp_bytes: bytes
) -> None:
    """A job picks a device key, not an address: a tracker field anyone could point at any host and port
    made the worker a port scanner."""
    rpc = {"kind": "rpc", "key": "cpu"}

    def submit(client: TestClient, runner: dict) -> dict:
        model = client.post("/api/v1/models", files={"file": ("mlp.onnx", mlp_bytes)}).json()
        return client.post(
            "/api/v1/jobs", json={"model_id": model["id"], "trials": 4, "runner": runner}
        ).json()

    with TestClient(create_app(api_settings)) as client:  # no tracker configured
        refused = submit(client, {**rpc, "tracker": "127.0.0.1:9190"})
        assert refused["error"]["kind"] == "invalid_spec"
        assert "no RPC tracker configured (KILN_RPC_TRACKER" in refused["error"]["message"]
    configured = api_settings.model_copy(
        update={"rpc_tracker": "127.0.0.1:9190", "rpc_trackers": "10.0.0.5:9190, 127.0.0.1:9190"}
    )
    with TestClient(create_app(configured)) as client:
        elsewhere = submit(client, {**rpc, "tracker": "192.0.2.1:22"})
        assert elsewhere["error"] == {
            "kind": "invalid_spec",
            "message": "RPC tracker '192.0.2.1:22' is not one this server uses (127.0.0.1:9190, 10.0.0.5:9190); "
            "pick a device key at one of them (GET /api/v1/devices), or leave the tracker out",
        }
        assert submit(client, rpc)["runner"] == {"kind": "rpc", "tracker": "127.0.0.1:9190", "key": "cpu"}
        second = submit(client, {**rpc, "tracker": "10.0.0.5:9190"})
        assert second["runner"]["tracker"] == "10.0.0.5:9190"
        assert client.get("/api/v1/jobs").json()["total"] == 2  # nothing queued for the refused ones
