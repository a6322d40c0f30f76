"""Each int8 operator of a quantized model timed alone on this CPU, in int8 and in the precision it would
return to (bf16 or float32), so that ``auto`` keeps int8 only where it is faster.

A convolution or matmul is cut out of each model with its own inputs and constants (``onnx.utils``'s
extractor): from the QDQ model, the 8-bit tensor its activation is dequantized from, through its integer
lowering, to its output; from the float model, the same operator on float inputs (with its operands
rounded to bf16 for a bf16 return, :mod:`tuner.quantization.bf16_operands`). Both are planned as a job
plans them and built with the schedules Kiln chooses without measuring (:func:`~tuner.schedule_choice.
choose_schedules`), then timed in turns, twice each, the best median of each kept (:mod:`tuner.timing.calls`).
Untuned kernels stand for tuned ones here: the measurement ranks two precisions of one operator, each
with the same kind of schedule, before any tuning is spent on either. Operators of the same shape are
timed once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
from onnx import shape_inference
from onnx.utils import Extractor

from kiln_tvm import Target
from schedules.poly.caches import CacheHierarchy
from tuner.compile import LoadedModel, build_tuned, random_inputs
from tuner.entities import CoreSpeed, PlanningOptions
from tuner.frontend import load_model
from tuner.passes.plan import plan_graph
from tuner.quantization.bf16_operands import with_bf16_operands
from tuner.schedule_choice import choose_schedules
from tuner.timing.calls import median_call_ms

log = logging.getLogger(__name__)

#: Seconds each precision of an operator is timed per turn (two turns each).
CALL_BUDGET_S = 0.25


@dataclass(frozen=True)
class CoreBuild:
    """How the cut-out operators are built: the target (this CPU), the job's planning options and caches."""

    target: Target
    options: PlanningOptions
    caches: CacheHierarchy


def time_cores(
    qdq_path: Path,
    float_path: Path,
    names: Sequence[str],
    other: str,
    build: CoreBuild,
    *,
    workdir: Path,
    budget_s: float,
) -> tuple[list[CoreSpeed], str]:
    """The int8 operators ``names`` of the QDQ model ``qdq_path`` timed in int8 and in ``other`` (bf16 or
    float32; the float model ``float_path``), within about ``budget_s`` seconds; and a note on what was
    not timed and why ("" when all were)."""
    workdir.mkdir(parents=True, exist_ok=True)
    quantized, floats = workdir / "qdq_shapes.onnx", workdir / "float_shapes.onnx"
    shape_inference.infer_shapes_path(str(qdq_path), str(quantized))
    shape_inference.infer_shapes_path(str(float_path), str(floats))
    try:
        for path in (quantized, floats):
            onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as exc:  # no operator can be cut out of it: all stay int8, untimed
        log.warning("timing operators alone: %s", exc)
        return (
            [],
            f"not timed, kept in int8: the model does not pass onnx's checker ({str(exc).splitlines()[0][:120]})",
        )
    qdq, float_model = onnx.load(str(quantized)), onnx.load(str(floats))
    # Each model read and indexed once, whatever the number of operators cut out of it.
    qdq_cutter, float_cutter = Extractor(qdq), Extractor(float_model)
    producers = {out: node for node in qdq.graph.node for out in node.output}
    float_nodes = {node.name: node for node in float_model.graph.node}
    shapes = _shapes(float_model)
    timed: dict[tuple[object, ...], tuple[float, float]] = {}
    speeds: list[CoreSpeed] = []
    skipped: list[str] = []
    deadline = time.monotonic() + budget_s
    for node in qdq.graph.node:
        if node.name not in names:
            continue
        dequantize = producers.get(node.input[0])
        source = float_nodes.get(node.name)
        if dequantize is None or dequantize.op_type != "DequantizeLinear" or source is None:
            skipped.append(f"{node.name} (its activation is not dequantized from 8 bits)")
            continue
        key = _signature(source, shapes)
        if key not in timed:
            if time.monotonic() > deadline:
                skipped.append(f"{node.name} (past the {budget_s:.0f} s budget)")
                continue
            try:
                int8_model = _cut(qdq_cutter, [dequantize.input[0]], [node.output[0]])
                other_model = _cut(float_cutter, [source.input[0]], [source.output[0]])
                if other == "bf16":
                    other_model = with_bf16_operands(other_model, {node.name})
                int8_path, other_path = workdir / "core_int8.onnx", workdir / "core_other.onnx"
                onnx.save(int8_model, int8_path)
                onnx.save(other_model, other_path)
                timed[key] = _time_pair(int8_path, other_path, build)
            except Exception as exc:  # one operator that cannot be cut out or built stays int8, untimed
                log.warning("timing %s alone failed: %s", node.name, exc)
                skipped.append(f"{node.name} (could not be timed alone: {str(exc).splitlines()[0][:120]})")
                continue
        int8_ms, other_ms = timed[key]
        speeds.append(CoreSpeed(node.name, int8_ms, other, other_ms))
    note = f"not timed, kept in int8: {'; '.join(skipped)}" if skipped else ""
    return speeds, note


def _cut(cutter: Extractor, inputs: list[str], outputs: list[str]) -> onnx.ModelProto:
    """The part of ``cutter``'s model between ``inputs`` and ``outputs``, checked as a model of its own."""
    part = cutter.extract_model(inputs, outputs)
    onnx.checker.check_model(part)
    return part


def _time_pair(int8_model: Path, other_model: Path, build: CoreBuild) -> tuple[float, float]:
    """Both cut-out models built, then timed in turns: the best median of each."""
    calls = [_bound_call(path, build) for path in (int8_model, other_model)]
    best = [float("inf"), float("inf")]
    for _ in range(2):
        for index, call in enumerate(calls):
            best[index] = min(best[index], median_call_ms(call, CALL_BUDGET_S)[0])
    return best[0], best[1]


def _bound_call(path: Path, build: CoreBuild) -> Callable[[], Any]:
    imported = load_model(path)
    plan = plan_graph(imported.mod, build.target, build.options)
    chosen, _ = choose_schedules(plan.tasks, build.target, None, build.caches)
    model = LoadedModel(build_tuned(plan, build.target, chosen))
    return model.bound_call(random_inputs(imported.signature, seed=0))


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int | str, ...]]:
    infos = [*model.graph.input, *model.graph.value_info, *model.graph.output]
    shapes = {
        info.name: tuple(d.dim_value or d.dim_param for d in info.type.tensor_type.shape.dim)
        for info in infos
    }
    return {**shapes, **{init.name: tuple(init.dims) for init in model.graph.initializer}}


def _signature(node: onnx.NodeProto, shapes: dict[str, tuple[int | str, ...]]) -> tuple[object, ...]:
    """What makes two operators the same kernel: type, attributes, input shapes (weights included)."""
    attributes = tuple(sorted(attribute.SerializeToString() for attribute in node.attribute))
    return (node.op_type, attributes, *(shapes.get(name) for name in node.input), len(node.input))
