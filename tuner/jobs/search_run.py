"""One run of the search over a job's tasks, the same for a whole job and for a split job's group.

A whole job searches all its tasks in its tuning process; a split job's group (:mod:`tuner.jobs.task_groups`)
searches its share of them in whichever worker's tuning process claimed it. Both go through
:func:`search_tasks`, the one caller of :func:`tuner.tune.tune_tasks` in the jobs package, so what a search
starts from and what it leaves behind cannot drift apart between the two: the job's measuring settings,
the cost model kept for the target (taught what was stored since it was kept), this machine's roofs, and
at the end each task's search statistics and the cost model kept again, taught every record it did not
measure itself (other jobs', and the other groups' of the same job).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuner.entities import Budget, Job, Task
from tuner.jobs.measuring import measure_config, measuring_host_limits
from tuner.metaschedule.callback import BatchListener
from tuner.metaschedule.cost_model import keep_cost_model, load_cost_model
from tuner.metaschedule.database import KilnDatabase
from tuner.metaschedule.scheduler import StopCheck, TimeLeft
from tuner.settings import Settings
from tuner.store.sql import Store
from tuner.tune import tune_tasks


def search_tasks(
    store: Store,
    settings: Settings,
    job: Job,
    *,
    tasks: Sequence[Task],
    extracted: Sequence[Any],
    database: KilnDatabase,
    target: Any,
    budget: Budget,
    work_dir: Path,
    on_batch: BatchListener,
    should_stop: StopCheck | None,
    time_left_s: TimeLeft,
) -> None:
    """MetaSchedule over ``extracted`` (the job's ``tasks`` as MetaSchedule extracted them, index for
    index) within ``budget``, every record stored through ``database`` as the job's; then the tasks'
    search statistics, and the cost model kept for the job's target and record scope."""
    spec = job.spec
    scope = settings.record_scope(job.owner)
    config = measure_config(settings, spec)
    # The cost model kept for this target starts trained on every record measured on it before.
    cost_model, learnt_up_to = (
        load_cost_model(store, target, job.target_key, scope) if config.cost_model == "xgb" else (None, 0)
    )
    report = tune_tasks(
        list(extracted),
        target,
        database,
        budget=budget,
        config=config,
        work_dir=work_dir,
        on_batch=on_batch,
        should_stop=should_stop,
        time_left_s=time_left_s,
        limits=measuring_host_limits(store, spec),
        cost_model=cost_model,
    )
    for index, stats in report.search_stats.items():
        store.set_search_stats(tasks[index].id, stats)
    if cost_model is not None:
        keep_cost_model(
            store,
            cost_model,
            target,
            target_key=job.target_key,
            scope=scope,
            last=learnt_up_to,
            learnt=database.committed_ids,
        )
