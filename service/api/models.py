"""``/api/v1/models``: upload a model, list and inspect models, preview their tuning tasks."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, File, Form, Query, Response, UploadFile

from service.deps import OwnerDep, StateDep
from service.schemas import ErrorOut, ModelOut, ModelTasksOut
from tuner.errors import InvalidSpec
from tuner.inspection import plan_model
from tuner.models import register_model

router = APIRouter(prefix="/api/v1/models", tags=["models"])

ERRORS = {
    401: {"model": ErrorOut},
    404: {"model": ErrorOut},
    413: {"model": ErrorOut},
    422: {"model": ErrorOut},
}
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def parse_shapes(text: str | None) -> dict[str, tuple[int, ...]] | None:
    """``{"input": [1, 3, 224, 224]}`` as given in a form field."""
    if text is None or not text.strip():
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidSpec(
            f'input_shapes is not valid JSON ({exc.msg}); e.g. {{"x": [1, 3, 224, 224]}}'
        ) from None
    if not isinstance(data, dict) or not all(
        isinstance(v, list) and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in v)
        for v in data.values()
    ):
        raise InvalidSpec(
            'input_shapes must map input names to lists of positive integers, e.g. {"x": [1, 16]}'
        )
    return {str(k): tuple(v) for k, v in data.items()}


@router.post(
    "",
    status_code=201,
    response_model=ModelOut,
    responses={**ERRORS, 200: {"model": ModelOut, "description": "The same bytes were uploaded before"}},
    summary="Upload an ONNX model or a torch.export program (.pt2)",
)
def upload_model(
    state: StateDep,
    owner: OwnerDep,
    response: Response,
    file: Annotated[UploadFile, File(description="The model file (.onnx or .pt2)")],
    name: Annotated[str | None, Form(max_length=255)] = None,
    input_shapes: Annotated[str | None, Form(description='JSON, e.g. {"x": [1, 3, 224, 224]}')] = None,
) -> ModelOut:
    shapes = parse_shapes(input_shapes)
    filename = _SAFE_NAME.sub("_", Path(file.filename or "model.onnx").name)[-128:] or "model.onnx"
    uploads = state.settings.data_dir / "uploads"
    uploads.mkdir(parents=True, exist_ok=True)
    # The importer tells formats apart by content and suffix, and names the file in its errors: keep
    # the client's file name (never its path) in a private directory.
    tmp_dir = Path(tempfile.mkdtemp(dir=uploads, prefix="upload-"))
    try:
        path = tmp_dir / filename
        with path.open("wb") as out:
            shutil.copyfileobj(file.file, out, length=1 << 20)
        model, created = register_model(
            state.store,
            state.settings,
            path,
            name=name or path.stem or "model",
            input_shapes=shapes,
            owner=owner,
        )
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    if not created:
        response.status_code = 200
    return ModelOut.of(model)


@router.get("", response_model=list[ModelOut], responses=ERRORS, summary="List models, newest first")
def list_models(state: StateDep, owner: OwnerDep) -> list[ModelOut]:
    return [ModelOut.of(m) for m in state.store.list_models(owner)]


@router.get("/{model_id}", response_model=ModelOut, responses=ERRORS, summary="One model")
def get_model(model_id: str, state: StateDep, owner: OwnerDep) -> ModelOut:
    return ModelOut.of(state.store.get_model(model_id, owner))


@router.get(
    "/{model_id}/tasks",
    response_model=ModelTasksOut,
    responses=ERRORS,
    summary="Preview the fused kernels (tuning tasks) of a model on a target, without tuning",
)
def model_tasks(
    model_id: str,
    state: StateDep,
    owner: OwnerDep,
    target: Annotated[str, Query(description="'host' or a TVM target as JSON", max_length=4096)] = "host",
    input_shapes: Annotated[
        str | None, Query(description='JSON, e.g. {"x": [1, 16]}', max_length=4096)
    ] = None,
) -> ModelTasksOut:
    model = state.store.get_model(model_id, owner)
    plan = plan_model(state.store, state.settings, model, target, parse_shapes(input_shapes))
    return ModelTasksOut.of(model.id, plan.target_key, plan.tasks, plan.fusion)
