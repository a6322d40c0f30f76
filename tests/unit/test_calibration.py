"""Calibration files: an .npz of a model's inputs, validated against the model and split into calibration
and validation samples; refused with the reason when it is not that."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from tuner.entities import TensorSpec
from tuner.errors import InvalidCalibration, NotFound
from tuner.quantization.calibration import read_calibration, synthetic_calibration
from tuner.quantization.calibration_files import calibration_bytes, save_calibration
from tuner.settings import Settings

INPUTS = (TensorSpec("x", (2, 3, 4, 4), "float32"), TensorSpec("ids", (2, 5), "int64"))
LIMIT = 1 << 20


def _npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _samples(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "x": rng.standard_normal((2 * n, 3, 4, 4)),  # float64: converted to the input's float32
        "ids": np.arange(2 * n * 5).reshape(2 * n, 5).astype(np.int32),
    }


def test_samples_are_slices_of_the_batch_split_into_calibration_and_validation() -> None:
    arrays = _samples(5)
    cal = read_calibration(_npz(**arrays), INPUTS, max_bytes=LIMIT)
    assert (len(cal.calibration), len(cal.validation)) == (3, 2) and not cal.synthetic
    every = [*cal.calibration, *cal.validation]
    assert all(s["x"].shape == (2, 3, 4, 4) and s["x"].dtype == np.float32 for s in every)
    assert all(s["ids"].shape == (2, 5) and s["ids"].dtype == np.int64 for s in every)
    # Each sample is one batch-sized slice of the file, each slice used once, x and ids kept together.
    firsts = sorted(int(s["ids"][0, 0]) for s in every)
    assert firsts == [10 * i for i in range(5)]
    for s in every:
        i = int(s["ids"][0, 0]) // 10
        np.testing.assert_array_equal(s["x"], arrays["x"][2 * i : 2 * i + 2].astype(np.float32))
    assert cal.describe() == "3 calibration and 2 validation samples from the user's calibration file"


@pytest.mark.parametrize(
    ("arrays", "reason"),
    [
        (
            {"x": np.zeros((4, 3, 4, 4)), "ids": np.zeros((4, 5), np.int64), "y": np.zeros(3)},
            "['y'] are not inputs",
        ),
        ({"x": np.zeros((4, 3, 4, 4))}, "no array for input(s) ['ids']"),
        ({"x": np.zeros((4, 3, 5, 4)), "ids": np.zeros((4, 5), np.int64)}, "must be [N * 2, 3, 4, 4]"),
        ({"x": np.zeros((3, 3, 4, 4)), "ids": np.zeros((3, 5), np.int64)}, "must be [N * 2, 3, 4, 4]"),
        (
            {"x": np.zeros((4, 3, 4, 4)), "ids": np.zeros((4, 5))},
            "input 'ids' is int64; its calibration array is float64",
        ),
        ({"x": np.zeros((4, 3, 4, 4)), "ids": np.zeros((6, 5), np.int64)}, "different numbers of samples"),
        ({"x": np.zeros((2, 3, 4, 4)), "ids": np.zeros((2, 5), np.int64)}, "holds 1 sample(s); at least 2"),
    ],
    ids=[
        "unknown-name",
        "missing-input",
        "wrong-shape",
        "partial-batch",
        "wrong-dtype",
        "uneven",
        "one-sample",
    ],
)
def test_a_file_that_is_not_samples_of_the_inputs_is_refused_with_the_reason(
    arrays: dict[str, np.ndarray], reason: str
) -> None:
    with pytest.raises(InvalidCalibration) as err:
        read_calibration(_npz(**arrays), INPUTS, max_bytes=LIMIT)
    assert reason in str(err.value)


def test_damaged_oversized_and_pickled_files_are_refused() -> None:
    with pytest.raises(InvalidCalibration, match="not an .npz"):
        read_calibration(b"not a zip file at all", INPUTS, max_bytes=LIMIT)
    big = _npz(**_samples(40))
    with pytest.raises(InvalidCalibration, match="at most"):
        read_calibration(big, INPUTS, max_bytes=len(big) - 1)
    # An object array is a pickle: never loaded.
    buffer = io.BytesIO()
    np.savez(buffer, x=np.array([{"a": 1}, None], dtype=object), ids=np.zeros((4, 5), np.int64))
    with pytest.raises(InvalidCalibration, match="cannot load safely"):
        read_calibration(buffer.getvalue(), INPUTS, max_bytes=LIMIT)
    truncated = _npz(**_samples(4))[:-40]
    with pytest.raises(InvalidCalibration):
        read_calibration(truncated, INPUTS, max_bytes=LIMIT)


def test_synthetic_samples_are_seeded_and_of_the_inputs_types() -> None:
    a, b = synthetic_calibration(INPUTS), synthetic_calibration(INPUTS)
    assert a.synthetic and "seeded synthetic inputs" in a.describe()
    assert len(a.calibration) + len(a.validation) == 16
    np.testing.assert_array_equal(a.validation[0]["x"], b.validation[0]["x"])
    assert a.calibration[0]["ids"].dtype == np.int64 and a.calibration[0]["x"].shape == (2, 3, 4, 4)


def test_kept_files_are_found_by_their_sha256(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, database_url=None)
    data = _npz(**_samples(3))
    stored = save_calibration(settings, data)
    assert save_calibration(settings, data).id == stored.id and len(stored.id) == 64
    assert stored.arrays == {"x": ((6, 3, 4, 4), "float64"), "ids": ((6, 5), "int32")}
    assert calibration_bytes(settings, stored.id) == data
    for unknown in ("0" * 64, "../../etc/passwd"):
        with pytest.raises(NotFound):
            calibration_bytes(settings, unknown)
    with pytest.raises(InvalidCalibration):
        save_calibration(settings, b"junk")
    assert sorted(p.name for p in settings.calibration_dir.iterdir()) == [f"{stored.id}.npz"]
