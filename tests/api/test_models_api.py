"""Model upload and inspection over HTTP: status codes, dedup, importer errors, upload limits."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from onnx import TensorProto, helper

from service.app import create_app
from tests.api.conftest import onnx_bytes
from tests.model_builders import PARAMETER_VALUES, build_mlp, parameterized_onnx
from tuner.jobs.worker import Worker
from tuner.settings import Settings


def test_upload_returns_the_model_and_its_signature(client: TestClient, mlp_bytes: bytes) -> None:
    response = client.post("/api/v1/models", files={"file": ("mlp.onnx", mlp_bytes)}, data={"name": "my-mlp"})
    assert response.status_code == 201
    body = response.json()
    assert body["name"] == "my-mlp" and body["format"] == "onnx"
    assert body["size_bytes"] == len(mlp_bytes) and len(body["sha256"]) == 64
    assert body["inputs"] == [{"name": "x", "shape": [1, 256], "dtype": "float32"}]
    assert body["outputs"] == [{"name": "y", "shape": [1, 10], "dtype": "float32"}]
    assert client.get(f"/api/v1/models/{body['id']}").json() == body
    assert [m["id"] for m in client.get("/api/v1/models").json()] == [body["id"]]


def test_same_bytes_again_return_the_existing_model(
    client: TestClient, mlp_model: dict, mlp_bytes: bytes
) -> None:
    again = client.post("/api/v1/models", files={"file": ("copy.onnx", mlp_bytes)})
    assert again.status_code == 200
    assert again.json()["id"] == mlp_model["id"]
    assert len(client.get("/api/v1/models").json()) == 1


def test_name_defaults_to_the_file_name(client: TestClient, mlp_bytes: bytes) -> None:
    body = client.post("/api/v1/models", files={"file": ("resnet-ish.onnx", mlp_bytes)}).json()
    assert body["name"] == "resnet-ish"


def test_corrupt_model_is_422_and_stores_nothing(client: TestClient, api_settings: Settings) -> None:
    response = client.post("/api/v1/models", files={"file": ("broken.onnx", b"\x08\x07garbage" * 10)})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["kind"] == "invalid_model"
    assert "broken.onnx" in error["message"]  # the user's file name, not a temporary one
    assert client.get("/api/v1/models").json() == []
    assert not any((api_settings.data_dir / "uploads").iterdir())


def test_unsupported_operator_is_422_with_the_operator_named(client: TestClient) -> None:
    graph = helper.make_graph(
        [helper.make_node("Det", ["x"], ["d"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info("d", TensorProto.FLOAT, [])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    response = client.post("/api/v1/models", files={"file": ("det.onnx", onnx_bytes(model))})
    assert response.status_code == 422
    assert response.json()["error"] == {
        "kind": "unsupported_operator",
        "message": "operator 'Det' is not supported by the ONNX importer",
    }


@pytest.mark.parametrize("size", [-1, -3])
def test_a_model_declaring_a_negative_size_is_refused_at_upload(client: TestClient, size: int) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [size, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    response = client.post("/api/v1/models", files={"file": ("neg.onnx", onnx_bytes(model))})
    assert response.status_code == 422, response.text
    assert response.json()["error"] == {
        "kind": "invalid_model",
        "message": f"'neg.onnx': input 'x' declares size {size} for axis 0; a dimension is a size (0 or more), "
        "or a name for one given when a job is submitted (input_shapes): export the model with a named "
        "(dynamic) dimension there",
    }
    assert client.get("/api/v1/models").json() == []


def test_dynamic_dimension_needs_input_shapes(client: TestClient) -> None:
    data = onnx_bytes(build_mlp(batch="batch"))
    missing = client.post("/api/v1/models", files={"file": ("dyn.onnx", data)})
    assert missing.status_code == 422
    assert missing.json()["error"]["kind"] == "missing_input_shape"
    assert "'batch'" in missing.json()["error"]["message"]

    given = client.post(
        "/api/v1/models",
        files={"file": ("dyn.onnx", data)},
        data={"input_shapes": json.dumps({"x": [4, 256]})},
    )
    assert given.status_code == 201
    assert given.json()["inputs"][0]["shape"] == [4, 256]


@pytest.mark.parametrize("shapes", ["{not json", '{"x": [0, 256]}', '{"x": "1x256"}', "[1, 256]"])
def test_malformed_input_shapes_are_422(client: TestClient, mlp_bytes: bytes, shapes: str) -> None:
    response = client.post(
        "/api/v1/models", files={"file": ("m.onnx", mlp_bytes)}, data={"input_shapes": shapes}
    )
    assert response.status_code == 422
    assert response.json()["error"]["kind"] == "invalid_spec"


@pytest.mark.slow
def test_inputs_bound_at_upload_are_constants_of_the_model_its_jobs_compile(
    client: TestClient, api_settings: Settings, tmp_path: Path
) -> None:
    data = parameterized_onnx(tmp_path / "topk.onnx").read_bytes()
    refused = client.post("/api/v1/models", files={"file": ("topk.onnx", data)})
    assert refused.status_code == 422 and "Reshape" in refused.json()["error"]["message"]
    bad = client.post(
        "/api/v1/models", files={"file": ("topk.onnx", data)}, data={"input_values": '{"k": [2.5]}'}
    )
    assert bad.status_code == 422 and bad.json()["error"]["kind"] == "invalid_spec"
    assert "not integers" in bad.json()["error"]["message"]

    bound = client.post(
        "/api/v1/models",
        files={"file": ("topk.onnx", data)},
        data={"input_values": json.dumps(PARAMETER_VALUES)},
    )
    assert bound.status_code == 201, bound.text
    model = bound.json()
    assert [t["name"] for t in model["inputs"]] == ["x"]
    assert {b["name"]: b["values"] for b in model["bound_inputs"]} == PARAMETER_VALUES
    assert client.get(f"/api/v1/models/{model['id']}").json()["bound_inputs"] == model["bound_inputs"]

    # A job on it compiles, and verifies itself against onnxruntime running the stored (bound) model.
    job = client.post("/api/v1/jobs", json={"model_id": model["id"], "trials": 0})
    assert job.status_code == 202, job.text
    Worker(api_settings, "test-worker").run_once()
    done = client.get(f"/api/v1/jobs/{job.json()['id']}").json()
    assert done["status"] == "succeeded", done["error"]
    artifact = client.get(f"/api/v1/jobs/{done['id']}/artifact")
    with tarfile.open(fileobj=io.BytesIO(artifact.content)) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
    assert [t["name"] for t in manifest["inputs"]] == ["x"]
    assert {b["name"]: b["values"] for b in manifest["bound_inputs"]} == PARAMETER_VALUES


def test_upload_without_a_file_is_422(client: TestClient) -> None:
    response = client.post("/api/v1/models", data={"name": "x"})
    assert response.status_code == 422
    assert response.json()["error"]["kind"] == "invalid_request"


@pytest.fixture
def small_limit_client(api_settings: Settings) -> TestClient:
    settings = api_settings.model_copy(update={"max_upload_mb": 1})
    with TestClient(create_app(settings)) as c:
        yield c


def test_upload_over_the_limit_is_413(small_limit_client: TestClient) -> None:
    big = b"\0" * (2 << 20)
    response = small_limit_client.post("/api/v1/models", files={"file": ("big.onnx", big)})
    assert response.status_code == 413
    assert response.json()["error"]["kind"] == "payload_too_large"
    assert "1 MiB" in response.json()["error"]["message"]


def test_streamed_upload_over_the_limit_is_cut_off_with_413(small_limit_client: TestClient) -> None:
    sent = 0

    def chunks():  # no Content-Length: the server must count what it reads and stop
        nonlocal sent
        for _ in range(64):
            sent += 64 << 10
            yield b"\0" * (64 << 10)

    response = small_limit_client.post(
        "/api/v1/models",
        content=chunks(),
        headers={"content-type": "multipart/form-data; boundary=xyz"},
    )
    assert response.status_code == 413
    assert response.json()["error"]["kind"] == "payload_too_large"
    assert small_limit_client.get("/api/v1/models").json() == []


def test_unknown_model_is_404(client: TestClient) -> None:
    response = client.get("/api/v1/models/0123456789abcdef")
    assert response.status_code == 404
    assert response.json()["error"]["kind"] == "not_found"


@pytest.mark.slow
def test_task_preview_lists_fused_kernels(client: TestClient, mlp_model: dict) -> None:
    response = client.get(f"/api/v1/models/{mlp_model['id']}/tasks", params={"target": "host"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["target_key"].startswith("llvm -mcpu=")
    names = [t["name"] for t in body["tasks"]]
    assert len(names) == 2 and any("relu" in n for n in names)
    assert all(t["flops"] > 0 and t["weight"] == 1 for t in body["tasks"])
    assert body["fusion"]["operators_before"] > body["fusion"]["kernels_after"] == 2


def test_a_quantized_model_preview_says_what_runs_in_integers(client: TestClient) -> None:
    from schedules.vnni import integer_dot
    from tests.quant_models import QuantSpec, build_qdq_net
    from tuner.targets import host_target, to_tvm_target

    data = onnx_bytes(build_qdq_net("matmul", QuantSpec()))
    uploaded = client.post("/api/v1/models", files={"file": ("mlp_int8.onnx", data)})
    assert uploaded.status_code == 201, uploaded.text
    response = client.get(f"/api/v1/models/{uploaded.json()['id']}/tasks", params={"target": "host"})
    assert response.status_code == 200, response.text
    fusion = response.json()["fusion"]
    assert fusion["integer_ops"] == ["matmul 4x32 @ 32x24 -> int8", "matmul 4x24 @ 24x10 -> int8"]
    assert fusion["kept_float"] == []
    # Neither has a multiple of 16 output columns: on an AVX512-VNNI CPU (or AVX-512 without VNNI) both stay
    # on plain integer kernels; the 8 lanes of AVX-VNNI (or of AVX2's vpmaddwd) take the first.
    dot = integer_dot(to_tvm_target(host_target()))
    lanes = dot.lanes if dot is not None else None
    if lanes == 8:
        assert dot is not None and fusion["integer_kernels"] == dot.kind
        assert fusion["vnni_packed"] == ["matmul 4x32 @ 32x24"]
        assert fusion["vnni_unpacked"] == [
            "matmul 4x24 @ 24x10: 10 output columns (a multiple of 8 is packed)"
        ]
    elif lanes == 16:
        assert dot is not None and fusion["integer_kernels"] == dot.kind and fusion["vnni_packed"] == []
        assert fusion["vnni_unpacked"] == [
            "matmul 4x32 @ 32x24: 24 output columns (a multiple of 16 is packed)",
            "matmul 4x24 @ 24x10: 10 output columns (a multiple of 16 is packed)",
        ]
    else:
        assert fusion["integer_kernels"] == "plain"


def test_task_preview_with_a_bad_target_is_422(client: TestClient, mlp_model: dict) -> None:
    response = client.get(
        f"/api/v1/models/{mlp_model['id']}/tasks", params={"target": '{"kind": "fpga9000"}'}
    )
    assert response.status_code == 422
    assert response.json()["error"]["kind"] == "invalid_target"


@pytest.mark.parametrize("suffix", [".jax", ".mlir"])
def test_upload_of_a_jax_program(client: TestClient, tmp_path, suffix: str) -> None:
    pytest.importorskip("jax")
    from tests.jax_models import export_jax, jax_mlp

    path = export_jax(jax_mlp(batch=2), tmp_path / f"mlp{suffix}")
    response = client.post("/api/v1/models", files={"file": (path.name, path.read_bytes())})
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["format"] == ("jax-export" if suffix == ".jax" else "stablehlo")
    assert body["inputs"] == [{"name": "x", "shape": [2, 64], "dtype": "float32"}]
    assert [o["shape"] for o in body["outputs"]] == [[2, 10], []]


def test_upload_of_stablehlo_with_unsupported_ops_lists_them(client: TestClient, tmp_path) -> None:
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    exported = jax.export.export(jax.jit(lambda x: jnp.sort(jnp.cumsum(x))))(
        jax.ShapeDtypeStruct((8,), jnp.float32)
    )
    response = client.post("/api/v1/models", files={"file": ("ops.mlir", exported.mlir_module().encode())})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["kind"] == "unsupported_operator" and "stablehlo.sort" in error["message"]
