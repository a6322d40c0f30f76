"""What the compiler did, for people to read: task previews, the fused graph, each task's best schedule."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from schedules._tvm import ms, s_tir
from tuner.entities import FusionSummary, Job, ModelInfo, Task, TaskInfo
from tuner.errors import NotFound
from tuner.frontend import load_model
from tuner.models import model_file
from tuner.settings import Settings
from tuner.store.sql import Store
from tuner.targets import canonical_target_key, resolve_target, to_tvm_target
from tuner.tasks import plan_graph


@dataclass(frozen=True)
class BestSchedule:
    """A task's fastest measured schedule: its trace and the TIR it produces."""

    latency_us: float
    gflops: float | None
    trace: str  # the schedule as the Python calls that build it
    tir: str  # the scheduled PrimFunc as TVMScript
    trace_json: Any


@dataclass(frozen=True)
class ModelPlan:
    """A model's tuning tasks and fused graph on one target, before any tuning."""

    target_key: str
    tasks: list[TaskInfo]
    fusion: FusionSummary
    graph: str  # the Relax program after fusion, as TVMScript


# Recently planned models (importing and fusing a model takes seconds); the oldest is dropped first.
_PLAN_CACHE_SIZE = 32
_plans: OrderedDict[tuple[str, str, str, str], ModelPlan] = OrderedDict()
_plans_lock = threading.Lock()


def plan_model(
    store: Store, settings: Settings, model: ModelInfo, target: str | dict[str, Any], input_shapes: Any = None
) -> ModelPlan:
    """Import a stored model and extract its tasks for ``target`` (cached: models never change)."""
    resolved = resolve_target(target)
    key = (model.id, canonical_target_key(resolved), json.dumps(input_shapes or {}, sort_keys=True), "v1")
    with _plans_lock:
        cached = _plans.get(key)
        if cached is not None:
            _plans.move_to_end(key)
            return cached
    imported = load_model(model_file(store, settings, model.id), input_shapes or _static_shapes(model))
    plan = plan_graph(
        imported.mod, to_tvm_target(resolved), settings.weight_prepack, settings.cpu_conv_layout
    )
    result = ModelPlan(
        target_key=key[1], tasks=list(plan.infos), fusion=plan.fusion, graph=plan.lowered.script()
    )
    with _plans_lock:
        _plans[key] = result
        while len(_plans) > _PLAN_CACHE_SIZE:
            _plans.popitem(last=False)
    return result


def _static_shapes(model: ModelInfo) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(int(d) for d in t.shape) for t in model.signature.inputs if t.is_static}


def best_schedule(store: Store, job: Job, task: Task) -> BestSchedule:
    """The fastest valid record of a task on the job's target, applied to the task's TIR."""
    found = store.best_record(task.workload_id, job.target_key)
    if found is None:
        raise NotFound(f"task '{task.name}' has no successfully measured schedule yet")
    workload_json, record_json, mean_run_sec = found
    record_data = json.loads(record_json)
    workload = ms.database.Workload.from_json(json.loads(workload_json))
    record = ms.database.TuningRecord.from_json(record_data, workload)
    sch = s_tir.Schedule(workload.mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    latency_us = mean_run_sec * 1e6
    return BestSchedule(
        latency_us=latency_us,
        gflops=task.flops / (latency_us * 1e-6) / 1e9 if task.flops else None,
        trace="\n".join(str(line) for line in record.trace.as_python()),
        tir=sch.mod.script(),
        trace_json=record_data[0],
    )


def task_tir(store: Store, task: Task) -> str:
    """The task's TIR before scheduling (TVMScript)."""
    return store.get_workload_script(task.workload_id)


__all__ = ["BestSchedule", "ModelPlan", "best_schedule", "plan_model", "task_tir"]
