"""What quantizing a float model did: the accuracy budget it was held to, the metric before and after,
and each operator's precision."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

#: The default budget: at most 1 % of validation samples whose answer (top-1 class) changes on class scores...
DEFAULT_MAX_TOP1_CHANGED = 0.01
#: ... and a norm-wise relative error of at most 5 % on any other output.
DEFAULT_MAX_RELATIVE_ERROR = 0.05


@dataclass(frozen=True)
class AccuracyBudget:
    """How far a quantized model may stray from the float model on the validation samples."""

    #: Share of the validation samples (batch rows) whose top-1 class (over steps: any step's) may change on
    #: class scores (``[batch, classes]``, or a softmax's over the last axis at any rank).
    max_top1_changed: float = DEFAULT_MAX_TOP1_CHANGED
    #: Norm-wise relative error ``||q - f|| / ||f||`` allowed on every other output.
    max_relative_error: float = DEFAULT_MAX_RELATIVE_ERROR

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> AccuracyBudget:
        data = data or {}
        return cls(
            max_top1_changed=float(data.get("max_top1_changed", DEFAULT_MAX_TOP1_CHANGED)),
            max_relative_error=float(data.get("max_relative_error", DEFAULT_MAX_RELATIVE_ERROR)),
        )


@dataclass(frozen=True)
class QuantizationMetric:
    """A quantized model against the float model on the validation samples."""

    #: The largest share, over the class-score outputs, of samples whose answer changed (None: no such output).
    top1_changed: float | None
    #: Per output, the norm-wise relative error.
    relative_error: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        parts = [f"top-1 changed on {self.top1_changed:.1%}"] if self.top1_changed is not None else []
        parts += [f"{name}: relative error {err:.3g}" for name, err in self.relative_error.items()]
        return ", ".join(parts)


@dataclass(frozen=True)
class QuantizationReport:
    """How Kiln quantized a float model: calibration, budget, the metric with every operator in int8
    (``before``) and as compiled (``after``), the operators returned to float, and each one's precision."""

    method: str  # the calibration method: minmax, percentile, entropy
    samples: str  # "8 calibration and 8 validation samples from the user's calibration file"
    synthetic: bool  # the samples are Kiln's seeded synthetic inputs, not the user's
    budget: AccuracyBudget
    before: QuantizationMetric
    after: QuantizationMetric
    within_budget: bool
    returned: tuple[str, ...]  # "Conv_3 (Conv 64x64x3x3)": returned from int8, worst first
    precision: dict[str, str]  # node name -> "int8" | "bf16" | "float32"
    #: The weights' bits: 8, or 7 on CPUs without VNNI (vpmaddubsw is exact on them there).
    weight_bits: int = 8
    #: Whether the cores' outputs stay float (taken when rounding them to 8 bits broke the budget).
    float_outputs: bool = False
    #: What the returned operators are computed in: bf16 (on CPUs that multiply it natively) or float32.
    returned_precision: str = "float32"

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "samples": self.samples,
            "synthetic": self.synthetic,
            "budget": self.budget.to_dict(),
            "before": asdict(self.before),
            "after": asdict(self.after),
            "within_budget": self.within_budget,
            "returned": list(self.returned),
            "precision": dict(self.precision),
            "weight_bits": self.weight_bits,
            "float_outputs": self.float_outputs,
            "returned_precision": self.returned_precision,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QuantizationReport:
        return cls(
            method=data["method"],
            samples=data["samples"],
            synthetic=bool(data["synthetic"]),
            budget=AccuracyBudget.from_dict(data.get("budget")),
            before=QuantizationMetric(**data["before"]),
            after=QuantizationMetric(**data["after"]),
            within_budget=bool(data["within_budget"]),
            returned=tuple(data.get("returned", ())),
            precision=dict(data.get("precision", {})),
            weight_bits=int(data.get("weight_bits", 8)),
            float_outputs=bool(data.get("float_outputs", False)),
            returned_precision=str(data.get("returned_precision", "float32")),
        )
