"""Which kind of model a file is, told from its first bytes and its extension."""

from __future__ import annotations

import zipfile
from pathlib import Path

from tuner.entities import ModelFormat
from tuner.errors import InvalidModel

_ZIP_MAGIC = b"PK\x03\x04"
_SUPPORTED = (
    "Kiln imports ONNX models (.onnx), torch.export programs (.pt2, from torch.export.save) and JAX programs "
    "(.jax from jax.export's serialize(), or StableHLO MLIR text from exported.mlir_module() in a .mlir file)"
)
_MLIR_BYTECODE_MAGIC = b"ML\xefR"
_MLIR_TEXT_STARTS = (b"module", b"#loc", b"func.func", b"//")
_FOREIGN_FORMATS = {
    ".pt": "a PyTorch checkpoint or TorchScript file",
    ".pth": "a PyTorch checkpoint",
    ".pb": "a TensorFlow graph",
    ".tflite": "a TensorFlow Lite model",
    ".h5": "a Keras model",
    ".keras": "a Keras model",
    ".safetensors": "a weights-only file",
    ".mlmodel": "a Core ML model",
}


def detect_format(path: Path) -> ModelFormat:
    """Tell an ONNX file from a ``torch.export`` archive by its first bytes and its extension."""
    path = Path(path)
    head = _read_head(path, 16)
    suffix = path.suffix.lower()
    if not head:
        raise InvalidModel(f"'{path.name}' is empty (0 bytes); {_SUPPORTED}")
    if head.startswith(_ZIP_MAGIC):
        return _classify_zip(path)
    if suffix == ".pt2":
        raise InvalidModel(
            f"'{path.name}' is not a torch.export program: a .pt2 file is a zip archive written by "
            "torch.export.save, and this file is not a zip archive"
        )
    if suffix == ".onnx":
        return ModelFormat.ONNX
    if suffix == ".jax":
        return ModelFormat.JAX_EXPORT
    if (
        suffix == ".mlir"
        or head.startswith(_MLIR_BYTECODE_MAGIC)
        or head.lstrip().startswith(_MLIR_TEXT_STARTS)
    ):
        return ModelFormat.STABLEHLO
    if head[0] == 0x08:
        # An ONNX ModelProto starts with field 1 (ir_version, a varint): tag byte 0x08. This lets blobs
        # stored without an extension through.
        return ModelFormat.ONNX
    hint = _FOREIGN_FORMATS.get(suffix)
    what = f"looks like {hint}" if hint else "is not a model format Kiln knows"
    raise InvalidModel(f"'{path.name}' {what}; {_SUPPORTED}")


def _read_head(path: Path, n: int) -> bytes:
    try:
        with path.open("rb") as f:
            return f.read(n)
    except FileNotFoundError:
        raise InvalidModel(f"model file '{path.name}' does not exist") from None
    except IsADirectoryError:
        raise InvalidModel(f"'{path.name}' is a directory, not a model file") from None
    except OSError as err:
        raise InvalidModel(f"could not read '{path.name}': {err.strerror or 'I/O error'}") from None


def _classify_zip(path: Path) -> ModelFormat:
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as err:
        if path.suffix.lower() == ".pt2":
            return ModelFormat.TORCH_EXPORT  # a truncated archive: loading says what is wrong
        raise InvalidModel(f"'{path.name}' is a damaged zip archive ({err}); {_SUPPORTED}") from None
    if any("/aotinductor/" in f"/{n}" for n in names):
        raise InvalidModel(
            f"'{path.name}' is an AOTInductor package (compiled code), not a torch.export program; "
            "save the program itself with torch.export.save(torch.export.export(model, args), 'model.pt2')"
        )
    if any(n.rsplit("/", 1)[-1] in ("archive_format", "serialized_exported_program.json") for n in names):
        return ModelFormat.TORCH_EXPORT
    if any(n.rsplit("/", 1)[-1] in ("data.pkl", "constants.pkl") for n in names):
        raise InvalidModel(
            f"'{path.name}' was written by torch.save or torch.jit.save, not torch.export.save; export "
            "the model with ep = torch.export.export(model, example_args) and save it with "
            "torch.export.save(ep, 'model.pt2')"
        )
    if path.suffix.lower() == ".pt2":
        return ModelFormat.TORCH_EXPORT
    raise InvalidModel(f"'{path.name}' is a zip archive but not a torch.export program; {_SUPPORTED}")
