"""The models Kiln stores: their format and signature."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

Dim = int | str  # a concrete size, or the name of a dynamic dimension


class ModelFormat(str, enum.Enum):
    """File formats Kiln imports."""

    ONNX = "onnx"
    TORCH_EXPORT = "torch-export"
    JAX_EXPORT = "jax-export"  # a serialized jax.export.Exported (.jax)
    STABLEHLO = "stablehlo"  # StableHLO MLIR, text or bytecode (.mlir)


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and dtype of one model input or output."""

    name: str
    shape: tuple[Dim, ...]
    dtype: str

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TensorSpec:
        return cls(name=data["name"], shape=tuple(data["shape"]), dtype=data["dtype"])


@dataclass(frozen=True)
class BoundInput:
    """An input fixed to a value when the model was registered (``input_values``): a constant of the
    stored model, no longer an input of it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    values: Any  # a number, or nested lists (JSON)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "values": self.values}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BoundInput:
        return cls(data["name"], data["dtype"], tuple(data["shape"]), data["values"])


@dataclass(frozen=True)
class ModelSignature:
    """Inputs and outputs of a model, in call order."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # The inputs as the model itself declares them (dynamic dimensions by name), when they differ from
    # ``inputs`` (concrete shapes given at upload): what a job's input shapes are checked against.
    declared_inputs: tuple[TensorSpec, ...] | None = field(default=None, compare=False)
    # Inputs of the model as uploaded that were bound to values at registration (no longer inputs).
    bound_inputs: tuple[BoundInput, ...] = field(default=(), compare=False)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }
        if self.declared_inputs is not None and self.declared_inputs != self.inputs:
            data["declared_inputs"] = [t.to_dict() for t in self.declared_inputs]
        if self.bound_inputs:
            data["bound_inputs"] = [b.to_dict() for b in self.bound_inputs]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSignature:
        declared = data.get("declared_inputs")
        return cls(
            inputs=tuple(TensorSpec.from_dict(t) for t in data["inputs"]),
            outputs=tuple(TensorSpec.from_dict(t) for t in data["outputs"]),
            declared_inputs=tuple(TensorSpec.from_dict(t) for t in declared) if declared else None,
            bound_inputs=tuple(BoundInput.from_dict(b) for b in data.get("bound_inputs") or ()),
        )

    @property
    def model_inputs(self) -> tuple[TensorSpec, ...]:
        """The inputs as the model declares them."""
        return self.declared_inputs or self.inputs


@dataclass(frozen=True)
class ModelInfo:
    """A stored model: its bytes live in the blob directory under ``sha256``."""

    id: str
    name: str
    format: ModelFormat
    sha256: str
    size_bytes: int
    signature: ModelSignature
    created_at: datetime
    owner: str = ""  # the API token name that uploaded it ("" when the service runs without auth)
