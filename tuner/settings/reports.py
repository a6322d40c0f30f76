"""What a finished job checks and times: verification tolerances, side-by-side latency, profiles."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ReportSettings(BaseModel):
    """What a finished job checks and times: verification tolerances, side-by-side latency, profiles."""

    latency_rounds: int = Field(
        default=3, ge=1, le=20, description="Interleaved rounds of the end-to-end side-by-side timing"
    )
    profile_budget_s: float = Field(
        default=2.0,
        ge=0,
        le=60,
        description="Seconds of profiled runs of the tuned model (and of onnxruntime) per job; 0: no profile",
    )
    verify_rtol: float = Field(default=1e-3, gt=0, description="Relative tolerance of artifact checks")
    verify_atol: float = Field(default=1e-4, gt=0, description="Absolute tolerance of artifact checks")
