"""Calibration and validation inputs: an ``.npz`` of a model's inputs, validated and split.

The file holds one array per model input, named after it, the samples stacked along the input's first
(batch) axis: a model whose input is ``[1, 3, 224, 224]`` takes ``[N, 3, 224, 224]``, each slice of the
input's batch size one sample. Kiln splits the samples, in a seeded shuffle, into calibration samples
(the activations' ranges are taken from them) and held-back validation samples (the accuracy budget is
judged on them). Without a file, seeded synthetic inputs stand in, and the report says so.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass

import numpy as np

from tuner.entities import TensorSpec
from tuner.errors import InvalidCalibration

#: The fewest samples a file must hold: one to calibrate on, one to validate on.
MIN_SAMPLES = 2
#: Synthetic samples where the user gives none (calibration + validation).
SYNTHETIC_SAMPLES = 16
#: The seed of the split and of the synthetic inputs.
SPLIT_SEED = 0


@dataclass(frozen=True)
class CalibrationSet:
    """The samples of a model's inputs, split: each sample a dict of input name -> array of the input's
    own shape."""

    calibration: tuple[dict[str, np.ndarray], ...]
    validation: tuple[dict[str, np.ndarray], ...]
    #: Where the samples come from: "file" (the user's) or "synthetic" (seeded normal values).
    source: str

    @property
    def synthetic(self) -> bool:
        return self.source == "synthetic"

    def describe(self) -> str:
        """One line for a report: how many samples of which kind."""
        made = "the user's calibration file" if not self.synthetic else "seeded synthetic inputs"
        return (
            f"{len(self.calibration)} calibration and {len(self.validation)} validation samples from {made}"
        )


def read_calibration(data: bytes, inputs: tuple[TensorSpec, ...], *, max_bytes: int) -> CalibrationSet:
    """The samples of ``data`` (an ``.npz``) for a model with ``inputs`` (static shapes), split;
    :class:`~tuner.errors.InvalidCalibration` with the reason for anything else."""
    arrays = _load_npz(data, max_bytes)
    names = {spec.name for spec in inputs}
    unknown = sorted(set(arrays) - names)
    if unknown:
        raise InvalidCalibration(
            f"calibration array(s) {unknown} are not inputs of the model; its inputs are {sorted(names)}"
        )
    missing = sorted(names - set(arrays))
    if missing:
        raise InvalidCalibration(f"the calibration file has no array for input(s) {missing}")
    counts = {spec.name: _sample_count(arrays[spec.name], spec) for spec in inputs}
    if len(set(counts.values())) > 1:
        detail = ", ".join(f"{name}: {n}" for name, n in counts.items())
        raise InvalidCalibration(f"the inputs' arrays hold different numbers of samples ({detail})")
    count = next(iter(counts.values()))
    if count < MIN_SAMPLES:
        raise InvalidCalibration(
            f"the calibration file holds {count} sample(s); at least {MIN_SAMPLES} are needed "
            "(one to calibrate on, one to validate on)"
        )
    samples = [{spec.name: _sample(arrays[spec.name], spec, i) for spec in inputs} for i in range(count)]
    return split_samples(samples, "file")


def synthetic_calibration(inputs: tuple[TensorSpec, ...], samples: int = SYNTHETIC_SAMPLES) -> CalibrationSet:
    """Seeded synthetic samples (standard normal floats; integers in [0, 10)) for a model with ``inputs``."""
    rng = np.random.default_rng(SPLIT_SEED)
    made = []
    for _ in range(samples):
        sample = {}
        for spec in inputs:
            shape = tuple(int(d) for d in spec.shape)
            if np.issubdtype(np.dtype(spec.dtype), np.floating):
                sample[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
            else:
                sample[spec.name] = rng.integers(0, 10, shape).astype(spec.dtype)
        made.append(sample)
    return split_samples(made, "synthetic")


def split_samples(samples: list[dict[str, np.ndarray]], source: str) -> CalibrationSet:
    """``samples`` shuffled (seeded) and split in half: calibration first (the larger half)."""
    order = np.random.default_rng(SPLIT_SEED).permutation(len(samples))
    cut = (len(samples) + 1) // 2
    calibration = tuple(samples[i] for i in order[:cut])
    validation = tuple(samples[i] for i in order[cut:])
    return CalibrationSet(calibration, validation, source)


def _load_npz(data: bytes, max_bytes: int) -> dict[str, np.ndarray]:
    if len(data) > max_bytes:
        raise InvalidCalibration(
            f"the calibration file is {len(data) / 2**20:.1f} MiB; at most {max_bytes / 2**20:.0f} MiB is accepted"
        )
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
    except zipfile.BadZipFile:
        raise InvalidCalibration("the calibration file is not an .npz archive (numpy.savez)") from None
    if unpacked > max_bytes:
        raise InvalidCalibration(
            f"the calibration file unpacks to {unpacked / 2**20:.1f} MiB; at most {max_bytes / 2**20:.0f} MiB is "
            "accepted"
        )
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except ValueError as err:  # object arrays (pickles) are refused, not loaded
        raise InvalidCalibration(
            f"the calibration file holds an array numpy cannot load safely: {err}"
        ) from None
    except (OSError, zipfile.BadZipFile, EOFError) as err:
        raise InvalidCalibration(f"the calibration file is damaged: {err}") from None


def _sample_count(array: np.ndarray, spec: TensorSpec) -> int:
    """How many samples ``array`` stacks for input ``spec``; the reason it holds none otherwise."""
    shape = tuple(int(d) for d in spec.shape)
    if not _same_kind(array.dtype, np.dtype(spec.dtype)):
        raise InvalidCalibration(
            f"input {spec.name!r} is {spec.dtype}; its calibration array is {array.dtype}"
        )
    if not shape:
        if array.ndim != 1:
            raise InvalidCalibration(
                f"input {spec.name!r} is a scalar: its calibration array is one value per sample, [N], "
                f"not {list(array.shape)}"
            )
        return int(array.shape[0])
    batch = shape[0]
    if (
        array.ndim != len(shape)
        or tuple(array.shape[1:]) != shape[1:]
        or batch <= 0
        or array.shape[0] % batch
    ):
        expected = f"[N * {batch}, {', '.join(map(str, shape[1:]))}]" if len(shape) > 1 else f"[N * {batch}]"
        raise InvalidCalibration(
            f"input {spec.name!r} is {list(shape)}: its calibration array must be {expected} "
            f"(samples stacked along the first axis), not {list(array.shape)}"
        )
    return int(array.shape[0] // batch)


def _sample(array: np.ndarray, spec: TensorSpec, index: int) -> np.ndarray:
    shape = tuple(int(d) for d in spec.shape)
    if not shape:
        return np.asarray(array[index], dtype=spec.dtype)
    batch = shape[0]
    return np.ascontiguousarray(array[index * batch : (index + 1) * batch], dtype=spec.dtype)


def _same_kind(given: np.dtype, wanted: np.dtype) -> bool:
    """Whether ``given`` converts to ``wanted`` without changing what the values mean: the same dtype, or
    floats to floats (float64 samples of a float32 input), integers to integers."""
    if given == wanted:
        return True
    floats = np.issubdtype(given, np.floating) and np.issubdtype(wanted, np.floating)
    integers = np.issubdtype(given, np.integer) and np.issubdtype(wanted, np.integer)
    return floats or integers


def check_npz(data: bytes, max_bytes: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """The arrays of an ``.npz`` (name -> shape, dtype), after the checks every calibration file gets
    before it is kept (an archive numpy loads without pickles, within ``max_bytes``)."""
    return {name: (tuple(a.shape), str(a.dtype)) for name, a in _load_npz(data, max_bytes).items()}
