"""Scrutiny of a ``.pt2`` archive before PyTorch reads it: bounded size, plain members, no code.

``torch.export.load`` unpickles parts of the archive, and its fallbacks unpickle with
``weights_only=False`` (sample inputs), with plain ``pickle.loads`` (opaque constants) or with
TorchScript's unpickler (custom objects): any of them runs code chosen by whoever wrote the file. Kiln
therefore refuses every member that would need unpickling arbitrary objects, naming it, and loads what
is left with ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` set, so that even a member this check misses is read by
PyTorch's restricted (tensors and containers only) unpickler.

The zip's central directory is checked first (member count, total uncompressed size, compression ratio,
member paths), so a small file that inflates to gigabytes is refused before anything is extracted.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
import re
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

from tuner.errors import InvalidModel, ModelTooLarge

#: Most members a program archive may have (a real one has a few per weight).
MAX_MEMBERS = 100_000
#: A member that inflates more than this (and is larger than ``_RATIO_MIN_BYTES``) is a decompression bomb;
#: torch.export.save stores members uncompressed, so real archives are at 1:1.
MAX_COMPRESSION_RATIO = 100
_RATIO_MIN_BYTES = 1 << 20
#: Set in every process that loads a .pt2 before PyTorch reads it: torch.load's fallbacks stay restricted.
WEIGHTS_ONLY_ENV = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
# Config files that tell torch how to read each weight and constant.
_PAYLOAD_CONFIG_DIRS = ("data/weights/", "data/constants/")
# Constants torch reads as raw tensor bytes; anything else (custom or opaque objects) is unpickled.
_TENSOR_CONSTANT_PREFIX = "tensor_"
# How PyTorch's restricted unpickler names the callable it refused.
_UNSAFE_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def force_weights_only_load() -> None:
    """Make every ``torch.load`` in this process use the restricted unpickler, whatever it is asked."""
    os.environ[WEIGHTS_ONLY_ENV] = "1"


def check_archive(path: Path, max_unpacked_bytes: int) -> None:
    """Refuse an archive that is too large unpacked, has odd member paths, or needs arbitrary unpickling.

    Raises :class:`ModelTooLarge` for size limits and :class:`InvalidModel` for everything else; a damaged
    zip passes through, so that loading it reports what torch finds wrong.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
            _check_directory(infos, path.name, max_unpacked_bytes)
            _check_payload_configs(archive, path.name)
    except zipfile.BadZipFile:
        return


def check_pickled_members(torch: ModuleType, path: Path) -> None:
    """Read every pickled member (``*.pt``: sample inputs, legacy weights) with ``weights_only=True``.

    A member that needs more than tensors and plain containers is refused by name, before torch's own
    loader meets it (which would retry it without the restriction).
    """
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        return
    with archive:
        for info in archive.infolist():
            if not info.filename.endswith((".pt", ".pkl")):
                continue
            data = archive.read(info)
            try:
                torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
            except Exception as err:  # noqa: BLE001 - pickle, torch and zip errors alike
                found = _UNSAFE_GLOBAL.search(str(err))
                refers = f" (it calls {found.group(1)})" if found else ""
                raise InvalidModel(
                    f"'{path.name}': archive member '{_member(info.filename)}' needs unpickling arbitrary "
                    f"Python objects{refers}, which Kiln refuses for safety: only tensors and plain "
                    "containers may be pickled in a program Kiln loads"
                ) from None


def _member(name: str) -> str:
    """A member's name without the archive's top folder (``model/data/x`` -> ``data/x``)."""
    return name.split("/", 1)[1] if "/" in name else name


def _check_directory(infos: list[zipfile.ZipInfo], model_name: str, max_unpacked_bytes: int) -> None:
    if len(infos) > MAX_MEMBERS:
        raise InvalidModel(
            f"'{model_name}' has {len(infos)} archive members; a torch.export program has far fewer "
            f"(at most {MAX_MEMBERS} accepted)"
        )
    total = 0
    for info in infos:
        name = info.filename
        parts = name.split("/")
        if name.startswith("/") or "\\" in name or ".." in parts or (len(name) > 1 and name[1] == ":"):
            raise InvalidModel(f"'{model_name}': archive member {name!r} has a path outside the archive")
        if (info.external_attr >> 16) & 0o170000 == 0o120000:
            raise InvalidModel(f"'{model_name}': archive member {name!r} is a symbolic link")
        total += info.file_size
        if total > max_unpacked_bytes:
            raise ModelTooLarge(
                f"'{model_name}' unpacks to more than {max_unpacked_bytes >> 20} MiB "
                f"(KILN_MAX_UNPACKED_MB); refused before extracting it"
            )
        if info.file_size > _RATIO_MIN_BYTES and info.file_size > MAX_COMPRESSION_RATIO * max(
            info.compress_size, 1
        ):
            raise ModelTooLarge(
                f"'{model_name}': archive member '{_member(name)}' inflates {info.file_size // max(info.compress_size, 1)}"
                f"-fold ({info.compress_size} bytes to {info.file_size}); refused as a decompression bomb"
            )


def _check_payload_configs(archive: zipfile.ZipFile, model_name: str) -> None:
    """Refuse weights and constants that torch would unpickle (``use_pickle``, custom/opaque objects)."""
    for info in archive.infolist():
        name = _member(info.filename)
        if not (name.startswith(_PAYLOAD_CONFIG_DIRS) and name.endswith("_config.json")):
            continue
        try:
            config = json.loads(archive.read(info)).get("config", {})
        except (ValueError, AttributeError, zipfile.BadZipFile, OSError):
            raise InvalidModel(
                f"'{model_name}': archive member '{name}' is not a valid payload config"
            ) from None
        if not isinstance(config, dict):
            raise InvalidModel(f"'{model_name}': archive member '{name}' is not a valid payload config")
        folder = posixpath.dirname(name)
        for fqn, meta in config.items():
            payload = _payload_name(meta)
            pickled = isinstance(meta, dict) and bool(meta.get("use_pickle"))
            foreign = folder == "data/constants" and not payload.startswith(_TENSOR_CONSTANT_PREFIX)
            if pickled or foreign:
                raise InvalidModel(
                    f"'{model_name}': archive member '{folder}/{payload}' ({fqn!r}) is stored as a pickled "
                    "Python object, which Kiln refuses for safety: only plain tensors can be loaded "
                    "(tensor subclasses, custom and opaque objects would run code from the file)"
                )


def _payload_name(meta: Any) -> str:
    return str(meta.get("path_name", "")) if isinstance(meta, dict) else ""


__all__ = ["check_archive", "check_pickled_members", "force_weights_only_load"]
