"""How a model's graph is rewritten before its kernels are tuned (CPU targets)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from tuner.entities.plan import PlanningOptions


class PlanningSettings(BaseModel):
    """How a model's graph is rewritten before its kernels are tuned (CPU targets)."""

    weight_prepack: bool = Field(
        default=True, description="CPU: let tuned kernels choose the weights' layout"
    )
    cpu_conv_layout: Literal["NHWC", "NCHW"] = Field(
        default="NHWC", description="CPU: layout convolutions are converted to before tuning"
    )
    fast_math: bool = Field(
        default=True,
        description="CPU: exp, erf, tanh and softmax use TVM's vectorisable approximations",
    )
    core_timing_budget_s: float = Field(
        default=120.0,
        ge=0,
        le=3600,
        description="precision auto with calibration inputs: seconds spent timing each int8 operator alone "
        "against its bf16/float32 form before tuning (operators no faster in int8 return); 0: not timed",
    )

    def planning_options(self, precision: str = "as-is") -> PlanningOptions:
        """These settings as the graph passes take them, for a job under the ``precision`` policy (``int8``
        plans the model as it is: the model arrives quantized, :mod:`tuner.jobs.quantizing`)."""
        graph_precision = "as-is" if precision == "int8" else precision
        return PlanningOptions(self.weight_prepack, self.cpu_conv_layout, self.fast_math, graph_precision)
