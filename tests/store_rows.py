"""Rows for store-level tests: a model, a job spec and a job, written straight to a store."""

from __future__ import annotations

import json

from tuner.entities import JobSpec, ModelFormat, ModelInfo, ModelSignature, TensorSpec
from tuner.store import Store

#: The target key the jobs of :func:`add_job` are stored under.
TARGET = "llvm -mcpu=znver4 -num-cores=2"

SIGNATURE = ModelSignature(
    inputs=(TensorSpec("x", (1, "batch", 8), "float32"),),
    outputs=(TensorSpec("y", (1, 4), "float32"),),
)


def add_model(store: Store, sha: str = "a" * 64, name: str = "mlp", owner: str = "") -> ModelInfo:
    model, _ = store.add_model(
        owner=owner,
        name=name,
        format=ModelFormat.ONNX,
        sha256=sha,
        size_bytes=1234,
        signature=SIGNATURE,
        blob_path=f"models/{sha}.onnx",
    )
    return model


def spec_for(model_id: str, **overrides: object) -> JobSpec:
    fields: dict[str, object] = {
        "model_id": model_id,
        "target": {"kind": "llvm", "mcpu": "znver4", "num-cores": 2},
        "trials": 64,
        "input_shapes": {"x": (1, 3, 8)},
    }
    fields.update(overrides)
    return JobSpec(**fields)  # type: ignore[arg-type]


def add_job(store: Store, sha: str = "a" * 64) -> str:
    model = store.find_model_by_sha256(sha) or add_model(store, sha)
    return store.create_job(spec_for(model.id), TARGET).id


def add_record(
    store: Store,
    workload_id: int,
    run_secs: list[float],
    *,
    job_id: str | None = None,
    target_key: str = TARGET,
    error: str | None = None,
) -> int:
    """A measured candidate of ``workload_id`` (a failed one: no ``run_secs``, an ``error``); its id."""
    trace = [[["GetSBlock", [], ["C", "main"], ["b0"]]], [[4, [2, 2, 32, 4]]]]
    return store.add_record(
        workload_id=workload_id,
        job_id=job_id,
        target_key=target_key,
        target_json=json.dumps({"kind": "llvm"}),
        trace_json=json.dumps(trace),
        run_secs=run_secs,
        args_info_json="[]",
        record_json=json.dumps([trace, run_secs, {"kind": "llvm"}, []]),
        error=error,
    )
