"""Checking a job's spec and queueing it (:func:`submit_job`): the same checks for the API, the CLI and the
worker that runs it. The checks that need TVM (the target's) are :mod:`tuner.jobs.target_check`'s; this
module loads without TVM, so a command that has its target checked already queues a job in a second."""

from __future__ import annotations

from tuner.entities import Job, JobSpec, ModelInfo
from tuner.errors import InvalidSpec, MissingInputShape
from tuner.frontend import check_given_shape
from tuner.jobs.known_targets import CheckedTarget
from tuner.jobs.spec_fields import check_spec_fields
from tuner.passes.plan_keys import preview_refusal
from tuner.quantization.calibration_files import check_int8_model, job_calibration, job_inputs
from tuner.settings import Settings
from tuner.store.sql import Store


def submit_job(
    store: Store,
    spec: JobSpec,
    owner: str = "",
    settings: Settings | None = None,
    checked: CheckedTarget | None = None,
) -> Job:
    """Validate a spec (its fields, its target, and its input shapes against the model of ``owner``) and
    queue a job for it.

    ``checked`` is the spec's target as :func:`~tuner.jobs.target_check.check_target` found it (kept by
    :class:`~tuner.jobs.known_targets.KnownTargets`); without it the target is checked here, loading TVM.
    With ``settings``, a job whose task preview (the same plan) was refused for a limit is refused too,
    with the preview's reason: it would spend its limits to fail the same way.
    """
    model = store.get_model(spec.model_id, owner)
    if checked is None:
        # Imported here: only a caller without a checked target pays for loading TVM.
        from tuner.jobs.target_check import check_target

        checked = check_target(spec)
    else:
        check_spec_fields(spec)
    target = checked.target
    _check_input_shapes(model, spec)
    if settings is not None:
        refusal = preview_refusal(
            store, settings, model, target, input_shapes=spec.input_shapes, precision=spec.precision
        )
        if refusal is not None:
            raise refusal
    if spec.float_model_id is not None:
        _check_float_model(model, store.get_model(spec.float_model_id, owner))
    _check_quantization(model, spec, settings)
    # The job records the space that tunes it, the target's default when the user named none.
    spec = JobSpec.from_dict({**spec.to_dict(), "target": target, "space": checked.space})
    return store.create_job(spec, checked.key, owner)


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


def _check_quantization(model: ModelInfo, spec: JobSpec, settings: Settings | None) -> None:
    """The int8 policy needs an ONNX model; a calibration file serves int8 and auto (which it makes int8)
    alone, and must hold samples of the model's inputs at the job's shapes (checked where the files are:
    with ``settings``)."""
    if spec.precision == "int8":
        check_int8_model(model)
    if spec.calibration_id is None:
        return
    if spec.precision not in ("int8", "auto"):
        raise InvalidSpec(
            f"a calibration file serves precision int8 or auto (quantizing the float model); this job asks "
            f"for precision {spec.precision}"
        )
    check_int8_model(model)
    if settings is not None:
        job_calibration(settings, spec.calibration_id, job_inputs(model, job_input_shapes(model, spec)))


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
