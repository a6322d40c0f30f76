"""Checking a job's spec and queueing it (:func:`submit_job`): the same checks for the API, the CLI and the
worker that runs it (:func:`validate_spec`)."""

from __future__ import annotations

from typing import Any

from schedules.spaces import check_space, default_space_name
from tuner.entities import Job, JobSpec, ModelInfo
from tuner.entities.job import check_cost_model, check_precision
from tuner.errors import InvalidSpec, MissingInputShape
from tuner.frontend import check_given_shape
from tuner.passes.plan_keys import preview_refusal
from tuner.rpc.tracker import validate_runner
from tuner.settings import Settings
from tuner.store.sql import Store
from tuner.targets import canonical_target_key, check_runs_here, resolve_target, to_tvm_target
from tuner.tune import Budget


def validate_spec(spec: JobSpec) -> dict[str, Any]:
    """The checks of a job spec that need no model: the target (and that the local runner can run it
    here), the budget, the cost model, the precision, the space and the runner. Returns the resolved
    target."""
    target = resolve_target(spec.target)
    Budget(spec.trials, spec.max_trials_per_task, spec.seed, spec.time_budget_s)
    check_cost_model(spec.cost_model)
    check_precision(spec.precision)
    if spec.space is not None:
        try:
            check_space(spec.space, str(target.get("kind")))
        except ValueError as exc:
            raise InvalidSpec(str(exc)) from None
    validate_runner(spec.runner)
    if spec.runner.is_local:
        check_runs_here(target)
    return target


def submit_job(store: Store, spec: JobSpec, owner: str = "", settings: Settings | None = None) -> Job:
    """Validate a spec (:func:`validate_spec`, and its input shapes against the model of ``owner``) and
    queue a job for it.

    With ``settings``, a job whose task preview (the same plan) was refused for a limit is refused too,
    with the preview's reason: it would spend its limits to fail the same way.
    """
    model = store.get_model(spec.model_id, owner)
    target = validate_spec(spec)
    _check_input_shapes(model, spec)
    if settings is not None:
        refusal = preview_refusal(
            store, settings, model, target, input_shapes=spec.input_shapes, precision=spec.precision
        )
        if refusal is not None:
            raise refusal
    if spec.float_model_id is not None:
        _check_float_model(model, store.get_model(spec.float_model_id, owner))
    # The job records the space that tunes it, the target's default when the user named none.
    space = spec.space or default_space_name(to_tvm_target(target))
    spec = JobSpec.from_dict({**spec.to_dict(), "target": target, "space": space})
    return store.create_job(spec, canonical_target_key(target), owner)


def _check_input_shapes(model: ModelInfo, spec: JobSpec) -> None:
    names = [t.name for t in model.signature.inputs]
    unknown = sorted(set(spec.input_shapes) - set(names))
    if unknown:
        raise InvalidSpec(f"input_shapes names unknown inputs {unknown}; the model's inputs are {names}")
    for t in model.signature.inputs:
        if not t.is_static and t.name not in spec.input_shapes:
            example = [d if isinstance(d, int) else 1 for d in t.shape]
            raise MissingInputShape(
                f"input '{t.name}' has dynamic dimensions {list(t.shape)}: give its shape in input_shapes, "
                f'e.g. {{"{t.name}": {example}}}'
            )
    declared = {t.name: t for t in model.signature.model_inputs}
    for name, shape in spec.input_shapes.items():
        if any(type(d) is not int for d in shape):
            raise InvalidSpec(f"input_shapes['{name}'] must be integers, got {list(shape)}")
        check_given_shape(declared[name], tuple(shape))


def _check_float_model(model: ModelInfo, float_model: ModelInfo) -> None:
    """The float model a job compares with must take the same inputs and give as many outputs."""
    if float_model.id == model.id:
        raise InvalidSpec("float_model_id names the model being tuned; give the float model it came from")
    mine = [(t.name, t.shape) for t in model.signature.inputs]
    theirs = [(t.name, t.shape) for t in float_model.signature.inputs]
    if mine != theirs or len(model.signature.outputs) != len(float_model.signature.outputs):
        raise InvalidSpec(
            f"the float model '{float_model.name}' takes inputs {theirs} and gives "
            f"{len(float_model.signature.outputs)} outputs; the model tuned takes {mine} and gives "
            f"{len(model.signature.outputs)}"
        )


def job_input_shapes(model: ModelInfo, spec: JobSpec) -> dict[str, tuple[int, ...]]:
    """The input shapes a job plans its model for: those it gives, else the model's static ones."""
    if spec.input_shapes:
        return dict(spec.input_shapes)
    return {t.name: tuple(int(d) for d in t.shape) for t in model.signature.inputs if t.is_static}
