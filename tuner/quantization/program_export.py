"""A ``torch.export`` program (``.pt2``) as the float ONNX model the quantizer takes: PyTorch's own ONNX
exporter (``torch.onnx.export(..., dynamo=True)``, onnxscript underneath) translates the saved
``ExportedProgram`` operator by operator and folds its batch norms, so the program is quantized by the
same onnxruntime quantizer, accuracy control and integer lowering as an ONNX model.

JAX programs are not exported: the converter on the registry (``jax2onnx``) traces Python functions,
and a serialized ``jax.export`` artifact keeps no function to trace.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator
from pathlib import Path

from tuner.errors import InvalidSpec

#: The ONNX opset the program is exported at (the quantizer converts anything older to 13 itself).
EXPORT_OPSET = 18


def onnx_from_program(program: Path, out: Path, *, input_names: tuple[str, ...]) -> Path:
    """``program`` (a saved ``ExportedProgram``) exported to the ONNX model ``out``, whose inputs must be
    ``input_names`` (the program's user inputs, which a calibration file's arrays are named after)."""
    import onnx
    import torch

    try:
        import onnxscript  # noqa: F401  (torch's exporter needs it; imported here for a clear error)
    except ImportError:
        raise InvalidSpec(
            "precision int8 on a torch.export program exports it to ONNX first, which needs onnxscript: "
            "install Kiln's torch extra (pip install 'kiln-autotune[torch]')"
        ) from None
    exported = torch.export.load(str(program))
    try:
        with _quiet():
            onnx_program = torch.onnx.export(exported, (), dynamo=True, opset_version=EXPORT_OPSET)
    except Exception as exc:  # the exporter's errors are many and untyped: the job says which it was
        raise InvalidSpec(
            f"precision int8 could not export '{program.name}' to ONNX for quantizing "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); tune it with "
            "precision as-is or bf16"
        ) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx_program.save(str(out))
    got = tuple(i.name for i in onnx.load(str(out), load_external_data=False).graph.input)
    if got != input_names:
        raise InvalidSpec(
            f"the ONNX export of '{program.name}' takes inputs {list(got)}, not the program's "
            f"{list(input_names)}; tune it with precision as-is or bf16"
        )
    return out


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """torch's exporter logs a warning per missing torchvision operator and prints its progress."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)
