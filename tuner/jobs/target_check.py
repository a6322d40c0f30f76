"""The checks of a job spec that need TVM: its target resolved, checked to run here when the local runner
measures it, and its schedule space checked against the target's kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schedules.spaces import check_space, default_space_name
from tuner.entities import DEFAULT_TRIALS, JobSpec
from tuner.errors import InvalidSpec
from tuner.jobs.known_targets import CheckedTarget, KnownTargets
from tuner.jobs.spec_fields import check_spec_fields
from tuner.targets import canonical_target_key, check_runs_here, resolve_target, to_tvm_target


def validate_spec(spec: JobSpec) -> dict[str, Any]:
    """The checks of a job spec that need no model: its fields (:func:`check_spec_fields`), the target
    (and that the local runner can run it here) and the space. Returns the resolved target."""
    check_spec_fields(spec)
    target = resolve_target(spec.target)
    if spec.space is not None:
        try:
            check_space(spec.space, str(target.get("kind")))
        except ValueError as exc:
            raise InvalidSpec(str(exc)) from None
    if spec.runner.is_local:
        check_runs_here(target)
    return target


def check_target(spec: JobSpec) -> CheckedTarget:
    """:func:`validate_spec`, and what a job on the target needs besides: its record key and the space that
    tunes it (the spec's, else the target's default)."""
    target = validate_spec(spec)
    space = spec.space or default_space_name(to_tvm_target(target))
    return CheckedTarget(target=target, key=canonical_target_key(target), space=space)


def keep_host_target(data_dir: Path) -> CheckedTarget:
    """Check this machine's own target (``host``, what a spec that names none asks for) and keep it in
    ``data_dir``'s :class:`KnownTargets`: a server or worker, which loads TVM anyway, does it at start, so
    the first ``kiln submit`` beside it queues without loading TVM."""
    spec = JobSpec(model_id="", target="host", trials=DEFAULT_TRIALS)  # type: ignore[arg-type]
    checked = check_target(spec)
    KnownTargets(data_dir).put(spec, checked)
    return checked


__all__ = ["check_target", "keep_host_target", "validate_spec"]
