"""Calibration files: what an upload kept."""

from __future__ import annotations

from pydantic import BaseModel, Field

from tuner.quantization.calibration_files import StoredCalibration


class CalibrationArrayOut(BaseModel):
    shape: list[int]
    dtype: str


class CalibrationOut(BaseModel):
    id: str = Field(description="The file's id (its sha256): a job's calibration_id")
    size_bytes: int
    arrays: dict[str, CalibrationArrayOut] = Field(
        description="Per array (named after a model input), its shape: the samples along the first axis"
    )

    @classmethod
    def of(cls, stored: StoredCalibration) -> CalibrationOut:
        arrays = {
            name: CalibrationArrayOut(shape=list(shape), dtype=dtype)
            for name, (shape, dtype) in stored.arrays.items()
        }
        return cls(id=stored.id, size_bytes=stored.size_bytes, arrays=arrays)
