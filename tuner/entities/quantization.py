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


#: Within this share, an int8 kernel is no faster than the other precision's: timings of one kernel in one
#: process vary by a few percent, and the other precision (bf16, float32) is the more accurate.
INT8_MARGIN = 0.05


@dataclass(frozen=True)
class CoreSpeed:
    """One quantized operator's kernel timed on the job's CPU in int8 and in the precision it would return
    to (``other``: bf16 or float32), each built with the schedules Kiln chooses without measuring."""

    name: str  # the operator's node name
    int8_ms: float
    other: str
    other_ms: float

    @property
    def chosen(self) -> str:
        """int8 where it is faster by more than :data:`INT8_MARGIN`, else the other, more accurate one."""
        return "int8" if self.int8_ms < (1 - INT8_MARGIN) * self.other_ms else self.other

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "chosen": self.chosen}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CoreSpeed:
        return cls(str(data["name"]), float(data["int8_ms"]), str(data["other"]), float(data["other_ms"]))


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
    returned: tuple[str, ...]  # "Conv_3 (Conv 64x64x3x3)": returned from int8 for the budget, worst first
    precision: dict[str, str]  # node name -> "int8" | "bf16" | "float32"
    #: The weights' bits: 8, or 7 on CPUs without VNNI (vpmaddubsw is exact on them there).
    weight_bits: int = 8
    #: Whether the cores' outputs stay float (taken when rounding them to 8 bits broke the budget).
    float_outputs: bool = False
    #: What the returned operators are computed in: bf16 (on CPUs that multiply it natively) or float32.
    returned_precision: str = "float32"
    #: Each int8 operator's kernel timed in int8 and in ``returned_precision`` on the job's CPU...
    speeds: tuple[CoreSpeed, ...] = ()
    #: ... the operators returned because they were not faster in int8 (within the budget still)...
    returned_for_speed: tuple[str, ...] = ()
    #: ... and what that measurement did or why it did not run ("" when it ran).
    speed_note: str = ""

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
            "speeds": [speed.to_dict() for speed in self.speeds],
            "returned_for_speed": list(self.returned_for_speed),
            "speed_note": self.speed_note,
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
            speeds=tuple(CoreSpeed.from_dict(d) for d in data.get("speeds", ())),
            returned_for_speed=tuple(data.get("returned_for_speed", ())),
            speed_note=str(data.get("speed_note", "")),
        )
