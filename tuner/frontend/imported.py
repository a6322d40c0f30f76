"""What both importers share: the imported model, TVM's importers through the gate, and the checks
and error mapping of the Relax module an importer returns."""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import shutil
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tuner.entities import BoundInput, Dim, ModelFormat, ModelSignature, TensorSpec
from tuner.errors import InvalidModel, KilnError, UnsupportedOperator
from tuner.frontend.shapes import UNKNOWN_RANK

if TYPE_CHECKING:
    from kiln_tvm import tvm

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImportedModel:
    """A model imported into Relax, with every input shape static."""

    mod: tvm.IRModule
    signature: ModelSignature  # concrete input shapes; outputs as the imported ``main`` returns them
    format: ModelFormat
    sha256: str  # of ``canonical_bytes``
    #: The model as one blob (ONNX with external data inlined and inputs bound, or the .pt2 file): its
    #: bytes, or the file that holds them as they are, read when asked for (a model's weights are not
    #: held a second time while it is planned).
    canonical: bytes | Path

    @property
    def canonical_bytes(self) -> bytes:
        """The model's canonical bytes (read from its file when they are kept there)."""
        return self.canonical if isinstance(self.canonical, bytes) else self.canonical.read_bytes()

    def write_canonical(self, dest: Path) -> None:
        """Write the canonical bytes to ``dest`` (a copy of the file when they are kept there)."""
        if isinstance(self.canonical, bytes):
            dest.write_bytes(self.canonical)
        else:
            shutil.copyfile(self.canonical, dest)


def output_names(count: int) -> list[str]:
    """Names of a program's outputs: ``output``, or ``output_0``, ``output_1``... when there are several."""
    return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]


def short_error(err: BaseException, limit: int = 600) -> str:
    """An exception as one short line of text (TVM errors can carry long backtraces)."""
    text = str(err).strip() or type(err).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    text = " ".join(lines[:4])
    return text if len(text) <= limit else text[: limit - 3] + "..."


def tvm_frontends() -> ModuleType:
    """TVM's importers, through the gate (imported on first use: reading a signature needs no TVM)."""
    from kiln_tvm import frontends

    return frontends


def conversion_error(
    err: Exception, importer: str, model_name: str, op: str | None, node_name: str | None
) -> KilnError:
    """Map an exception of a TVM importer to UnsupportedOperator (a form of an operator it lacks) or
    InvalidModel (anything else), keeping TVM's message."""
    detail = short_error(err)
    if op is None:
        return InvalidModel(f"the {importer} importer could not convert '{model_name}': {detail}")
    if isinstance(err, NotImplementedError):  # includes tvm.error.OpNotImplemented
        return UnsupportedOperator(
            operators=[op], importer=importer, reason=f" as node '{node_name}' uses it: {detail}"
        )
    return InvalidModel(
        f"the {importer} importer could not convert node '{node_name}' ({op}) of '{model_name}': {detail}"
    )


@contextlib.contextmanager
def quiet_importer(what: str) -> Iterator[None]:
    """Keep an importer's prints and warnings out of the user's terminal; log them at debug level."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for w in caught:
                log.debug("%s: %s", what, w.message)
            if out.getvalue().strip():
                log.debug("%s printed: %s", what, out.getvalue().strip()[:2000])


def static_int(value: Any) -> int | None:
    from kiln_tvm import tvm

    return int(value.value) if isinstance(value, tvm.tirx.IntImm) else None


def _type_specs(name: str, ty: Any) -> list[TensorSpec]:
    """TensorSpecs of a Relax value's type (a tuple is flattened)."""
    from kiln_tvm import relax

    if isinstance(ty, relax.TensorType):
        shape = ty.shape
        if isinstance(shape, relax.ShapeExpr):
            dims: tuple[Dim, ...] = tuple(
                d if (d := static_int(v)) is not None else str(v) for v in shape.values
            )
        elif ty.ndim >= 0:
            dims = tuple(f"dim{i}" for i in range(ty.ndim))
        else:
            dims = UNKNOWN_RANK
        return [TensorSpec(name=name, shape=dims, dtype=str(ty.dtype))]
    if isinstance(ty, relax.ShapeType):
        return [TensorSpec(name=name, shape=(int(ty.ndim),) if ty.ndim >= 0 else UNKNOWN_RANK, dtype="int64")]
    if isinstance(ty, relax.PrimType):
        return [TensorSpec(name=name, shape=(), dtype=str(ty.dtype))]
    if isinstance(ty, relax.TupleType):
        specs: list[TensorSpec] = []
        for i, field in enumerate(ty.fields):
            specs.extend(_type_specs(f"{name}.{i}", field))
        return specs
    return [TensorSpec(name=name, shape=(), dtype=type(ty).__name__)]


def output_specs(mod: tvm.IRModule, names: list[str]) -> tuple[TensorSpec, ...]:
    """Outputs of ``main`` named after ``names`` (one per top-level result)."""
    from kiln_tvm import relax

    ret = mod["main"].ret_ty
    fields = list(ret.fields) if isinstance(ret, relax.TupleType) and len(names) != 1 else [ret]
    specs: list[TensorSpec] = []
    for i, ty in enumerate(fields):
        specs.extend(_type_specs(names[i] if i < len(names) else f"output_{i}", ty))
    return tuple(specs)


def check_param_count(mod: tvm.IRModule, model_name: str, inputs: tuple[TensorSpec, ...]) -> None:
    params = mod["main"].params
    if len(params) != len(inputs):
        raise InvalidModel(
            f"importing '{model_name}' gave a function of {len(params)} inputs, but the model declares "
            f"{len(inputs)}: {', '.join(s.name for s in inputs)}"
        )


def check_static_params(mod: tvm.IRModule, model_name: str, inputs: tuple[TensorSpec, ...]) -> None:
    from kiln_tvm import relax

    check_param_count(mod, model_name, inputs)
    for param in mod["main"].params:
        ty = param.ty
        if (
            isinstance(ty, relax.TensorType)
            and isinstance(ty.shape, relax.ShapeExpr)
            and all(static_int(v) is not None for v in ty.shape.values)
        ):
            continue
        raise InvalidModel(
            f"importing '{model_name}' left input '{param.name}' without a static shape ({ty}); "
            "give every input's shape with --input-shape"
        )


def imported_model(
    mod: tvm.IRModule,
    model_name: str,
    *,
    declared: ModelSignature,
    shapes: Mapping[str, tuple[int, ...]],
    output_names: list[str],
    fmt: ModelFormat,
    canonical: bytes | Path,
    bound: tuple[BoundInput, ...] = (),
) -> ImportedModel:
    """What an importer returns: ``main``'s inputs checked static and given their concrete ``shapes``,
    its outputs named, the inputs ``bound`` to values, and the model's canonical bytes (or the file that
    holds them as they are) with their hash."""
    check_static_params(mod, model_name, declared.inputs)
    inputs = tuple(
        TensorSpec(name=spec.name, shape=shapes[spec.name], dtype=spec.dtype) for spec in declared.inputs
    )
    return ImportedModel(
        mod=mod,
        signature=ModelSignature(
            inputs=inputs,
            outputs=output_specs(mod, output_names),
            declared_inputs=declared.inputs,
            bound_inputs=bound,
        ),
        format=fmt,
        sha256=_sha256(canonical),
        canonical=canonical,
    )


def _sha256(canonical: bytes | Path) -> str:
    if isinstance(canonical, bytes):
        return hashlib.sha256(canonical).hexdigest()
    with canonical.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
