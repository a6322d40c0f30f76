"""The checks of a job spec that need neither its model nor TVM: a command refuses a bad spec with them
before it loads anything heavy."""

from __future__ import annotations

from tuner.entities import Budget, JobSpec
from tuner.entities.job import check_cost_model, check_precision, check_quantization_fields
from tuner.rpc.address import validate_runner


def check_spec_fields(spec: JobSpec) -> None:
    """The checks of a job spec that need neither its model nor TVM: the budget, the cost model, the
    precision, the quantization's fields and the runner's address."""
    Budget(spec.trials, spec.max_trials_per_task, spec.seed, spec.time_budget_s)
    check_cost_model(spec.cost_model)
    check_precision(spec.precision)
    check_quantization_fields(spec.calibration_method, spec.accuracy_budget)
    validate_runner(spec.runner)
