"""Bad input through the core's entry points: a typed error with a usable message, and nothing half-written."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from tests.model_builders import build_mlp
from tuner.entities import JobSpec, JobStatus
from tuner.errors import InvalidModel, InvalidSpec, InvalidTarget, MissingInputShape, UnsupportedOperator
from tuner.jobs.pipeline import run_job
from tuner.jobs.submission import submit_job
from tuner.model_registry import model_file, register_model
from tuner.settings import Settings
from tuner.store import Store
from tuner.targets import host_target


def _nothing_stored(store: Store, settings: Settings) -> None:
    assert store.list_models() == []
    assert store.list_jobs() == []
    blobs = list(settings.blob_dir.glob("*")) if settings.blob_dir.exists() else []
    assert blobs == []


def _mlp_file(tmp_path: Path, batch: int | str = 1) -> Path:
    path = tmp_path / "mlp.onnx"
    onnx.save(build_mlp(batch=batch), str(path))
    return path


def test_corrupt_file_is_invalid_model(store: Store, settings: Settings, tmp_path: Path) -> None:
    path = tmp_path / "garbage.onnx"
    path.write_bytes(b"\x08\x07\x12\x04this is not a model" * 50)
    with pytest.raises(InvalidModel, match="garbage.onnx"):
        register_model(store, settings, path)
    _nothing_stored(store, settings)


def test_truncated_file_is_invalid_model(store: Store, settings: Settings, tmp_path: Path) -> None:
    data = _mlp_file(tmp_path).read_bytes()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidModel) as info:
        register_model(store, settings, path)
    assert "truncated.onnx" in info.value.message
    _nothing_stored(store, settings)


def test_unsupported_operators_are_all_named(store: Store, settings: Settings, tmp_path: Path) -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Det", ["x"], ["d"]),
            helper.make_node("MyCustomOp", ["x"], ["c"], domain="com.example"),
            helper.make_node("Relu", ["x"], ["r"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
        [
            helper.make_tensor_value_info("d", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("c", TensorProto.FLOAT, [3, 3]),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, [3, 3]),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    )
    path = tmp_path / "custom.onnx"
    onnx.save(model, str(path))
    with pytest.raises(UnsupportedOperator) as info:
        register_model(store, settings, path)
    assert info.value.operators == ["Det", "MyCustomOp"]
    assert "'Det', 'MyCustomOp' are not supported by the ONNX importer" in info.value.message
    _nothing_stored(store, settings)


def test_dynamic_dimension_needs_a_shape(store: Store, settings: Settings, tmp_path: Path) -> None:
    path = _mlp_file(tmp_path, batch="batch")
    with pytest.raises(MissingInputShape) as info:
        register_model(store, settings, path)
    assert "input 'x'" in info.value.message and "'batch'" in info.value.message
    assert "--input-shape x=" in info.value.message
    _nothing_stored(store, settings)

    model, created = register_model(store, settings, path, input_shapes={"x": (4, 256)})
    assert created and model.signature.inputs[0].shape == (4, 256)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ({"kind": "opencl-fpga"}, "not supported"),
        ({"kind": "llvm", "mcpu": "pentium-9000"}, "does not know the CPU 'pentium-9000'"),
        ({"kind": "llvm", "num-cores": 0}, "positive integer"),
        ({"kind": "llvm", "bogus-option": 1}, "target key 'bogus-option' is not known for kind 'llvm'"),
    ],
)
def test_bad_target_creates_no_job(
    store: Store, settings: Settings, tmp_path: Path, target: dict, message: str
) -> None:
    model, _ = register_model(store, settings, _mlp_file(tmp_path))
    with pytest.raises(InvalidTarget, match=message):
        submit_job(store, JobSpec(model_id=model.id, target=target, trials=4))
    assert store.list_jobs() == []


def test_bad_budget_creates_no_job(store: Store, settings: Settings, tmp_path: Path) -> None:
    model, _ = register_model(store, settings, _mlp_file(tmp_path))
    with pytest.raises(InvalidSpec, match="trials must be >= 0"):
        submit_job(store, JobSpec(model_id=model.id, target=host_target(), trials=-1))
    with pytest.raises(InvalidSpec, match="per task must be >= 1"):
        submit_job(store, JobSpec(model_id=model.id, target=host_target(), trials=8, max_trials_per_task=0))
    assert store.list_jobs() == []


def test_job_whose_model_bytes_are_damaged_fails_with_the_reason(
    store: Store, settings: Settings, tmp_path: Path
) -> None:
    """The stored blob got corrupted after upload: the job fails readably; no tasks, no artifact."""
    model, _ = register_model(store, settings, _mlp_file(tmp_path))
    job = submit_job(store, JobSpec(model_id=model.id, target=host_target(), trials=4))
    model_file(store, settings, model.id).write_bytes(b"corrupted on disk")

    with pytest.raises(InvalidModel):
        run_job(store, settings, job.id)

    failed = store.get_job(job.id)
    assert failed.status is JobStatus.FAILED
    assert "not" in (failed.error or "") and failed.finished_at is not None
    assert store.list_tasks(job.id) == []
    assert store.count_records(job_id=job.id) == 0


def test_a_job_stored_without_submit_checks_fails_before_importing(
    store: Store, settings: Settings, tmp_path: Path
) -> None:
    # A job row written by other means (an older Kiln, a hand-edited database) gets the submit checks too.
    model, _ = register_model(store, settings, _mlp_file(tmp_path))
    spec = JobSpec(model_id=model.id, target=host_target(), trials=4, cost_model="foo")
    job = store.create_job(spec, "llvm", "")
    with pytest.raises(InvalidSpec, match="unknown cost model 'foo'"):
        run_job(store, settings, job.id)
    failed = store.get_job(job.id)
    assert failed.status is JobStatus.FAILED and "cost model" in (failed.error or "")
    assert failed.stage is None and store.list_tasks(job.id) == []
