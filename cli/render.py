"""How the CLI draws things: tables of tasks, the fusion summary, a job's outcome, live progress."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn
from rich.table import Table
from rich.text import Text

from cli.durations import format_duration
from tuner.entities import FusionSummary, Job, LatencyReport, Task

if TYPE_CHECKING:
    from rich.progress import Task as ProgressTask

    from tuner.recorder import TuningClock

console = Console()
err_console = Console(stderr=True)


def fmt(value: float | None, spec: str = ".1f", none: str = "-") -> str:
    """``value`` formatted with ``spec``, or ``none`` when there is no value."""
    return none if value is None else format(value, spec)


def task_table(tasks: list[Task], title: str) -> Table:
    """A job's tasks: weight, work, trials, best latency and the GFLOP/s it reaches."""
    from tuner.tune import gflops

    table = Table(title=title)
    for col in ("#", "task", "weight", "MFLOP", "trials", "best µs", "GFLOP/s"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for i, t in enumerate(tasks):
        table.add_row(
            str(i),
            t.name,
            str(t.weight),
            f"{t.flops / 1e6:.3f}",
            str(t.trials),
            fmt(t.best_latency_us),
            fmt(gflops(t.flops, t.best_latency_us)),
        )
    return table


def fusion_line(fusion: FusionSummary) -> str:
    """One line on what fusion did to the graph."""
    return (
        f"graph: {fusion.operators_before} Relax operators -> {fusion.kernels_after} fused kernels "
        f"({fusion.distinct_tasks} distinct tuning tasks)"
    )


def tuning_time_line(elapsed_s: float, remaining_s: float | None) -> str:
    """``3m10s tuning, 26m50s left`` (or without the budget part when there is none)."""
    line = f"{format_duration(elapsed_s)} tuning"
    return line if remaining_s is None else f"{line}, {format_duration(max(0.0, remaining_s))} left"


class _ClockColumn(ProgressColumn):
    """The tuning time so far and what is left of the time budget, read from the job's clock."""

    def __init__(self) -> None:
        super().__init__()
        self.clock: TuningClock | None = None

    def render(self, task: ProgressTask) -> Text:
        if self.clock is None:
            return Text("")
        return Text(tuning_time_line(self.clock.elapsed_s(), self.clock.remaining_s()), style="cyan")


class RichListener:
    """Draws a job's progress: a stage line and a trials bar with the tuning time (and what is left of
    the time budget) and the current best per task."""

    def __init__(self) -> None:
        self.clock_column = _ClockColumn()
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            self.clock_column,
            TextColumn("{task.fields[detail]}"),
            console=console,
            transient=False,
        )
        self.bar: Any = None
        self.trials_total = 0

    def __enter__(self) -> RichListener:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def stage(self, name: str) -> None:
        if name != "tuning":
            console.log(name)

    def planned(self, tasks: list[Task], fusion: FusionSummary, trials_total: int) -> None:
        console.log(fusion_line(fusion))
        warm = sum(1 for t in tasks if t.best_latency_us is not None)
        if warm:
            console.log(f"{warm}/{len(tasks)} tasks start warm from records of earlier runs on this target")
        self.trials_total = trials_total

    def tuning(self, clock: TuningClock) -> None:
        self.clock_column.clock = clock
        if self.trials_total or clock.budget_s is not None:
            # Without a trial budget (time only) the bar counts trials against no total.
            self.bar = self.progress.add_task("tuning", total=self.trials_total or None, detail="")

    def measured(self, task: Task, trials_done: int, trials_total: int) -> None:
        if self.bar is not None:
            detail = f"{task.name[:40]}: best {fmt(task.best_latency_us)} µs"
            done = min(trials_done, trials_total) if trials_total else trials_done
            self.progress.update(self.bar, completed=done, detail=detail)


def print_latency_report(report: LatencyReport | None) -> None:
    """Every implementation's interleaved rounds (median, range), then any warning about the figures."""
    if report is None:
        return
    rounds = max((len(t.rounds_ms) for t in report.timings.values()), default=0)
    for name, t in report.timings.items():
        console.print(
            f"  {name}: {t.median_ms:.3f} ms (median of {len(t.rounds_ms)} rounds, {t.min_ms:.3f} to "
            f"{t.max_ms:.3f} ms)",
            highlight=False,
        )
    if rounds:
        console.print(f"  each round timed every implementation once, in a fresh process; {rounds} rounds")
    for warning in report.warnings:
        console.print(f"[bold yellow]warning:[/] {warning}")


def print_tuning_time(job: Job) -> None:
    """How long the job has tuned, against its time budget when it has one."""
    now = datetime.now(timezone.utc)
    elapsed = job.tuning_elapsed_s(now)
    if elapsed or job.spec.time_budget_s is not None:
        budget = job.spec.time_budget_s
        of = f" of a {format_duration(budget)} budget" if budget is not None else ""
        console.print(f"{tuning_time_line(elapsed, job.tuning_remaining_s(now))}{of}", highlight=False)


def print_outcome(job: Job) -> None:
    """The untuned and tuned latency of a finished job, when it has both."""
    if job.baseline_latency_ms is not None and job.tuned_latency_ms is not None:
        console.print(
            f"untuned TVM {job.baseline_latency_ms:.3f} ms -> tuned {job.tuned_latency_ms:.3f} ms: "
            f"[bold green]{job.speedup:.1f}x faster[/]"
        )
