"""``/api/v1/models``: upload a model, list and inspect models, preview their tuning tasks."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, File, Form, Query, Request, Response, UploadFile
from fastapi.concurrency import run_in_threadpool

from service.deps import OwnerDep, StateDep
from service.disconnect import while_connected
from service.schemas import ErrorOut, ModelOut, ModelTasksOut
from service.schemas.polyhedral import PolyhedralOut
from tuner.entities import ModelInfo, ModelPlan
from tuner.errors import InvalidSpec
from tuner.frontend.input_values import parse_input_values_json
from tuner.model_registry import UPLOAD_SPOOL_PREFIX, base_name, register_model, safe_file_name, upload_spool
from tuner.views.inspection import plan_model, planned_task_polyhedral, preview_caches

router = APIRouter(prefix="/api/v1/models", tags=["models"])

ERRORS = {
    401: {"model": ErrorOut},
    404: {"model": ErrorOut},
    413: {"model": ErrorOut},
    422: {"model": ErrorOut},
}


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
async def upload_model(
    request: Request,
    state: StateDep,
    owner: OwnerDep,
    response: Response,
    file: Annotated[
        UploadFile,
        File(
            description="The model file: .onnx, .pt2 (torch.export), .jax (jax.export) or .mlir (StableHLO)"
        ),
    ],
    name: Annotated[str | None, Form(max_length=255)] = None,
    input_shapes: Annotated[str | None, Form(description='JSON, e.g. {"x": [1, 3, 224, 224]}')] = None,
    input_values: Annotated[
        str | None,
        Form(
            description="JSON: inputs bound to values (the axes, sizes, scales, shape or k a graph takes as "
            'an input), constants of the stored model, e.g. {"axes": [0, 1], "k": 3}'
        ),
    ] = None,
) -> ModelOut:
    shapes = parse_shapes(input_shapes)
    values = parse_input_values_json(input_values)
    if base_name(file.filename) in (".", ".."):
        raise InvalidSpec(
            f"the upload's file name {file.filename!r} is not a file name; send e.g. 'model.onnx'"
        )
    filename = safe_file_name(file.filename, "model.onnx")
    spool = upload_spool(state.settings)
    spool.mkdir(parents=True, exist_ok=True)
    # The importer tells formats apart by content and suffix, and names the file in its errors: keep
    # the client's file name (never its path) in a private directory.
    tmp_dir = Path(tempfile.mkdtemp(dir=spool, prefix=UPLOAD_SPOOL_PREFIX))
    try:
        path = tmp_dir / filename
        await run_in_threadpool(_spool, file, path)

        def register(client_gone: Callable[[], bool]) -> tuple[ModelInfo, bool]:
            return register_model(
                state.store,
                state.settings,
                path,
                name=name or path.stem or "model",
                input_shapes=shapes,
                owner=owner,
                input_values=values,
                sandbox=state.sandbox,
                allow_external_data=False,
                cancelled=client_gone,
            )

        model, created = await while_connected(request, register)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    if not created:
        response.status_code = 200
    return ModelOut.of(model)


def _spool(file: UploadFile, path: Path) -> None:
    file.file.seek(0)
    with path.open("wb") as out:
        shutil.copyfileobj(file.file, out, length=1 << 20)


@router.get("", response_model=list[ModelOut], responses=ERRORS, summary="List models, newest first")
def list_models(state: StateDep, owner: OwnerDep) -> list[ModelOut]:
    return [ModelOut.of(m) for m in state.store.list_models(owner)]


@router.get("/{model_id}", response_model=ModelOut, responses=ERRORS, summary="One model")
def get_model(model_id: str, state: StateDep, owner: OwnerDep) -> ModelOut:
    return ModelOut.of(state.store.get_model(model_id, owner))


TargetQuery = Annotated[str, Query(description="'host' or a TVM target as JSON", max_length=4096)]
ShapesQuery = Annotated[str | None, Query(description='JSON, e.g. {"x": [1, 16]}', max_length=4096)]


async def _planned(
    request: Request, state: StateDep, owner: str, model_id: str, *, target: str, input_shapes: str | None
) -> ModelPlan:
    """The model's plan for ``target`` (planned once in the sandbox, then kept), abandoned with the client."""
    shapes = parse_shapes(input_shapes)

    def plan(client_gone: Callable[[], bool]) -> ModelPlan:
        model = state.store.get_model(model_id, owner)
        return plan_model(
            state.store,
            state.settings,
            state.sandbox,
            model,
            target,
            input_shapes=shapes,
            cancelled=client_gone,
        )

    return await while_connected(request, plan)


@router.get(
    "/{model_id}/tasks",
    response_model=ModelTasksOut,
    responses=ERRORS,
    summary="Preview the fused kernels (tuning tasks) of a model on a target, without tuning",
)
async def model_tasks(
    request: Request,
    model_id: str,
    state: StateDep,
    owner: OwnerDep,
    target: TargetQuery = "host",
    input_shapes: ShapesQuery = None,
) -> ModelTasksOut:
    found = await _planned(request, state, owner, model_id, target=target, input_shapes=input_shapes)
    return ModelTasksOut.of(model_id, found.target_key, found.tasks, found.fusion)


@router.get(
    "/{model_id}/tasks/{index}/polyhedral",
    response_model=PolyhedralOut,
    responses=ERRORS,
    summary="One planned task (by its index in the preview) through the polyhedral layer, without tuning",
)
async def model_task_polyhedral(
    request: Request,
    model_id: str,
    index: int,
    state: StateDep,
    owner: OwnerDep,
    target: TargetQuery = "host",
    input_shapes: ShapesQuery = None,
) -> PolyhedralOut:
    found = await _planned(request, state, owner, model_id, target=target, input_shapes=input_shapes)
    caches = preview_caches(state.settings, target)
    return PolyhedralOut.model_validate(planned_task_polyhedral(found, index, caches))
