"""The defaults of torch.compile(backend="kiln")'s options (its options= override them)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class CaptureSettings(BaseModel):
    """The defaults of torch.compile(backend="kiln")'s options (its options= override them)."""

    capture_tune: str = Field(
        default="off",
        pattern=r"^(off|queue|[0-9]+)$",
        description=(
            "What the torch.compile backend does with kernels that have no tuned record: off (report them), "
            "queue (queue a tuning job for the captured graph) or a number of trials to tune in-process"
        ),
    )
    capture_freeze: bool = Field(
        default=False,
        description="torch.compile backend: bind parameters as constants (weights pre-packed; later changes unseen)",
    )
    capture_target: str = Field(
        default="host", description="torch.compile backend: the target ('host' or a target JSON object)"
    )
    capture_poll_s: float = Field(
        default=5.0, gt=0, description="torch.compile backend: how often a graph looks at its queued job"
    )
