"""Measures schedules Kiln builds itself before the search and stores them as records: each task's default
schedule (``schedules.defaults``), and the seeds of a seeded space (``tuner.tune``).

A task a rule serves then starts the search with a good measured candidate: the compiled model uses it
when nothing the search finds is faster, and the task scheduler stops searching a task whose first batch
found nothing faster (see :class:`tuner.metaschedule.scheduler.KilnTaskScheduler`).
"""

from __future__ import annotations

import logging
from typing import Any

from kiln_tvm import Target, ms, runner_device_type
from schedules.defaults import default_schedule
from tuner.metaschedule.callback import BatchListener, TrialBatch, build_failure, latency_us

log = logging.getLogger(__name__)


def measure_default_schedules(
    tasks: list[Any],
    target: Target,
    database: Any,
    *,
    builder: Any,
    runner: Any,
    on_batch: BatchListener | None = None,
    limit: int | None = None,
    cost_model: Any | None = None,
) -> tuple[dict[int, float], int]:
    """Build, measure and store the default schedule of every task a rule serves (one batch for all), or
    of the first ``limit`` such tasks.

    Returns the measured latency (ms) by task index, and how many candidates were measured (each is a
    trial of its task); a task whose default failed to build or run is left out of the latencies (and its
    failure reported to ``on_batch`` like any failed candidate). ``cost_model`` learns what ran.
    """
    scheduled = []
    for index, task in enumerate(tasks):
        if limit is not None and len(scheduled) >= limit:
            break
        mod = task.dispatched[0]
        sch = default_schedule(mod, target)
        if sch is not None:
            scheduled.append((index, mod, sch))
    latencies = measure_schedules(
        scheduled,
        tasks,
        target,
        database=database,
        builder=builder,
        runner=runner,
        on_batch=on_batch,
        what="default",
        cost_model=cost_model,
    )
    return {index: min(lats) / 1e3 for index, lats in latencies.items()}, len(scheduled)


def measure_schedules(
    scheduled: list[tuple[int, Any, Any]],
    tasks: list[Any],
    target: Target,
    *,
    database: Any,
    builder: Any,
    runner: Any,
    on_batch: BatchListener | None,
    what: str,
    cost_model: Any | None = None,
) -> dict[int, list[float]]:
    """Build and measure ``(task index, task module, schedule)`` candidates in one batch, and store each
    that runs as a tuning record of its task. Returns the measured latencies (us) by task index; every
    outcome, failures included, goes to ``on_batch`` as a trial of its task. ``cost_model`` (the search's)
    learns each candidate that ran, as it learns the search's own."""
    if not scheduled:
        return {}
    built = builder.build([ms.builder.BuilderInput(sch.mod, target) for _, _, sch in scheduled])
    device = runner_device_type(target)
    futures = iter(
        runner.run(
            [
                ms.runner.RunnerInput(b.artifact_path, device, _args_info(sch))
                for (_, _, sch), b in zip(scheduled, built, strict=True)
                if b.error_msg is None
            ]
        )
    )
    latencies: dict[int, list[float]] = {}
    ran: dict[int, list[tuple[Any, Any]]] = {}
    for (index, mod, sch), b in zip(scheduled, built, strict=True):
        failure = build_failure(b)
        if failure is not None:
            lat, err = None, failure
        else:
            result = next(futures).result()  # the futures are in the order of the built candidates
            lat, err = latency_us(result)
            if lat is not None:
                database.commit_tuning_record(
                    ms.database.TuningRecord(
                        trace=sch.trace,
                        workload=database.commit_workload(mod),
                        run_secs=[float(s) for s in result.run_secs],
                        target=target,
                        args_info=_args_info(sch),
                    )
                )
                latencies.setdefault(index, []).append(lat)
                ran.setdefault(index, []).append((ms.MeasureCandidate(sch, _args_info(sch)), result))
        if err is not None:
            log.warning("%s schedule of task %d (%s) failed: %s", what, index, tasks[index].task_name, err)
        if on_batch is not None:
            on_batch(TrialBatch(task_index=index, latencies_us=[lat], errors=[err]))
    for b in built:
        if b.artifact_path is not None:
            ms.utils.remove_build_dir(b.artifact_path)
    if cost_model is not None:
        for index, pairs in ran.items():
            mod = tasks[index].dispatched[0]
            context = ms.TuneContext(mod=mod, target=target, task_name=str(tasks[index].task_name))
            cost_model.update(context, [c for c, _ in pairs], [r for _, r in pairs])
    return latencies


def _args_info(sch: Any) -> list[Any]:
    # As MetaSchedule's own candidates: the arguments the built kernel takes, after weight-layout
    # rewriting (the builder drops the rewrite's preprocessing block).
    return ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)
