"""Runs MetaSchedule over a model's tasks, writing every measured candidate to Kiln's database."""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kiln_tvm import (
    METASCHEDULE_LOGGER,
    Target,
    estimate_flops,
    ms,
    physical_core_count,
)
from schedules.analytic import analytic_schedule
from schedules.anatomy import argument_bytes, kernel_precision
from schedules.isa import isa_profile
from schedules.loops import fp32_lanes
from schedules.poly.caches import CacheHierarchy
from schedules.poly.search import PruningStats, seed_schedules
from schedules.poly.tiling import MachineModel
from schedules.spaces import SpaceOptions, default_space_name, get_space, space_for
from schedules.transfer import transferred_schedules
from tuner.entities import Budget, MachineLimits, RunnerSpec, record_latency_s
from tuner.entities.job import check_cost_model
from tuner.isolation.fatal_signals import report_fatal_signals_on_stderr
from tuner.metaschedule.builder import PooledBuilder
from tuner.metaschedule.callback import BatchListener, ProgressCallback, TrialBatch
from tuner.metaschedule.cost_model import RankingCostModel, xgb_model
from tuner.metaschedule.measured_seeds import measure_default_schedules, measure_schedules
from tuner.metaschedule.rpc_runner import GuardedRPCRunner, make_rpc_runner
from tuner.metaschedule.runner import ExclusiveRunner, alloc_measure_arguments, run_calibrated_evaluator
from tuner.metaschedule.scheduler import KilnTaskScheduler, StopCheck, TimeLeft

log = logging.getLogger(__name__)

# The trial limit of a search bounded by time only (MetaSchedule needs a number; C++ int).
UNLIMITED_TRIALS = 2**31 - 1
# The most of a time budget's remainder the seeds may take (generating them is pure-Python modelling,
# seconds per convolution on a slow machine): the search gets the rest.
SEED_TIME_SHARE = 0.5


@dataclass(frozen=True)
class MeasureConfig:
    """How candidates are built and measured."""

    number: int = 1  # the least runs per repeat (calibrated up to fill min_repeat_ms)
    repeat: int = 3
    min_repeat_ms: int = 10
    calibrate: bool = True  # runs per repeat from a short calibration (run_calibrated_evaluator)
    builder_workers: int | None = None
    trials_per_iter: int = 16
    population_size: int | None = None  # None: sized to the round (see population_for)
    cost_model: str = "xgb"
    default_schedules: bool = True  # measure rule-based schedules (schedules.defaults) before the search
    runner: RunnerSpec = field(default_factory=RunnerSpec)
    rpc_servers: int = 1  # an rpc runner's servers measuring at once (the key's, up to this)
    space: str | None = None  # None: the target's default (schedules.spaces.default_space_name)
    space_options: SpaceOptions = field(default_factory=SpaceOptions)


@dataclass(frozen=True)
class TuningReport:
    """Where a tuning run's time went, and what the search space's hooks did per task."""

    #: Seconds per phase of MetaSchedule's profiler (search, build, run...).
    profile: dict[str, float] = field(default_factory=dict)
    #: Per task index: the space's pruning and seeding statistics (``cpu-poly``), when it keeps any.
    search_stats: dict[int, dict[str, Any]] = field(default_factory=dict)


# The evolutionary search's population per candidate a round measures, and its floor.
POPULATION_PER_CANDIDATE = 4
MIN_POPULATION = 32


def population_for(per_iter: int, configured: int | None = None) -> int:
    """The evolutionary search's population for rounds of ``per_iter`` candidates.

    A round samples, mutates and scores its whole population (``genetic_num_iters`` times), whatever the
    number of candidates it then measures: the search's cost per trial is population / round size.
    MetaSchedule's default (512 for rounds of 64) spends 8 scored schedules per trial; Kiln's rounds are
    smaller (16: the cost model learns after every batch), so a fixed population would cost more per trial
    the smaller the round. Four per candidate keeps the search at half of stock's cost per trial.
    """
    if configured is not None:
        return configured
    return max(MIN_POPULATION, POPULATION_PER_CANDIDATE * per_iter)


def make_search(population: int) -> Any:
    """Evolutionary search with ``population``; a quarter of it at least must be fresh random samples
    (MetaSchedule's fixed minimum of 50 would end the search of a small population at its first failed
    sample)."""
    return ms.search_strategy.EvolutionarySearch(
        population_size=population, init_min_unmeasured=max(1, population // 4)
    )


def _evaluator(config: MeasureConfig) -> Any:
    return ms.runner.EvaluatorConfig(
        number=config.number,
        repeat=config.repeat,
        min_repeat_ms=config.min_repeat_ms,
        enable_cpu_cache_flush=False,
    )


def make_runner(config: MeasureConfig) -> Any:
    """The measurement runner: this machine's CPU, or devices behind a TVM RPC tracker."""
    if config.runner.is_local:
        # A kernel that crashes ends its measuring process at once (reported as a failed candidate)
        # rather than possibly hanging in TVM's handler until the runner's timeout.
        return ExclusiveRunner(
            ms.runner.LocalRunner(
                evaluator_config=_evaluator(config),
                initializer=report_fatal_signals_on_stderr,
                f_alloc_argument=alloc_measure_arguments,
                f_run_evaluator=run_calibrated_evaluator if config.calibrate else None,
            )
        )
    return make_rpc_runner(
        config.runner, _evaluator(config), calibrate=config.calibrate, servers=config.rpc_servers
    )


def make_cost_model(name: str, cores: int) -> Any:
    """XGBoost (default) or random cost model."""
    check_cost_model(name)
    if name == "xgb":
        return RankingCostModel(xgb_model(cores))
    return ms.cost_model.RandomModel()


def trials_per_iter(budget: Budget, num_tasks: int, preferred: int) -> int:
    """Candidates per search round: small budgets get smaller rounds so every task is measured."""
    share = preferred if budget.trials is None else budget.trials // max(1, num_tasks)
    if budget.max_trials_per_task is not None:
        share = min(share, budget.max_trials_per_task)
    return max(2, min(preferred, share))


def tune_tasks(
    tasks: list[Any],
    target: Target,
    database: Any,
    *,
    budget: Budget,
    config: MeasureConfig,
    work_dir: Path,
    on_batch: BatchListener | None = None,
    should_stop: StopCheck | None = None,
    time_left_s: TimeLeft | None = None,
    limits: MachineLimits | None = None,
    cost_model: Any | None = None,
) -> TuningReport:
    """Tune extracted tasks with evolutionary search; every measured candidate lands in ``database`` as
    soon as its batch is measured.

    ``tasks`` are MetaSchedule ``ExtractedTask``s in the order the caller indexes them; ``on_batch``
    receives that index. The search ends when the trials are spent, when ``should_stop()`` says so
    (checked before each batch), or before a batch that would not fit in ``time_left_s()`` seconds.
    Before the search, each task's default schedules are measured and, in a seeded space (``cpu-poly``),
    its seed schedules (:func:`_measure_before_search`); they are trials of their tasks and the search's
    first population draws on them.
    ``limits`` (this machine's measured roofs, for a target run here) give each fp32 task its roofline,
    which steers the scheduler's trials and ends a task's search once it is close to it.
    ``cost_model``: the model that ranks the search's candidates (a pretrained one,
    :mod:`tuner.metaschedule.cost_model`); None: a fresh one of ``config.cost_model``.
    Returns where the time went and what the space's hooks did.
    """
    if budget.trials == 0 or not tasks:
        return TuningReport()
    work_dir.mkdir(parents=True, exist_ok=True)
    tuning = _start(
        tasks,
        target,
        database,
        budget=budget,
        config=config,
        work_dir=work_dir,
        time_left_s=time_left_s,
        cost_model=cost_model,
    )
    profiler = ms.Profiler()
    on_batch = _counting_servers(tuning, on_batch)
    try:
        with profiler:
            default_ms, spent = _measure_before_search(
                tuning, on_batch=on_batch, should_stop=should_stop, time_left_s=time_left_s
            )
            if budget.trials is None or spent < budget.trials:
                _search(
                    tuning,
                    work_dir=work_dir,
                    spent=spent,
                    default_ms=default_ms,
                    on_batch=on_batch,
                    should_stop=should_stop,
                    time_left_s=time_left_s,
                    limits=limits,
                )
    finally:
        tuning.builder.shutdown()
        if isinstance(tuning.runner, GuardedRPCRunner):
            tuning.runner.shutdown()
        # Where the tuning time went (search, build, run, cost model), for whoever wonders why it is slow.
        (work_dir / "profile.txt").write_text(str(profiler.table()))
    return _report(tuning, profiler)


@dataclass
class _Tuning:
    """What one :func:`tune_tasks` call sets up once and its phases share: a tune context per task (in the
    tasks' order), the builder, runner and cost model, and the space's statistics per task."""

    tasks: list[Any]
    target: Target
    database: Any
    budget: Budget
    config: MeasureConfig
    cores: int
    contexts: list[Any]
    stats: list[PruningStats]
    builder: PooledBuilder
    runner: Any
    cost_model: Any
    seeded_space: bool
    measured_on: dict[int, Counter[str]] = field(default_factory=dict)  # task index -> server -> candidates


def _start(
    tasks: list[Any],
    target: Target,
    database: Any,
    *,
    budget: Budget,
    config: MeasureConfig,
    work_dir: Path,
    time_left_s: TimeLeft | None,
    cost_model: Any | None,
) -> _Tuning:
    cores = physical_core_count()
    if target.kind.name == "llvm":
        cores = int(target.attrs.get("num-cores", cores))
    loggers = _task_loggers(work_dir, [str(t.task_name) for t in tasks])
    seeds = ms.utils.fork_seed(budget.seed, n=len(tasks))
    per_iter = trials_per_iter(budget, len(tasks), config.trials_per_iter)
    population = population_for(per_iter, config.population_size)
    stats = [PruningStats() for _ in tasks]
    contexts = [
        ms.TuneContext(
            mod=task.dispatched[0],
            target=target,
            space_generator=space_for(target, config.space, config.space_options, task_stats),
            search_strategy=make_search(population),
            task_name=str(task.task_name),
            logger=logger,
            rand_state=seed,
            num_threads=cores,
        ).clone()
        for task, logger, seed, task_stats in zip(tasks, loggers, seeds, stats, strict=True)
    ]
    log.info(
        "tuning %d tasks: %s trials, %s s (per task cap %s, %d per round, population %d) on %s",
        len(tasks),
        budget.trials,
        budget.time_s,
        budget.max_trials_per_task,
        per_iter,
        population,
        target,
    )
    return _Tuning(
        tasks=tasks,
        target=target,
        database=database,
        budget=budget,
        config=config,
        cores=cores,
        contexts=contexts,
        stats=stats,
        builder=PooledBuilder(
            max_workers=config.builder_workers or cores, timeout_sec=60.0, time_left_s=time_left_s
        ),
        runner=make_runner(config),
        cost_model=cost_model if cost_model is not None else make_cost_model(config.cost_model, cores),
        seeded_space=get_space(config.space or default_space_name(target)).seeded,
    )


def _measure_before_search(
    tuning: _Tuning,
    *,
    on_batch: BatchListener | None,
    should_stop: StopCheck | None,
    time_left_s: TimeLeft | None,
) -> tuple[dict[int, float], int]:
    """Each task's default schedules, then, in a seeded space, its seed schedules, measured and stored:
    the default schedules' latencies (ms) by task index, and the trials spent."""
    budget, config, database = tuning.budget, tuning.config, tuning.database
    # A task that starts warm (an earlier job or attempt stored its records) needs no seeds: the search's
    # first population already draws on the measured records. Asked before the default schedules store any.
    warm = set()
    if tuning.seeded_space:
        warm = {
            i
            for i, t in enumerate(tuning.tasks)
            if database.get_top_k(database.commit_workload(t.dispatched[0]), 1)
        }
    default_ms: dict[int, float] = {}
    spent = 0
    if config.default_schedules:
        with ms.Profiler.timeit("Kiln/DefaultSchedules"):
            default_ms, spent = measure_default_schedules(
                tuning.tasks,
                tuning.target,
                database,
                builder=tuning.builder,
                runner=tuning.runner,
                on_batch=on_batch,
                limit=budget.trials,
                cost_model=tuning.cost_model,
            )
    if tuning.seeded_space and config.space_options.seeds > 0:
        with ms.Profiler.timeit("Kiln/PolyhedralSeeds"):
            seeded = _measure_seeds(
                tuning,
                on_batch=on_batch,
                limit=None if budget.trials is None else budget.trials - spent,
                warm=warm,
                stop=_seed_phase_stop(should_stop, time_left_s),
            )
        for index, count in seeded.items():
            tuning.stats[index].seeds = count
        spent += sum(seeded.values())
    return default_ms, spent


def _search(
    tuning: _Tuning,
    *,
    work_dir: Path,
    spent: int,
    default_ms: dict[int, float],
    on_batch: BatchListener | None,
    should_stop: StopCheck | None,
    time_left_s: TimeLeft | None,
    limits: MachineLimits | None,
) -> None:
    """MetaSchedule's evolutionary search over the trials left after ``spent``, its tasks chosen by
    :class:`KilnTaskScheduler`."""
    tasks, budget, config = tuning.tasks, tuning.budget, tuning.config
    # The search's rounds are sized to what the default schedules and the seeds left of the budget:
    # sized to the whole, a small budget's last rounds would not fit and go unspent.
    left = budget if budget.trials is None or not spent else replace(budget, trials=budget.trials - spent)
    per_iter = trials_per_iter(left, len(tasks), config.trials_per_iter)
    ms.tune_tasks(
        tasks=tuning.contexts,
        task_weights=[float(t.weight) for t in tasks],
        work_dir=str(work_dir),
        max_trials_global=_max_trials_global(budget, per_iter, spent),
        # MetaSchedule caps each task at the global count when given no cap, and clamps a task's batch
        # to its cap: a scheduler that gives one heavy task most rounds would stop short of the budget.
        # Capped at the trials left instead, every batch still ends within the budget.
        max_trials_per_task=budget.max_trials_per_task
        or (None if budget.trials is None else max(1, budget.trials - spent)),
        num_trials_per_iter=per_iter,
        builder=tuning.builder,
        runner=tuning.runner,
        database=tuning.database,
        cost_model=tuning.cost_model,
        measure_callbacks=[
            ms.measure_callback.AddToDatabase(),
            ms.measure_callback.RemoveBuildArtifact(),
            ms.measure_callback.UpdateCostModel(),
            ProgressCallback(on_batch),
        ],
        task_scheduler=KilnTaskScheduler(
            should_stop=should_stop,
            time_left_s=time_left_s,
            seed=budget.seed,
            default_ms=default_ms,
            known_ms=_best_known_ms(tasks, tuning.database),
            floor_ms=(
                roofline_floors_ms(tasks, limits, config.space_options.caches) if limits is not None else None
            ),
        ),
    )


def _counting_servers(tuning: _Tuning, on_batch: BatchListener | None) -> BatchListener | None:
    """``on_batch``, after noting which RPC servers measured each batch of each task (an RPC runner counts
    what each server measured: :class:`~tuner.metaschedule.rpc_runner.GuardedRPCRunner`)."""
    served = getattr(tuning.runner, "served", None)
    if served is None:
        return on_batch
    counted: Counter[str] = Counter()

    def counting(batch: TrialBatch) -> None:
        new = served - counted
        counted.update(new)
        tuning.measured_on.setdefault(batch.task_index, Counter()).update(new)
        if on_batch is not None:
            on_batch(replace(batch, measured_on=dict(new)))

    return counting


def _report(tuning: _Tuning, profiler: Any) -> TuningReport:
    caches = tuning.config.space_options.caches
    report = TuningReport(_profile(profiler), _search_stats(tuning.seeded_space, tuning.stats, caches))
    for index, servers in tuning.measured_on.items():
        if servers:  # the RPC servers that measured each task's candidates, by name
            report.search_stats.setdefault(index, {})["measured_on"] = dict(sorted(servers.items()))
    ranked = getattr(tuning.cost_model, "first_ranked", None)
    if ranked is not None:
        # How many measured samples had trained the cost model when it first ranked each task's candidates.
        for index, task in enumerate(tuning.tasks):
            if str(task.task_name) in ranked:
                report.search_stats.setdefault(index, {})["ranked_with_samples"] = ranked[str(task.task_name)]
    return report


def _search_stats(kept: bool, stats: list[PruningStats], caches: CacheHierarchy) -> dict[int, dict[str, Any]]:
    # With the caches the hooks held tiles against, and where their sizes came from (a remote device's
    # answer is not asked for again when someone looks at the job).
    where = {"caches": caches.to_spec(), "cache_source": caches.source}
    return {index: {**s.to_json(), **where} for index, s in enumerate(stats)} if kept else {}


def _measure_seeds(
    tuning: _Tuning,
    *,
    on_batch: BatchListener | None,
    limit: int | None,
    warm: set[int],
    stop: StopCheck,
) -> dict[int, int]:
    """Measure and store each task's seed schedules (a batch per task); returns how many each got.

    A task's first seed is its analytic schedule (:mod:`schedules.analytic`) where it has one; then the best records of the nearest-shaped workloads of its family (the same
    operator at other shapes), replayed with their tiles adapted; the polyhedral model's tilings follow.
    Within a trial ``limit``, each task gets at most half of its share of it, so that a small budget still
    measures every task and leaves the search its turn. The ``warm`` tasks get none. No task is seeded
    once ``stop()`` says so (checked before each task's seeds are generated). The cost model learns the
    seeds that ran.
    """
    tasks = tuning.tasks
    machine = MachineModel(fp32_lanes(tuning.target), tuning.cores, tuning.config.space_options.caches)
    per_task = tuning.config.space_options.seeds
    if limit is not None:
        per_task = min(per_task, max(1, limit // (2 * len(tasks))))
    counts: dict[int, int] = {}
    for index, context in enumerate(tuning.contexts):
        if index in warm:
            continue
        if stop():
            log.info("seeds: stopped before task %d of %d (cancelled or out of time)", index, len(tasks))
            break
        left = None if limit is None else limit - sum(counts.values())
        if left is not None and left <= 0:
            break
        wanted = per_task if left is None else min(per_task, left)
        analytic = [s for s in [analytic_schedule(context, isa_profile(tuning.target))] if s is not None]
        transferred = _transferred_seeds(tuning.database, context, wanted - len(analytic))
        schedules = analytic + transferred
        schedules += seed_schedules(context, machine, wanted - len(schedules))
        candidates = [(index, tasks[index].dispatched[0], sch) for sch in schedules]
        measure_schedules(
            candidates,
            tasks,
            tuning.target,
            database=tuning.database,
            builder=tuning.builder,
            runner=tuning.runner,
            on_batch=on_batch,
            what="seed",
            cost_model=tuning.cost_model,
        )
        if candidates:
            counts[index] = len(candidates)
    return counts


def _best_known_ms(tasks: list[Any], database: Any) -> dict[int, float]:
    """Each task's best latency measured so far (its seeds, default schedules, earlier jobs' records)."""
    known: dict[int, float] = {}
    for index, task in enumerate(tasks):
        best = database.get_top_k(database.commit_workload(task.dispatched[0]), 1)
        latency = record_latency_s(best[0].run_secs) if best else None
        if latency is not None:
            known[index] = latency * 1e3
    return known


def roofline_floors_ms(tasks: list[Any], limits: MachineLimits, caches: CacheHierarchy) -> dict[int, float]:
    """Each task's roofline latency (ms): its operations at the measured peak of its own precision (fp32's
    FMA peak, the int8 or bf16 dot product's: :func:`schedules.anatomy.kernel_precision`) or, when its
    arguments outgrow the last-level cache (``caches``), their bytes at the measured memory bandwidth,
    whichever takes longer. A kernel whose data stays in the caches reads it faster than from memory: only
    the compute roof bounds it. Tasks of other precisions and tasks of unknown size get none."""
    last_level = max((c.bytes for c in caches.levels), default=0)
    floors: dict[int, float] = {}
    for index, task in enumerate(tasks):
        mod = task.dispatched[0]
        func = next(iter(mod.functions.values()))
        precision = kernel_precision(func)
        if precision is None:
            continue
        flops, moved = estimate_flops(mod), argument_bytes(func)
        if flops <= 0 or moved <= 0:
            continue
        floor = flops / (limits.peak_for(precision) * 1e6)
        if last_level and moved > last_level:
            floor = max(floor, moved / (limits.bandwidth_gbs * 1e6))
        floors[index] = floor
    return floors


def _transferred_seeds(database: Any, context: Any, count: int) -> list[Any]:
    """Up to ``count`` (at most 2) schedules transferred from similar workloads' best records."""
    if not hasattr(database, "similar_records") or count <= 0:
        return []
    family = database.similar_records(context.mod, k=2)
    anchored = database.anchor_records(context.mod, k=2)
    return transferred_schedules(family, anchored, context, min(count, 2))


def _seed_phase_stop(should_stop: StopCheck | None, time_left_s: TimeLeft | None) -> StopCheck:
    """When the seeds must stop: when the job is told to, or once they have had their share of the time."""
    left = None if time_left_s is None else time_left_s()
    end = None if left is None else time.monotonic() + SEED_TIME_SHARE * max(0.0, left)

    def stop() -> bool:
        return (should_stop is not None and should_stop()) or (end is not None and time.monotonic() >= end)

    return stop


def _profile(profiler: Any) -> dict[str, float]:
    return {str(name): float(seconds) for name, seconds in profiler.get().items()}


def _max_trials_global(budget: Budget, per_iter: int, spent: int = 0) -> int:
    if budget.trials is None:
        return UNLIMITED_TRIALS
    # MetaSchedule starts a round while fewer than this many trials are done, and a round adds at most
    # ``per_iter``: so the total never exceeds the user's budget (less the ``spent`` default schedules).
    return max(1, budget.trials - spent - per_iter + 1)


def _task_loggers(work_dir: Path, task_names: list[str]) -> list[logging.Logger]:
    """MetaSchedule's per-task file loggers, with its console output limited to warnings.

    MetaSchedule otherwise prints every round (and XGBoost's training) to stdout, under Kiln's own
    progress display; the full logs stay in ``work_dir/logs``.
    """
    log_dir = work_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    width = len(str(max(0, len(task_names) - 1)))
    names = [f"{METASCHEDULE_LOGGER}.task_{i:0{width}d}_{name[:100]}" for i, name in enumerate(task_names)]
    console = {
        f"{METASCHEDULE_LOGGER}.console": {
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stderr",
            "formatter": f"{METASCHEDULE_LOGGER}.standard_formatter",
            "level": "WARNING",
        }
    }
    # Naming the global logger's handlers here also keeps MetaSchedule from copying handlers that
    # others attached to it (unnamed ones break its config templating on a second run in one process).
    loggers = {
        METASCHEDULE_LOGGER: {
            "level": "DEBUG",
            "handlers": [f"{METASCHEDULE_LOGGER}.console", f"{METASCHEDULE_LOGGER}.file"],
            "propagate": False,
        }
    }
    ms.logging.create_loggers(
        log_dir=str(log_dir),
        params=[{"log_dir": str(log_dir), "logger_name": n} for n in names],
        logger_config={"handlers": console, "loggers": loggers},
    )
    return [ms.logging.get_logger(n) for n in names]
