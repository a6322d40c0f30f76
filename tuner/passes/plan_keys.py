"""The key a model's task preview is kept under: what the plan depends on (target, shapes, the graph
passes' settings, the limits it was planned within, Kiln's version), so that a job can find the preview
of exactly what it will plan (:func:`preview_refusal`)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import tuner
from tuner.entities import ModelInfo, PlanError
from tuner.errors import ImportTimeout, KilnError, ModelTooLarge, rebuild_error
from tuner.settings import Settings
from tuner.store.sql import Store

#: Bumped when what a stored plan holds changes (2: the tasks' polyhedral analyses; 3: the quantized
#: operators lowered to integers and those kept in float; 4: integer kernels packed for VNNI; 5: the
#: precision policy; 6: the matmuls on AMX tiles; 7: AVX-VNNI's 8-lane packing and the bf16 matmuls on
#: vdpbf16ps; 8: the bf16 convolutions on vdpbf16ps; 9: the limits it was planned within; 10: the graph
#: passes left out, and the models refused before passes failed gracefully), so older plans are planned
#: again rather than served without it.
PLAN_FORMAT = 10

# The errors of a preview that refused a model for a limit: a job of the same plan is refused at submit.
LIMIT_ERRORS = frozenset({ModelTooLarge.kind, ImportTimeout.kind})


def plan_shapes(model: ModelInfo, input_shapes: Any = None) -> dict[str, list[int]]:
    """The input shapes a plan is made for: those given, else the model's static ones."""
    if not input_shapes:
        input_shapes = {t.name: t.shape for t in model.signature.inputs if t.is_static}
    return {str(k): [int(d) for d in v] for k, v in input_shapes.items()}


def plan_key(
    settings: Settings, resolved_target: dict[str, Any], shapes: dict[str, list[int]], precision: str
) -> str:
    """The key of a plan of a model for ``resolved_target`` and ``shapes`` under ``precision``."""
    key_data = {
        "target": resolved_target,
        "shapes": shapes,
        "weight_prepack": settings.weight_prepack,
        "conv_layout": settings.cpu_conv_layout,
        "fast_math": settings.fast_math,
        "precision": precision,
        "memory_mb": settings.import_memory_mb,
        "timeout_s": settings.import_timeout_s,
        "cpu_s": settings.import_cpu_s,
        "kiln": tuner.__version__,
        "plan_format": PLAN_FORMAT,
    }
    return hashlib.sha256(json.dumps(key_data, sort_keys=True).encode()).hexdigest()


def preview_refusal(
    store: Store,
    settings: Settings,
    model: ModelInfo,
    resolved_target: dict[str, Any],
    *,
    input_shapes: Any,
    precision: str,
) -> KilnError | None:
    """The limit error a kept preview of this plan was refused with (its job would meet it too), or None.
    A job under ``auto`` or ``int8`` imports the model as ``as-is`` does before anything else, so a
    preview of the model as it is refused for a limit refuses it too (the dashboard previews as-is)."""
    shapes = plan_shapes(model, input_shapes)
    policies = [precision, *(["as-is"] if precision in ("auto", "int8") else [])]
    for policy in policies:
        stored = store.get_model_plan(model.id, plan_key(settings, resolved_target, shapes, policy))
        if isinstance(stored, PlanError) and stored.kind in LIMIT_ERRORS:
            return rebuild_error(stored.kind, f"its task preview was refused: {stored.message}")
    return None


__all__ = ["LIMIT_ERRORS", "PLAN_FORMAT", "plan_key", "plan_shapes", "preview_refusal"]
