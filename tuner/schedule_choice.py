"""The schedule each kernel of a model is compiled with when nothing is tuned now: its best tuned record
from Kiln's store, or else a schedule Kiln builds without measuring anything.

Unscheduled TIR compiles to serial loops (TVM's untuned baseline is ~100x slower than a tuned model on a
ResNet). A kernel without a record therefore takes, in this order: the best record of the nearest-shaped
workload of its family measured on this target, replayed with its tiles adapted (:mod:`schedules.transfer`),
a default rule's schedule
(:mod:`schedules.defaults`: reductions, GEMV, transposes), the polyhedral model's best-ranked tiling
(:func:`schedules.poly.search.seed_schedules`: matmuls and convolutions), or a sample of MetaSchedule's
design space with its postprocessors applied (elementwise kernels: parallel, vectorised). Given a cost
model trained on the store's records (``ranker``), a kernel without a record instead gets the candidate
it predicts fastest among all of these (several similar records' transfers, the rule's schedule, several
of the model's tilings): the order of trust alone takes the nearest-shaped transfer, which on a ViT from
a BERT's records ran matmuls 2-4x slower than their tuned schedules. All of them go
into one in-memory MetaSchedule database that :func:`tuner.compile.build_tuned` applies, so the compiled
model is built exactly as a tuned one is.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum
from typing import Any

from kiln_tvm import SCHEDULE_ERRORS, Target, ms, physical_core_count, s_tir, structural_hash
from schedules.defaults import default_schedule
from schedules.loops import fp32_lanes
from schedules.poly.caches import CacheHierarchy
from schedules.poly.search import seed_schedules
from schedules.poly.tiling import MachineModel
from schedules.spaces import SpaceOptions, space_for
from schedules.transfer import postprocessed, transferred_schedules

log = logging.getLogger(__name__)

#: A record's latency stands for an unmeasured schedule's (the database orders records by it).
UNMEASURED_S = 1e9
#: Candidates a cost model ranks for a kernel without a record: transfers from similar records, and the
#: polyhedral model's best-ranked tilings.
RANKED_TRANSFERS = 6
RANKED_TILINGS = 4


class ScheduleSource(str, Enum):
    """Where a kernel's schedule came from."""

    TUNED = "tuned"  # the best measured record in Kiln's store
    SIMILAR = "similar"  # a measured record of the same operator at other shapes, its tiles adapted
    RULE = "rule"  # a default rule (schedules.defaults)
    MODEL = "model"  # the polyhedral model's best-ranked tiling, not measured
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
    tasks: list[Any],
    target: Target,
    store_database: Any | None,
    caches: CacheHierarchy,
    ranker: Any | None = None,
) -> tuple[Any, list[KernelChoice]]:
    """An in-memory database with one record per task (its best record in ``store_database``, else a
    schedule built without measuring: the first in the order of trust, or the one ``ranker``, a trained
    MetaSchedule cost model, predicts fastest), and what each task got."""
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
            source, sch = unmeasured_schedule(
                store_database, mod, target, str(task.task_name), caches, ranker
            )
            if sch is not None:
                memory.commit_tuning_record(
                    ms.database.TuningRecord(
                        trace=sch.trace,
                        workload=memory.commit_workload(mod),
                        run_secs=[UNMEASURED_S],
                        target=target,
                        args_info=_args_info(sch),
                    )
                )
        choices.append(
            KernelChoice(str(task.task_name), structural_hash(mod), int(task.weight), source, latency_ms)
        )
    return memory, choices


def unmeasured_schedule(
    store_database: Any | None,
    mod: Any,
    target: Target,
    task_name: str,
    caches: CacheHierarchy,
    ranker: Any | None = None,
) -> tuple[ScheduleSource, s_tir.Schedule | None]:
    """The schedule of a task without a record of its own: without ``ranker``, a similar record's transfer
    else :func:`untuned_schedule`; with it, the candidate of either kind it predicts fastest."""
    if ranker is None:
        transfers = _transferred(store_database, mod, target, task_name, caches, 1)
        return transfers[0] if transfers else untuned_schedule(mod, target, task_name, caches)
    candidates = _transferred(store_database, mod, target, task_name, caches, RANKED_TRANSFERS)
    candidates += untuned_candidates(mod, target, task_name, caches, RANKED_TILINGS)
    if len(candidates) <= 1:
        return candidates[0] if candidates else (ScheduleSource.NONE, None)
    cores = _cores(target)
    context = _context(mod, target, task_name, "cpu" if target.kind.name == "llvm" else None, caches, cores)
    try:
        scores = ranker.predict(context, [ms.MeasureCandidate(sch, _args_info(sch)) for _, sch in candidates])
    except Exception as exc:  # noqa: BLE001 - a model that cannot rank leaves the order of trust
        log.warning("the cost model could not rank %s's candidates: %s", task_name, exc)
        return candidates[0]
    best = max(range(len(candidates)), key=lambda i: (float(scores[i]), -i))
    return candidates[best]


def _tuned_record(store_database: Any | None, mod: Any) -> tuple[ScheduleSource, float | None, Any]:
    if store_database is None or not store_database.has_workload(mod):
        return ScheduleSource.NONE, None, None
    best = store_database.get_top_k(store_database.commit_workload(mod), 1)
    if not best:
        return ScheduleSource.NONE, None, None
    secs = [float(s) for s in best[0].run_secs or []]
    return ScheduleSource.TUNED, (sum(secs) / len(secs) * 1e3 if secs else None), best[0]


def _transferred(
    store_database: Any | None,
    mod: Any,
    target: Target,
    task_name: str,
    caches: CacheHierarchy,
    count: int,
) -> list[tuple[ScheduleSource, s_tir.Schedule]]:
    """Up to ``count`` of the nearest similar workloads' best records that replay on ``mod``: of its
    family (the trace replayed), then sharing its anchor under another epilogue (the decisions replayed)."""
    if store_database is None or not hasattr(store_database, "similar_records"):
        return []
    family, anchored = store_database.similar_records(mod), store_database.anchor_records(mod)
    if not family and not anchored:
        return []
    space = "cpu" if target.kind.name == "llvm" else None
    context = _context(mod, target, task_name, space, caches, _cores(target))
    found = transferred_schedules(family, anchored, context, count)
    if not found:
        log.info("no record of a workload similar to %s replays on it", task_name)
    return [(ScheduleSource.SIMILAR, sch) for sch in found]


def untuned_schedule(
    mod: Any, target: Target, task_name: str, caches: CacheHierarchy
) -> tuple[ScheduleSource, s_tir.Schedule | None]:
    """A schedule of a task's module built without measuring: a rule's, the model's best tiling, or a
    design-space sample (see the module's docstring); ``NONE`` when none applies."""
    found = untuned_candidates(mod, target, task_name, caches, 1)
    return found[0] if found else (ScheduleSource.NONE, None)


def untuned_candidates(
    mod: Any, target: Target, task_name: str, caches: CacheHierarchy, tilings: int
) -> list[tuple[ScheduleSource, s_tir.Schedule]]:
    """Schedules built without measuring, in the order of trust: a rule's; then (on a CPU) up to
    ``tilings`` of the model's best-ranked tilings, or a design-space sample when it models none."""
    found: list[tuple[ScheduleSource, s_tir.Schedule]] = []
    sch = default_schedule(mod, target)
    if sch is not None:
        found.append((ScheduleSource.RULE, sch))
        if tilings <= 1:
            return found
    if target.kind.name != "llvm":
        return found
    cores = _cores(target)
    try:
        poly = _context(mod, target, task_name, "cpu-poly", caches, cores)
        seeds = seed_schedules(
            poly, MachineModel(fp32_lanes(target), cores, caches), tilings, unmeasured=True
        )
        if seeds:
            return found + [(ScheduleSource.MODEL, seed) for seed in seeds]
        if found:
            return found
        sampled = _design_space_sample(_context(mod, target, task_name, "cpu", caches, cores))
    except Exception as exc:  # noqa: BLE001 - a kernel no generator takes is compiled unscheduled
        log.info("no untuned schedule of %s: %s", task_name, str(exc).splitlines()[0] if str(exc) else exc)
        return found
    return [(ScheduleSource.SAMPLED, sampled)] if sampled is not None else []


def _cores(target: Target) -> int:
    return int(target.attrs.get("num-cores", physical_core_count())) if target.kind.name == "llvm" else 1


def _args_info(sch: s_tir.Schedule) -> Any:
    return ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)


def _context(
    mod: Any, target: Target, task_name: str, space: str | None, caches: CacheHierarchy, cores: int
) -> Any:
    return ms.TuneContext(
        mod=mod,
        target=target,
        space_generator=space_for(target, space, SpaceOptions(caches=caches)),
        task_name=task_name,
        rand_state=1,
        num_threads=cores,
    ).clone()


def _design_space_sample(context: Any) -> s_tir.Schedule | None:
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
