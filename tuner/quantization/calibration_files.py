"""Calibration files kept in the data directory, each by the sha256 of its bytes (its id), and read for a
job's model (numpy only: a submission checks them without loading onnx or onnxruntime)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tuner.entities import ModelFormat, ModelInfo, TensorSpec
from tuner.errors import InvalidSpec, NotFound
from tuner.quantization.calibration import CalibrationSet, check_npz, read_calibration, synthetic_calibration
from tuner.settings import Settings

_ID = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class StoredCalibration:
    """A kept calibration file: its id and its arrays (name -> shape, dtype)."""

    id: str
    arrays: dict[str, tuple[tuple[int, ...], str]]
    size_bytes: int


def save_calibration(settings: Settings, data: bytes) -> StoredCalibration:
    """Check ``data`` (:func:`~tuner.quantization.calibration.check_npz`) and keep it; the same bytes get
    the same id."""
    arrays = check_npz(data, settings.max_calibration_mb << 20)
    digest = hashlib.sha256(data).hexdigest()
    path = settings.calibration_dir / f"{digest}.npz"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".part")
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    return StoredCalibration(digest, arrays, len(data))


def calibration_bytes(settings: Settings, calibration_id: str) -> bytes:
    """The bytes of a kept calibration file; :class:`~tuner.errors.NotFound` for an unknown id."""
    path = calibration_path(settings, calibration_id)
    return path.read_bytes()


def calibration_path(settings: Settings, calibration_id: str) -> Path:
    """Where a kept calibration file is; :class:`~tuner.errors.NotFound` for an unknown id."""
    path = settings.calibration_dir / f"{calibration_id}.npz"
    if not _ID.fullmatch(calibration_id) or not path.is_file():
        raise NotFound(f"calibration file '{calibration_id}' not found: upload it again")
    return path


def check_int8_model(model: ModelInfo) -> None:
    """:class:`~tuner.errors.InvalidSpec` when the int8 policy cannot quantize ``model``."""
    if model.format not in (ModelFormat.ONNX, ModelFormat.TORCH_EXPORT):
        raise InvalidSpec(
            f"precision int8 quantizes ONNX models and torch.export programs (exported to ONNX first); "
            f"'{model.name}' is a {model.format.value} program, which Kiln cannot export to ONNX (the "
            "converters trace Python functions, not a serialized export): export it to ONNX yourself, or "
            "tune it with precision as-is or bf16"
        )


def job_inputs(model: ModelInfo, shapes: dict[str, tuple[int, ...]]) -> tuple[TensorSpec, ...]:
    """The model's inputs at the shapes a job plans them for."""
    return tuple(
        dataclasses.replace(t, shape=tuple(shapes.get(t.name, t.shape))) for t in model.signature.inputs
    )


def job_calibration(
    settings: Settings, calibration_id: str | None, inputs: tuple[TensorSpec, ...]
) -> CalibrationSet:
    """A kept calibration file read for ``inputs`` and split; seeded synthetic samples without one."""
    if calibration_id is None:
        return synthetic_calibration(inputs)
    data = calibration_bytes(settings, calibration_id)
    return read_calibration(data, inputs, max_bytes=settings.max_calibration_mb << 20)
