"""Model registration: validate an uploaded file by importing it (in the sandbox), keep its bytes by sha256."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.entities import ModelFormat, ModelInfo, ModelSignature
from tuner.errors import NotFound
from tuner.isolation.sandbox import ModelSandbox
from tuner.settings import Settings
from tuner.store.sql import Store

BLOB_SUFFIX = {
    ModelFormat.ONNX: ".onnx",
    ModelFormat.TORCH_EXPORT: ".pt2",
    ModelFormat.JAX_EXPORT: ".jax",
    ModelFormat.STABLEHLO: ".mlir",
}
# Where uploads are spooled while they are imported: one private folder per upload.
UPLOAD_SPOOL_PREFIX = "upload-"
# A blob being written by an import, renamed to its sha256 name once complete.
BLOB_TMP_PREFIX = ".upload-"
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


def register_model(
    store: Store,
    settings: Settings,
    path: Path,
    *,
    name: str | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    owner: str = "",
    sandbox: ModelSandbox | None = None,
    allow_external_data: bool = True,
    cancelled: Callable[[], bool] | None = None,
    input_values: dict[str, Any] | None = None,
) -> tuple[ModelInfo, bool]:
    """Import ``path`` in the sandbox (raising a typed error if Kiln cannot use it) and store it once per
    sha256. Returns the model and whether it was new. Nothing is written when the import fails.

    ``sandbox`` defaults to a one-off one (no warm process); ``allow_external_data=False`` for
    uploads: an ONNX file's weights must be inline. ``input_values`` binds inputs to values (JSON): the
    stored model holds them as constants (:mod:`tuner.frontend.input_values`).

    Bytes stored already, asked for as they were stored, are not imported again (:func:`stored_as_is`):
    the sandbox and TVM are seconds to start.
    """
    known = stored_as_is(
        store, settings, path, owner=owner, input_shapes=input_shapes, input_values=input_values
    )
    if known is not None:
        return known, False
    args = {
        "path": str(Path(path).resolve()),
        "input_shapes": {k: list(v) for k, v in input_shapes.items()} if input_shapes else None,
        "input_values": input_values or None,
        "allow_external_data": allow_external_data,
        "blob_dir": str(settings.blob_dir.resolve()),
        "max_unpacked_mb": settings.max_unpacked_mb,
    }
    with contextlib.nullcontext(sandbox) if sandbox else ModelSandbox(settings, warm_processes=0) as box:
        found = box.run("inspect", args, cancelled)
    tmp_blob = Path(found["blob_tmp"])
    try:
        fmt = ModelFormat(found["format"])
        existing = store.find_model_by_sha256(found["sha256"], owner)
        if existing is not None:
            kept = settings.blob_dir / store.model_blob_path(existing.id)
            if not kept.exists():  # lost from the data directory: the same bytes bring it back
                os.replace(tmp_blob, kept)
            return existing, False
        blob_name = found["sha256"] + BLOB_SUFFIX[fmt]
        dest = settings.blob_dir / blob_name
        if not dest.exists():
            # Renamed whole, so a crash never leaves a truncated blob under a valid sha256 name.
            os.replace(tmp_blob, dest)
        return store.add_model(
            name=name or path.stem,
            format=fmt,
            sha256=found["sha256"],
            size_bytes=int(found["size_bytes"]),
            signature=ModelSignature.from_dict(found["signature"]),
            blob_path=blob_name,
            owner=owner,
        )
    finally:
        tmp_blob.unlink(missing_ok=True)


def stored_as_is(
    store: Store,
    settings: Settings,
    path: Path,
    *,
    owner: str = "",
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    input_values: dict[str, Any] | None = None,
) -> ModelInfo | None:
    """The model of ``owner`` whose stored bytes are ``path``'s, when importing ``path`` again could only
    give it back: no input is bound to a value (that makes other bytes), the file is its own canonical
    form (the stored sha256 is the file's), its bytes are still in the data directory, and every input's
    shape (given, else declared) is static and the one stored."""
    if input_values:
        return None
    with Path(path).open("rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    existing = store.find_model_by_sha256(digest, owner)
    if existing is None or not (settings.blob_dir / store.model_blob_path(existing.id)).is_file():
        return None
    given = input_shapes or {}
    declared = existing.signature.declared_inputs or existing.signature.inputs
    asked = {t.name: tuple(given.get(t.name, t.shape)) for t in declared}
    stored = {t.name: tuple(t.shape) for t in existing.signature.inputs}
    if set(given) - set(asked) or any(type(d) is not int for dims in asked.values() for d in dims):
        return None
    return existing if asked == stored else None


def model_file(store: Store, settings: Settings, model_id: str) -> Path:
    """Path of a stored model's bytes; :class:`NotFound` when they are gone from the data directory."""
    path = settings.blob_dir / store.model_blob_path(model_id)
    if not path.is_file():
        name = store.get_model(model_id).name
        raise NotFound(
            f"the stored file of model '{name}' is missing from the server's data directory: upload the model "
            "again (the same bytes get the same model) and submit a new job"
        )
    return path


def base_name(name: str | None) -> str:
    """The last component of a client's path-like file name (``/`` or ``\\`` separated)."""
    return (name or "").replace("\\", "/").rsplit("/", 1)[-1]


def safe_file_name(name: str | None, default: str) -> str:
    """A plain base name (letters, digits, ``._-``; no path, not hidden) for a client's file name."""
    cleaned = _UNSAFE_NAME_CHARS.sub("_", base_name(name)).strip("._")[-128:]
    return cleaned or default


def artifact_file_name(model_name: str, job_id: str) -> str:
    """What a job's artifact is called when a user downloads or exports it: ``small_cnn-1f2e3d4c.tar.gz``."""
    return safe_file_name(f"{model_name}-{job_id[:8]}.tar.gz", f"model-{job_id[:8]}.tar.gz")


def upload_spool(settings: Settings) -> Path:
    """The folder uploads are spooled in while they are imported."""
    return settings.data_dir / "uploads"


def clean_upload_spools(settings: Settings, older_than_s: float) -> int:
    """Remove spooled uploads left by a server that died mid-upload; returns how many were removed.

    Only spools older than ``older_than_s`` go: another server sharing the data directory may be
    importing the newer ones. Temporary blobs of imports that never finished go too.
    """
    removed = 0
    cutoff = time.time() - older_than_s
    leftovers = [*upload_spool(settings).glob(UPLOAD_SPOOL_PREFIX + "*")]
    leftovers += [*settings.blob_dir.glob(BLOB_TMP_PREFIX + "*")]
    for leftover in leftovers:
        with contextlib.suppress(OSError):
            if leftover.stat().st_mtime < cutoff:
                if leftover.is_dir():
                    shutil.rmtree(leftover)
                else:
                    leftover.unlink()
                removed += 1
    return removed
