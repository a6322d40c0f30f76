"""Model import: ONNX files, ``torch.export`` programs and JAX programs (StableHLO) -> a Relax ``IRModule``
with static shapes.

Every failure a user can cause (a corrupt or truncated file, a wrong format, operators the importer
lacks, a dynamic dimension without a shape, a bad ``--input-shape``) is raised as a typed
:mod:`tuner.errors` error with a message that says what to do; no protobuf, torch or TVM traceback
leaves this package.

TVM is imported lazily (through :mod:`kiln_tvm`, which sets ``TVM_NUM_THREADS`` first), so
:func:`detect_format`, :func:`read_signature` of an ONNX file and :func:`parse_input_shapes` stay cheap.

``formats`` tells the kinds of file apart, ``shapes`` reads and checks input shapes, ``onnx``, ``torch``
and ``stablehlo`` are the importers (``stablehlo_reader`` reads MLIR with jaxlib), and ``imported`` holds
what they share.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.entities import ModelFormat, ModelSignature
from tuner.errors import InvalidSpec, MissingDependency
from tuner.frontend import onnx as onnx_import
from tuner.frontend import stablehlo as stablehlo_import
from tuner.frontend import torch as torch_import
from tuner.frontend.formats import detect_format
from tuner.frontend.imported import ImportedModel, tvm_frontends
from tuner.frontend.input_values import parse_input_values, parse_input_values_json
from tuner.frontend.onnx import MIN_ONNX_OPSET
from tuner.frontend.shapes import UNKNOWN_RANK, check_given_shape, parse_input_shapes
from tuner.frontend.torch import DEFAULT_MAX_UNPACKED_BYTES


def read_signature(path: Path) -> ModelSignature:
    """The model's declared inputs and outputs; dynamic dimensions are kept as their names.

    An ONNX dimension without a name is called ``dim<i>``; a tensor of unknown rank has the shape
    :data:`UNKNOWN_RANK`. A torch.export program names its dynamic dimensions after its symbols (``s0``).
    Reading an ONNX signature does not import TVM; a .pt2 program needs PyTorch.
    """
    path = Path(path)
    fmt = detect_format(path)
    if fmt is ModelFormat.ONNX:
        return onnx_import.model_signature(onnx_import.parse_model(path, path.read_bytes()), path.name)
    if fmt in (ModelFormat.JAX_EXPORT, ModelFormat.STABLEHLO):
        return stablehlo_import.program_signature(stablehlo_import.read_jax_program(path, fmt))
    torch = torch_import.import_torch()
    program = torch_import.load_program(torch, path, DEFAULT_MAX_UNPACKED_BYTES)
    return torch_import.program_signature(program, path.name)


def warm_up() -> None:
    """Load TVM, its importers and Kiln's graph passes now, so that the first model is quick."""
    import tuner.passes.plan  # noqa: F401

    tvm_frontends().onnx_importer()
    try:
        torch_import.import_torch()
    except MissingDependency:
        return
    tvm_frontends().torch_importer()


def load_model(
    path: Path,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    *,
    allow_external_data: bool = True,
    max_unpacked_bytes: int = DEFAULT_MAX_UNPACKED_BYTES,
    input_values: Mapping[str, Any] | None = None,
) -> ImportedModel:
    """Import an ONNX model or a torch.export program into Relax with every input shape static.

    ``input_shapes`` gives shapes for inputs with dynamic dimensions (and may restate static ones).
    ``allow_external_data=False`` (an upload: one file, nothing beside it) refuses ONNX weights kept in
    other files without looking at the file system; ``max_unpacked_bytes`` bounds a .pt2 archive.
    ``input_values`` binds ONNX inputs to values (:mod:`tuner.frontend.input_values`): constants of the
    imported model, no longer its inputs.
    """
    path = Path(path)
    try:
        given = {str(name): tuple(int(d) for d in dims) for name, dims in (input_shapes or {}).items()}
    except (TypeError, ValueError, AttributeError) as err:
        raise InvalidSpec(f"input shapes must map input names to tuples of integers: {err}") from None
    fmt = detect_format(path)
    if fmt is ModelFormat.ONNX:
        return onnx_import.load_onnx(path, given, allow_external_data, input_values)
    if input_values:
        raise InvalidSpec(
            f"input_values binds inputs of ONNX models; '{path.name}' is a {fmt.value} program, whose "
            "export fixes such values itself"
        )
    if fmt in (ModelFormat.JAX_EXPORT, ModelFormat.STABLEHLO):
        return stablehlo_import.load_jax(path, fmt, given)
    return torch_import.load_torch(path, given, max_unpacked_bytes)


__all__ = [
    "DEFAULT_MAX_UNPACKED_BYTES",
    "MIN_ONNX_OPSET",
    "UNKNOWN_RANK",
    "ImportedModel",
    "check_given_shape",
    "detect_format",
    "load_model",
    "parse_input_shapes",
    "parse_input_values",
    "parse_input_values_json",
    "read_signature",
    "warm_up",
]
