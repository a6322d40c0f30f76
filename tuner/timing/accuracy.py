"""How close a quantized or reduced-precision model's tuned build computes to its reference: per output,
the largest difference (in quantization steps, LSB, for a quantized output), the share of elements more
than one step off, the norm-wise relative error and the cosine similarity.

Two correct integer computations may round a tie differently (a fused and an unfused path; the reference's
float sums against Kiln's exact integer ones; a fused multiply-add or not in the requantization), so one
step is allowed at each requantization. A model of ``L`` quantized layers in a chain carries such a step
through the layers after it (ResNet-18 in int8: up to 2 steps at its output against onnxruntime's own
reference run, 0 in a third of the inputs), so ``L`` steps are allowed there, which still fails a wrong
kernel (off by its output's range: hundreds of steps); more fails the job, loudly, as a float job's
mismatch does. A reduced-precision job (bf16,
fp16: :mod:`tuner.passes.precision`) is held to its policy's norm-wise relative error instead.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tuner.entities import AccuracyReport, OutputAccuracy
from tuner.errors import VerificationFailed

#: How many seeded inputs the report runs (the verification itself runs one).
ACCURACY_INPUTS = 8
#: The largest difference allowed, in steps (and a hair for float rounding of the comparison).
ALLOWED_STEPS = 1.001


def accuracy_report(
    actual: list[list[np.ndarray]],
    expected: list[list[np.ndarray]],
    names: list[str],
    steps: list[float | None],
    *,
    reference: str,
    tolerance: float | None = None,
    chained_layers: int = 1,
) -> AccuracyReport:
    """The report of ``actual`` against ``expected`` (per input, the list of outputs) for outputs ``names``
    whose quantization steps are ``steps`` (None: a float output, reported without steps); ``tolerance``
    is the norm-wise relative error a reduced-precision job is held to; ``chained_layers``, the quantized
    layers a step may be carried through (a step allowed for each)."""
    outputs = []
    for index, (name, step) in enumerate(zip(names, steps, strict=True)):
        a = np.concatenate([run[index].astype(np.float64).ravel() for run in actual])
        e = np.concatenate([run[index].astype(np.float64).ravel() for run in expected])
        diff = np.abs(a - e)
        norm = float(np.linalg.norm(a) * np.linalg.norm(e))
        e_norm = float(np.linalg.norm(e))
        outputs.append(
            OutputAccuracy(
                name=name,
                step=step,
                max_abs=float(diff.max(initial=0.0)),
                max_steps=float(diff.max(initial=0.0) / step) if step else None,
                beyond_one_step=float(np.mean(diff > ALLOWED_STEPS * step)) if step and diff.size else None,
                cosine=float(a @ e / norm) if norm else (1.0 if not np.any(diff) else 0.0),
                relative_error=float(np.linalg.norm(diff) / e_norm) if e_norm else float(np.any(diff)),
            )
        )
    allowed = float(max(1, chained_layers))
    return AccuracyReport(reference, len(actual), tuple(outputs), tolerance, allowed_steps=allowed)


def top1_agreement(actual: list[np.ndarray], floats: list[np.ndarray]) -> float | None:
    """Share of the rows (every index but the last axis, over all inputs) whose arg-max over the last axis
    is the same in ``actual`` and ``floats``; None for outputs without a class axis (scalars, one class)."""
    if not actual or actual[0].ndim == 0 or actual[0].shape[-1] < 2:
        return None
    a = np.concatenate([x.reshape(-1, x.shape[-1]) for x in actual])
    f = np.concatenate([x.reshape(-1, x.shape[-1]) for x in floats])
    return float(np.mean(a.argmax(axis=-1) == f.argmax(axis=-1)))


def with_top1(
    report: AccuracyReport, actual: list[list[np.ndarray]], floats: list[list[np.ndarray]], name: str
) -> AccuracyReport:
    """``report`` with each output's top-1 agreement against the float model ``name``'s outputs ``floats``
    (per input, the list of outputs, as ``actual``)."""
    outputs = tuple(
        dataclasses.replace(
            o, top1_agreement=top1_agreement([run[i] for run in actual], [run[i] for run in floats])
        )
        for i, o in enumerate(report.outputs)
    )
    return dataclasses.replace(report, outputs=outputs, float_model=name)


def require_accuracy(report: AccuracyReport) -> None:
    """:class:`VerificationFailed` naming each output more than the report's allowed steps from the
    reference, or beyond its norm-wise relative tolerance (reduced precision)."""
    if report.tolerance is not None:
        tol = report.tolerance
        worse = [o for o in report.outputs if o.relative_error is not None and o.relative_error > tol]
        if worse:
            detail = "; ".join(f"{o.name}: relative error {o.relative_error:.3g}" for o in worse)
            raise VerificationFailed(
                f"the reduced-precision model's outputs differ from {report.reference} beyond the norm-wise "
                f"relative error {tol:.3g} over {report.inputs} seeded inputs ({detail})"
            )
    allowed = ALLOWED_STEPS * report.allowed_steps
    bad = [o for o in report.outputs if o.max_steps is not None and o.max_steps > allowed]
    if bad:
        detail = "; ".join(
            f"{o.name}: up to {o.max_steps:.1f} steps off, {o.beyond_one_step:.2%} of its elements beyond one"
            for o in bad
        )
        raise VerificationFailed(
            f"the quantized model's outputs differ from {report.reference} by more than "
            f"{report.allowed_steps:g} quantization step(s) (one per quantized layer in a chain) over "
            f"{report.inputs} seeded inputs ({detail})"
        )
