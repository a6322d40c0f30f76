"""Model registration: validate an uploaded file by importing it, keep its bytes by sha256."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tuner.entities import ModelFormat, ModelInfo
from tuner.frontend import ImportedModel, load_model
from tuner.settings import Settings
from tuner.store.sql import Store

BLOB_SUFFIX = {ModelFormat.ONNX: ".onnx", ModelFormat.TORCH_EXPORT: ".pt2"}


def register_model(
    store: Store,
    settings: Settings,
    path: Path,
    name: str | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    owner: str = "",
) -> tuple[ModelInfo, bool]:
    """Import ``path`` (raising a typed error if Kiln cannot use it) and store it once per sha256.

    Returns the model and whether it was new. Nothing is written when the import fails.
    """
    imported = load_model(path, input_shapes)
    existing = store.find_model_by_sha256(imported.sha256, owner)
    if existing is not None:
        return existing, False
    blob_name = imported.sha256 + BLOB_SUFFIX[imported.format]
    _write_blob(settings.blob_dir / blob_name, imported)
    return store.add_model(
        name=name or path.stem,
        format=imported.format,
        sha256=imported.sha256,
        size_bytes=len(imported.canonical_bytes),
        signature=imported.signature,
        blob_path=blob_name,
        owner=owner,
    )


def _write_blob(dest: Path, imported: ImportedModel) -> None:
    if dest.exists():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename, so a crash never leaves a truncated blob under a valid sha256 name.
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".upload-")
    with os.fdopen(fd, "wb") as fh:
        fh.write(imported.canonical_bytes)
    os.replace(tmp, dest)


def model_file(store: Store, settings: Settings, model_id: str) -> Path:
    """Path of a stored model's bytes."""
    return settings.blob_dir / store.model_blob_path(model_id)
