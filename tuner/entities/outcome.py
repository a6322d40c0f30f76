"""What a job measured of its artifact: side-by-side latencies and accuracy."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from tuner.entities.quantization import QuantizationReport


@dataclass(frozen=True)
class Timing:
    """One implementation's end-to-end latency over interleaved rounds, each round in a fresh process."""

    rounds_ms: tuple[float, ...]  # each round's median call time, in the order the rounds ran

    @property
    def median_ms(self) -> float:
        return statistics.median(self.rounds_ms)

    @property
    def min_ms(self) -> float:
        return min(self.rounds_ms)

    @property
    def max_ms(self) -> float:
        return max(self.rounds_ms)

    @property
    def spread(self) -> float:
        """(max - min) / median of the rounds: 0 when they agree."""
        return (self.max_ms - self.min_ms) / self.median_ms if self.median_ms > 0 else 0.0


@dataclass(frozen=True)
class LatencyReport:
    """How a job's side-by-side latencies were measured: every implementation's rounds, how much of the
    machine other processes used meanwhile, and the warnings a reader of the figures needs."""

    timings: dict[str, Timing]  # by implementation: "untuned TVM", "Kiln", "onnxruntime", ...
    warnings: tuple[str, ...] = ()
    other_cpu_share: float | None = None  # fraction of all CPUs other processes used while timing
    load_average: float | None = None  # 1-minute load average when timing began

    def to_dict(self) -> dict[str, Any]:
        return {
            "timings": {name: list(t.rounds_ms) for name, t in self.timings.items()},
            "warnings": list(self.warnings),
            "other_cpu_share": self.other_cpu_share,
            "load_average": self.load_average,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatencyReport:
        return cls(
            timings={
                name: Timing(tuple(float(x) for x in rounds)) for name, rounds in data["timings"].items()
            },
            warnings=tuple(data.get("warnings") or ()),
            other_cpu_share=data.get("other_cpu_share"),
            load_average=data.get("load_average"),
        )


@dataclass(frozen=True)
class OutputAccuracy:
    """How one output of a quantized or reduced-precision job's tuned build compares with the reference
    over seeded inputs."""

    name: str
    step: float | None  # one quantization step of the output (its DequantizeLinear scale); None: float
    max_abs: float
    max_steps: float | None  # max_abs in steps (LSB)
    beyond_one_step: float | None  # share of the elements more than one step off
    cosine: float  # cosine similarity of all the elements, flattened
    relative_error: float | None = None  # ||actual - reference|| / ||reference||, all elements flattened
    #: Share of the rows (last axis) whose arg-max equals the float model's (None: no float model given).
    top1_agreement: float | None = None


@dataclass(frozen=True)
class AccuracyReport:
    """A quantized or reduced-precision job's outputs against a reference (onnxruntime on the same model,
    or untuned TVM in float32) over seeded inputs; ``tolerance``: the norm-wise relative error a
    reduced-precision job is held to (None: quantized, held to one step)."""

    reference: str
    inputs: int
    outputs: tuple[OutputAccuracy, ...]
    tolerance: float | None = None
    float_model: str | None = None  # the float model top-1 agreement was counted against (its name)
    #: A float model Kiln quantized (the int8 policy): how, and the accuracy control's outcome.
    quantization: QuantizationReport | None = None
    #: Quantized outputs: the steps allowed from the reference (one per quantized layer in a chain).
    allowed_steps: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "inputs": self.inputs,
            "outputs": [asdict(o) for o in self.outputs],
            "tolerance": self.tolerance,
            "float_model": self.float_model,
            "quantization": self.quantization.to_dict() if self.quantization is not None else None,
            "allowed_steps": self.allowed_steps,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AccuracyReport:
        return cls(
            data["reference"],
            int(data["inputs"]),
            tuple(OutputAccuracy(**o) for o in data["outputs"]),
            data.get("tolerance"),
            data.get("float_model"),
            QuantizationReport.from_dict(data["quantization"]) if data.get("quantization") else None,
            float(data.get("allowed_steps", 1.0)),
        )
