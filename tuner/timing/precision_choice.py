"""The ``auto`` precision decided: bf16 on a CPU that multiplies it natively, unless bf16 would take the
model's outputs beyond the bf16 tolerance, in which case the model is planned as it is.

The graph passes choose by the CPU (:func:`tuner.passes.precision.auto_precision`); this module adds the
check that needs the model run, so that a job and a preview of its plan choose alike. An untuned build
decides: the operands' rounding, not the schedule, sets the error (a tuned schedule changes only the order
of the fp32 sums), and the inputs are seeded with :data:`CHOICE_SEED` whatever the job's seed, so that the
choice is the model's and the target's alone.
"""

from __future__ import annotations

import dataclasses
import logging

from kiln_tvm import Target
from tuner.compile import build_untuned
from tuner.entities import PlanningOptions
from tuner.frontend import ImportedModel
from tuner.passes.plan import GraphPlan, plan_graph
from tuner.timing.verify import reduced_precision_report

log = logging.getLogger(__name__)

#: The seed of the inputs the choice is checked on, and how many: the untuned bf16 build runs each (ResNet-18:
#: 1.9 s a run on Zen 4), and the tuned artifact's accuracy report, over all eight, judges the job anyway.
CHOICE_SEED = 0
CHOICE_INPUTS = 2


def plan_for_precision(
    imported: ImportedModel,
    target: Target,
    options: PlanningOptions,
    *,
    runs_here: bool,
    record_levels: bool = False,
) -> GraphPlan:
    """:func:`~tuner.passes.plan.plan_graph` of ``imported`` under ``options``; under ``auto`` on a CPU with
    bf16 instructions that ``runs_here`` (this machine can check it), the model is run on bf16 operands and
    planned ``as-is`` instead when an output's norm-wise error is beyond the bf16 tolerance, the plan's
    ``fusion.precision_choice`` saying so. Elsewhere the choice rests on the CPU alone."""
    plan = plan_graph(imported.mod, target, options, record_levels=record_levels)
    if not (plan.fusion.precision_choice and plan.fusion.reduced_ops and runs_here):
        return plan
    report = reduced_precision_report(
        imported,
        build_untuned(plan.prepared, target),
        lambda: build_untuned(imported.mod, target),
        seed=CHOICE_SEED,
        policy=plan.fusion.precision,
        inputs=CHOICE_INPUTS,
    )
    tolerance = report.tolerance or 0.0
    beyond = [o for o in report.outputs if o.relative_error is not None and o.relative_error > tolerance]
    if not beyond:
        return plan
    worst = max(beyond, key=lambda o: o.relative_error or 0.0)
    log.info(
        "auto precision: bf16 beyond its tolerance (%s: %.3g); planned as-is",
        worst.name,
        worst.relative_error,
    )
    as_is = plan_graph(
        imported.mod, target, dataclasses.replace(options, precision="as-is"), record_levels=record_levels
    )
    choice = (
        f"auto: as-is, since bf16 took output {worst.name} a relative {worst.relative_error:.3g} from "
        f"{report.reference}, beyond the bf16 tolerance of {tolerance:.3g}"
    )
    return dataclasses.replace(as_is, fusion=dataclasses.replace(as_is.fusion, precision_choice=choice))
