"""TVM's model importers, and the parts of them Kiln reads that TVM does not publish.

Kiln checks a model's operators against the importers' conversion tables before converting it (so that
every unsupported operator is named at once), and names the graph node a conversion failed on. Neither
has a public API in TVM 0.27: the tables are ``onnx_frontend._get_convert_map()`` and
``ExportedProgramImporter().convert_map``, and the failing node is a local variable ``node`` of the
importers' per-node loops. Those names live here only, so that a TVM change is a change in this file.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType, TracebackType
from typing import Any

import kiln_tvm  # noqa: F401 - sets TVM_NUM_THREADS before TVM loads

# The functions of TVM's importers whose frames hold the node being converted, per importer.
_ONNX_NODE_LOOPS = ("_construct_nodes", "_convert_subgraph")
_TORCH_NODE_LOOPS = ("_translate_fx_graph",)


def onnx_importer() -> ModuleType:
    """``tvm.relax.frontend.onnx`` (``from_onnx``), with Kiln's converters in its table
    (:mod:`kiln_tvm.onnx_converters`)."""
    from kiln_tvm import onnx_converters

    onnx_converters.install()  # once: later calls find the table wrapped
    return importlib.import_module("tvm.relax.frontend.onnx")


def torch_importer() -> ModuleType:
    """``tvm.relax.frontend.torch`` (``from_exported_program``); needs PyTorch."""
    return importlib.import_module("tvm.relax.frontend.torch")


def onnx_convert_map() -> dict[str, Any]:
    """ONNX operator type -> TVM's converter."""
    return dict(onnx_importer().onnx_frontend._get_convert_map())


def onnx_training_operators() -> frozenset[str]:
    """ONNX's training operators (optimizers, losses, gradients): refused by name, not converted."""
    from kiln_tvm.onnx_converters import TRAINING_OPERATORS

    return TRAINING_OPERATORS


def torch_convert_map() -> Mapping[str, Any]:
    """ATen target ``__name__`` -> TVM's converter (the importer looks targets up by that name)."""
    return torch_importer().exported_program_translator.ExportedProgramImporter().convert_map


def failed_onnx_node(tb: TracebackType | None) -> Any:
    """The ONNX node the ONNX importer was converting when it raised, or None."""
    return _failed_node(tb, _ONNX_NODE_LOOPS)


def failed_torch_node(tb: TracebackType | None) -> Any:
    """The FX node the torch.export importer was converting when it raised, or None."""
    return _failed_node(tb, _TORCH_NODE_LOOPS)


def _failed_node(tb: TracebackType | None, frame_names: tuple[str, ...]) -> Any:
    """The graph node an importer was converting when it raised (innermost), read from the traceback.

    Reading it from the traceback avoids patching the importer. ``None`` when the failure was not
    inside a per-node loop.
    """
    found = None
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name in frame_names and "node" in frame.f_locals:
            found = frame.f_locals["node"]
        tb = tb.tb_next
    return found


__all__ = [
    "failed_onnx_node",
    "failed_torch_node",
    "onnx_convert_map",
    "onnx_importer",
    "onnx_training_operators",
    "torch_convert_map",
    "torch_importer",
]
