"""``/api/v1/calibrations``: upload a calibration file (an .npz of a model's inputs) for int8 jobs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, UploadFile
from fastapi.concurrency import run_in_threadpool

from service.deps import OwnerDep, StateDep
from service.schemas import ErrorOut
from service.schemas.calibration import CalibrationOut
from tuner.errors import InvalidCalibration
from tuner.quantization.calibration_files import save_calibration

router = APIRouter(prefix="/api/v1/calibrations", tags=["calibrations"])

ERRORS = {401: {"model": ErrorOut}, 413: {"model": ErrorOut}, 422: {"model": ErrorOut}}


@router.post(
    "",
    status_code=201,
    response_model=CalibrationOut,
    responses=ERRORS,
    summary="Upload calibration and validation inputs (.npz) for a job with precision int8",
)
async def upload_calibration(
    state: StateDep,
    owner: OwnerDep,
    file: Annotated[
        UploadFile,
        File(
            description="numpy.savez of one array per model input, named after it, the samples stacked along "
            "the input's first axis ([N, 3, 224, 224] for an input [1, 3, 224, 224]); a job's calibration_id "
            "names it, and the job checks it against its model's inputs"
        ),
    ],
) -> CalibrationOut:
    del owner  # any authenticated user may upload; a file is found by its sha256 alone
    limit = state.settings.max_calibration_mb << 20
    data = await run_in_threadpool(file.file.read, limit + 1)
    if len(data) > limit:
        raise InvalidCalibration(
            f"the calibration file is larger than {state.settings.max_calibration_mb} MiB"
        )
    stored = await run_in_threadpool(save_calibration, state.settings, data)
    return CalibrationOut.of(stored)
