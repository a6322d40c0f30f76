"""The schedule each kernel of a model is compiled with when nothing is tuned now: its best tuned record
from Kiln's store, or else a schedule Kiln builds without measuring anything.

Unscheduled TIR compiles to serial loops (TVM's untuned baseline is ~100x slower than a tuned model on a
ResNet). A kernel without a record therefore takes, in this order: the best record of the nearest-shaped
workload of its family measured on this target, replayed with its tiles adapted (:mod:`schedules.transfer`),
a default rule's schedule
(:mod:`schedules.defaults`: reductions, GEMV, transposes), the analytic register-tiled schedule of a float32
matmul or convolution (:mod:`schedules.analytic`), the polyhedral model's best-ranked tiling
(:func:`schedules.poly.search.seed_schedules`: the contractions the analytic rule does not take), or a sample of MetaSchedule's
design space with its postprocessors applied (elementwise kernels: parallel, vectorised). All of them go
into one in-memory MetaSchedule database that :func:`tuner.compile.build_tuned` applies, so the compiled
model is built exactly as a tuned one is.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum
from typing import Any

from kiln_tvm import SCHEDULE_ERRORS, Target, ms, physical_core_count, s_tir, structural_hash
from schedules.analytic import analytic_schedule
from schedules.defaults import default_schedule
from schedules.isa import isa_profile
from schedules.loops import fp32_lanes
from schedules.poly.caches import CacheHierarchy
from schedules.poly.search import seed_schedules
from schedules.poly.tiling import MachineModel
from schedules.spaces import SpaceOptions, space_for
from schedules.transfer import postprocessed, transferred_schedules
from tuner.entities import record_latency_s

log = logging.getLogger(__name__)

#: A record's latency stands for an unmeasured schedule's (the database orders records by it).
UNMEASURED_S = 1e9


class ScheduleSource(str, Enum):
    """Where a kernel's schedule came from."""

    TUNED = "tuned"  # the best measured record in Kiln's store
    SIMILAR = "similar"  # a measured record of the same operator at other shapes, its tiles adapted
    RULE = "rule"  # a default rule (schedules.defaults)
    ANALYTIC = "analytic"  # the analytic register-tiled schedule (schedules.analytic), not measured
    POLYHEDRAL_MODEL = "model"  # the polyhedral model's best-ranked tiling, not measured (not the cost model)
    SAMPLED = "sampled"  # a sample of MetaSchedule's design space, not measured
    NONE = "none"  # left unscheduled: serial loops


@dataclass(frozen=True)
class KernelChoice:
    """The schedule one task's kernel is compiled with."""

    task: str
    workload_hash: str
    weight: int  # calls of the kernel in the model
    source: ScheduleSource
    latency_ms: float | None  # the record's measured latency (tuned only)


def choose_schedules(
    tasks: list[Any], target: Target, store_database: Any | None, caches: CacheHierarchy
) -> tuple[Any, list[KernelChoice]]:
    """An in-memory database with one record per task (its best record in ``store_database``, else a
    schedule built without measuring), and what each task got."""
    memory = ms.database.MemoryDatabase()
    choices: list[KernelChoice] = []
    for task in tasks:
        mod = task.dispatched[0]
        source, latency_ms, record = _tuned_record(store_database, mod)
        if record is not None:
            memory.commit_tuning_record(
                ms.database.TuningRecord(
                    trace=record.trace,
                    workload=memory.commit_workload(mod),
                    run_secs=record.run_secs,
                    target=target,
                    args_info=record.args_info,
                )
            )
        else:
            source, sch = _transferred(store_database, mod, target, str(task.task_name), caches)
            if sch is None:
                source, sch = untuned_schedule(mod, target, str(task.task_name), caches)
            if sch is not None:
                memory.commit_tuning_record(
                    ms.database.TuningRecord(
                        trace=sch.trace,
                        workload=memory.commit_workload(mod),
                        run_secs=[UNMEASURED_S],
                        target=target,
                        args_info=ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True),
                    )
                )
        choices.append(
            KernelChoice(str(task.task_name), structural_hash(mod), int(task.weight), source, latency_ms)
        )
    return memory, choices


def _tuned_record(store_database: Any | None, mod: Any) -> tuple[ScheduleSource, float | None, Any]:
    if store_database is None or not store_database.has_workload(mod):
        return ScheduleSource.NONE, None, None
    best = store_database.get_top_k(store_database.commit_workload(mod), 1)
    if not best:
        return ScheduleSource.NONE, None, None
    latency = record_latency_s(best[0].run_secs)
    return ScheduleSource.TUNED, (None if latency is None else latency * 1e3), best[0]


def _transferred(
    store_database: Any | None, mod: Any, target: Target, task_name: str, caches: CacheHierarchy
) -> tuple[ScheduleSource, s_tir.Schedule | None]:
    """The first of the nearest similar workloads' best records that replays on ``mod``: of its family
    (the trace replayed), else sharing its anchor under another epilogue (the decisions replayed)."""
    if store_database is None or not hasattr(store_database, "similar_records"):
        return ScheduleSource.NONE, None
    family, anchored = store_database.similar_records(mod), store_database.anchor_records(mod)
    if not family and not anchored:
        return ScheduleSource.NONE, None
    cores = int(target.attrs.get("num-cores", physical_core_count())) if target.kind.name == "llvm" else 1
    space = "cpu" if target.kind.name == "llvm" else None
    context = task_context(mod, target, task_name, space, caches=caches, cores=cores)
    sch = next(iter(transferred_schedules(family, anchored, context, 1)), None)
    if sch is not None:
        return ScheduleSource.SIMILAR, sch
    log.info("no record of a workload similar to %s replays on it", task_name)
    return ScheduleSource.NONE, None


def untuned_schedule(
    mod: Any, target: Target, task_name: str, caches: CacheHierarchy
) -> tuple[ScheduleSource, s_tir.Schedule | None]:
    """A schedule of a task's module built without measuring: a rule's, the analytic one, the model's best
    tiling, or a design-space sample (see the module's docstring); ``NONE`` when none applies."""
    sch = default_schedule(mod, target)
    if sch is not None:
        return ScheduleSource.RULE, sch
    if target.kind.name != "llvm":
        return ScheduleSource.NONE, None
    cores = int(target.attrs.get("num-cores", physical_core_count()))
    try:
        cpu = task_context(mod, target, task_name, "cpu", caches=caches, cores=cores)
        analytic = analytic_schedule(cpu, isa_profile(target))
        if analytic is not None:
            return ScheduleSource.ANALYTIC, analytic
        poly = task_context(mod, target, task_name, "cpu-poly", caches=caches, cores=cores)
        seeds = seed_schedules(poly, MachineModel(fp32_lanes(target), cores, caches), 1, unmeasured=True)
        if seeds:
            return ScheduleSource.POLYHEDRAL_MODEL, seeds[0]
        sampled = design_space_sample(cpu)
    except Exception as exc:  # noqa: BLE001 - a kernel no generator takes is compiled unscheduled
        log.info("no untuned schedule of %s: %s", task_name, str(exc).splitlines()[0] if str(exc) else exc)
        return ScheduleSource.NONE, None
    return (ScheduleSource.SAMPLED, sampled) if sampled is not None else (ScheduleSource.NONE, None)


def task_context(
    mod: Any, target: Target, task_name: str, space: str | None, *, caches: CacheHierarchy, cores: int
) -> Any:
    """A MetaSchedule tune context of one task's module over the schedule space ``space``."""
    return ms.TuneContext(
        mod=mod,
        target=target,
        space_generator=space_for(target, space, SpaceOptions(caches=caches)),
        task_name=task_name,
        rand_state=1,
        num_threads=cores,
    ).clone()


def design_space_sample(context: Any) -> s_tir.Schedule | None:
    """The first design space with its sampled decisions and the postprocessors applied."""
    mod = context.mod
    postprocs = list(context.space_generator.postprocs)
    for space in context.space_generator.generate_design_space(mod):
        sch = s_tir.Schedule(mod, seed=1)
        try:
            space.trace.apply_to_schedule(sch, remove_postproc=True)
        except SCHEDULE_ERRORS:
            continue
        if postprocessed(sch, postprocs) is not None:
            return sch
    return None
