"""What the compiler and the search did, for people to read (the API and the CLI alike): task previews,
the fused graph, each task's best schedule, tuning curves, warm starts and where the time goes."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kiln_tvm import ms, s_tir
from schedules.poly.analysis import PolyhedralAnalysis, analyse_prim_func
from schedules.poly.caches import UNKNOWN, CacheHierarchy, parse_cache_spec
from schedules.poly.report import tiling_report
from tuner.entities import (
    FusionSummary,
    Job,
    ModelInfo,
    ModelPlan,
    PlanError,
    Task,
    TaskInfo,
)
from tuner.errors import Conflict, ImporterCrashed, ImportTimeout, KilnError, NotFound, rebuild_error
from tuner.isolation.sandbox import Cancelled, ModelSandbox
from tuner.jobs.measuring import measuring_caches
from tuner.metaschedule.database import readable_record
from tuner.model_registry import model_file
from tuner.passes.plan_keys import plan_key, plan_shapes
from tuner.settings import Settings
from tuner.store.sql import Store
from tuner.targets import canonical_target_key, is_host_cpu, resolve_target
from tuner.views.curves import JobCurve, JobCurvePoint, TaskCurvePoint, job_curve, task_curve, time_shares


@dataclass(frozen=True)
class BestSchedule:
    """A task's fastest measured schedule: its trace and the TIR it produces."""

    latency_us: float
    gflops: float | None
    trace: str  # the schedule as the Python calls that build it
    tir: str  # the scheduled PrimFunc as TVMScript
    trace_json: Any


def plan_model(
    store: Store,
    settings: Settings,
    sandbox: ModelSandbox,
    model: ModelInfo,
    target: str | dict[str, Any],
    *,
    input_shapes: Any = None,
    cancelled: Callable[[], bool] | None = None,
    precision: str = "as-is",
) -> ModelPlan:
    """A stored model's tasks and fused graph for ``target`` (under a job's ``precision`` policy): planned
    once in the sandbox, then kept.

    A planning error that would come again (an unsupported form, a model too large for the memory
    limit) is kept too and raised again; a timeout is not kept (the machine may have been busy).
    """
    resolved = resolve_target(target)
    target_key = canonical_target_key(resolved)
    shapes = plan_shapes(model, input_shapes)
    key = plan_key(settings, resolved, shapes, precision)
    stored = store.get_model_plan(model.id, key)
    if stored is None:
        # The same preview asked for many times at once is planned once; the others wait for it.
        with _planning(model.id + key, cancelled):
            stored = store.get_model_plan(model.id, key)
            if stored is None:
                stored = _plan_in_sandbox(
                    store,
                    settings,
                    sandbox,
                    model,
                    resolved,
                    target_key=target_key,
                    shapes=shapes,
                    precision=precision,
                    cancelled=cancelled,
                )
                if not (isinstance(stored, PlanError) and stored.transient):
                    store.add_model_plan(model.id, key, stored)
    if isinstance(stored, PlanError):
        raise rebuild_error(stored.kind, stored.message)
    return stored


_inflight: dict[str, threading.Lock] = {}
_inflight_guard = threading.Lock()


@contextlib.contextmanager
def _planning(key: str, cancelled: Callable[[], bool] | None) -> Iterator[None]:
    """Hold the lock of one plan key in this process (waiting gives up when ``cancelled()`` turns true)."""
    with _inflight_guard:
        lock = _inflight.setdefault(key, threading.Lock())
    while not lock.acquire(timeout=0.2):
        if cancelled is not None and cancelled():
            raise Cancelled("the request was abandoned while the same preview was being planned")
    try:
        yield
    finally:
        lock.release()
        with _inflight_guard:
            if not lock.locked():
                _inflight.pop(key, None)


# Planning errors that may not come again: never kept.
_TRANSIENT_ERRORS = frozenset({Cancelled.kind, ImporterCrashed.kind})


def _plan_in_sandbox(
    store: Store,
    settings: Settings,
    sandbox: ModelSandbox,
    model: ModelInfo,
    target: dict[str, Any],
    *,
    target_key: str,
    shapes: dict[str, list[int]],
    precision: str,
    cancelled: Callable[[], bool] | None,
) -> ModelPlan | PlanError:
    args = {
        "path": str(model_file(store, settings, model.id).resolve()),
        "input_shapes": shapes or None,
        "target": target,
        "options": settings.planning_options(precision).to_dict(),
        "max_unpacked_mb": settings.max_unpacked_mb,
    }
    try:
        result = sandbox.run("plan", args, cancelled)
    except ImportTimeout as err:
        # A timeout is the model's when the importer spent its time working, the machine's when it waited.
        return PlanError(target_key, err.kind, err.message, transient=err.machine_busy)
    except KilnError as err:
        return PlanError(target_key, err.kind, err.message, transient=err.kind in _TRANSIENT_ERRORS)
    return ModelPlan(
        target_key=target_key,
        tasks=[TaskInfo(**t) for t in result["tasks"]],
        fusion=FusionSummary.from_dict(result["fusion"]),
        graph=result["graph"],
    )


def best_schedule(store: Store, job: Job, task: Task, scope: str | None = None) -> BestSchedule:
    """The fastest valid record of a task on the job's target (among ``scope``'s records: see
    :meth:`Settings.record_scope`), applied to the task's TIR."""
    found = store.best_record(task.workload_id, job.target_key, scope)
    if found is None:
        raise NotFound(f"task '{task.name}' has no successfully measured schedule yet")
    record_data = json.loads(found.record_json)
    workload = ms.database.Workload.from_json(json.loads(found.workload_json))
    record = readable_record(found.record_json, workload)
    if record is None:
        raise Conflict(
            f"the best schedule of task '{task.name}' was stored by a Kiln with a tensor intrinsic this one "
            "does not have (a newer worker on the same database): show it with that Kiln"
        )
    sch = s_tir.Schedule(workload.mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    latency_us = found.mean_run_sec * 1e6
    return BestSchedule(
        latency_us=latency_us,
        gflops=task.flops / (latency_us * 1e-6) / 1e9 if task.flops else None,
        trace="\n".join(str(line) for line in record.trace.as_python()),
        tir=sch.mod.script(),
        trace_json=record_data[0],
    )


_ANALYSES: dict[int, PolyhedralAnalysis] = {}
_ANALYSES_KEPT = 256
_analyses_guard = threading.Lock()


def _workload_analysis(store: Store, workload_id: int) -> PolyhedralAnalysis:
    """The polyhedral analysis of a stored workload, computed once per process (workloads never change)."""
    with _analyses_guard:
        found = _ANALYSES.get(workload_id)
    if found is None:
        workload = ms.database.Workload.from_json(json.loads(store.get_workload_json(workload_id)))
        found = analyse_prim_func(workload.mod["main"], UNKNOWN)
        with _analyses_guard:
            if len(_ANALYSES) >= _ANALYSES_KEPT:
                _ANALYSES.pop(next(iter(_ANALYSES)))
            _ANALYSES[workload_id] = found
    return found


def task_polyhedral(store: Store, settings: Settings, job: Job, task: Task) -> dict[str, Any]:
    """A job's task through the polyhedral layer: the analysis of its TIR, the caches the job's space holds
    tiles against (and where their sizes came from), the footprints of the best schedule's tiles, and
    what the space's hooks did in the search."""
    analysis = _workload_analysis(store, task.workload_id)
    stats = task.search_stats or {}
    if stats.get("caches") is not None:  # what the job's search used, a remote device's answer included
        caches = (
            parse_cache_spec(stats["caches"], source=stats["cache_source"]) if stats["caches"] else UNKNOWN
        )
    else:
        caches = measuring_caches(settings, job.spec.runner.is_local)
    report = {**analysis.to_json(), "caches": caches.to_json()}
    found = store.best_record(task.workload_id, job.target_key, settings.record_scope(job.owner))
    best: list[dict[str, Any]] | None = None
    if found is not None:
        workload = ms.database.Workload.from_json(json.loads(found.workload_json))
        record = readable_record(found.record_json, workload)
        if record is not None:  # else, stored by a newer Kiln: reported as no modelled tiling
            best = tiling_report(analysis.program, record.trace, caches, settings.poly_margin)
    report["best_schedule"] = {
        "latency_us": found.mean_run_sec * 1e6 if found is not None else None,
        "tilings": best or [],
        "note": (
            "no measured schedule yet"
            if found is None
            else None
            if best
            else "the best schedule has no multi-level tiling of a modelled block (a rule's schedule, or a "
            "kernel the tiling rule does not apply to)"
        ),
    }
    report["search"] = {"space": job.spec.space, **stats}
    return report


def preview_caches(settings: Settings, target: str | dict[str, Any]) -> CacheHierarchy:
    """The caches a preview holds tiles against: this machine's for a target that runs here, the settings'
    sizes for remote devices otherwise."""
    return measuring_caches(settings, is_host_cpu(resolve_target(target)))


def planned_task_polyhedral(plan: ModelPlan, index: int, caches: CacheHierarchy) -> dict[str, Any]:
    """A planned (untuned) task's polyhedral analysis, with the caches the ``cpu-poly`` space would use."""
    if not 0 <= index < len(plan.tasks):
        raise NotFound(f"the model has {len(plan.tasks)} tasks on this target; there is no task {index}")
    found = plan.tasks[index].polyhedral
    if found is None or "error" in found:
        reason = found["error"] if found else "no analysis was kept with this plan"
        raise NotFound(f"no polyhedral analysis of task {index}: {reason}")
    return {**found, "caches": caches.to_json(), "best_schedule": None, "search": None}


def task_tir(store: Store, task: Task) -> str:
    """The task's TIR before scheduling (TVMScript)."""
    return store.get_workload_script(task.workload_id)


__all__ = [
    "BestSchedule",
    "JobCurve",
    "JobCurvePoint",
    "TaskCurvePoint",
    "best_schedule",
    "job_curve",
    "plan_model",
    "planned_task_polyhedral",
    "preview_caches",
    "task_curve",
    "task_polyhedral",
    "task_tir",
    "time_shares",
]
