"""How the CLI draws things: tables of tasks, the fusion summary, a job's outcome, live progress."""

from __future__ import annotations

import os
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn
from rich.table import Table
from rich.text import Text

from cli.durations import format_duration
from tuner.entities import (
    AccuracyReport,
    FusionSummary,
    IrLevel,
    Job,
    LatencyReport,
    MachineLimits,
    ModelProfile,
    QuantizationReport,
    Task,
    trials_shortfall,
)

if TYPE_CHECKING:
    from rich.progress import Task as ProgressTask

    from tuner.jobs.recorder import TuningClock


def _console(stderr: bool = False) -> Console:
    """A console that, when its output is not a terminal (a pipe, a file, CI's log), keeps lines whole
    instead of wrapping them at rich's default of 80 columns."""
    stream = sys.stderr if stderr else sys.stdout
    piped = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=stderr, width=200 if piped else None, soft_wrap=piped, log_path=False)


console = _console()
err_console = _console(stderr=True)


def print_code(text: str) -> None:
    """Print program text exactly as it is (TIR, traces): no markup (``[i0, i1]`` is not a style), no
    highlighting, no wrapping."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def fmt(value: float | None, spec: str = ".1f", none: str = "-") -> str:
    """``value`` formatted with ``spec``, or ``none`` when there is no value."""
    return none if value is None else format(value, spec)


def task_table(tasks: list[Task], title: str) -> Table:
    """A job's tasks: weight, work, trials, best latency, the GFLOP/s it reaches and where the compiled
    schedule came from (tuned, similar, rule, model, sampled, none)."""
    table = Table(title=title)
    for col in ("#", "task", "weight", "MFLOP", "trials", "best µs", "GFLOP/s", "schedule"):
        table.add_column(col, justify="left" if col in ("task", "schedule") else "right")
    for i, t in enumerate(tasks):
        table.add_row(
            str(i),
            t.name,
            str(t.weight),
            f"{t.flops / 1e6:.3f}",
            str(t.trials),
            fmt(t.best_latency_us),
            fmt(t.gflops),
            t.schedule_source or "-",
        )
    return table


def ir_change(level: IrLevel) -> str:
    """What one pass did to the program, in a few words."""
    if level.position == 0:
        return f"{level.operators_after} operators as imported"
    if not level.changed:
        return "no change"
    kinds = ", ".join(f"{op.removeprefix('relax.')} {d:+d}" for op, d in level.delta.items())
    counts = f"{level.operators_before} -> {level.operators_after} operators"
    return f"{counts}: {kinds}" if kinds else f"{counts}; the program changed"


def mix_line(mix: dict[str, Any]) -> str:
    """A kernel's instruction mix in one line: FMAs by width, dot products, the widest vector."""
    fma = ", ".join(f"{n} {kind}" for kind, n in mix.get("fma", {}).items() if n) or "none"
    dots = ", ".join(f"{n} {name}" for name, n in mix.get("dot_products", {}).items())
    widest = mix.get("widest_vector_bits", 0)
    return (
        f"{mix.get('instructions', 0)} instructions; FMAs: {fma}"
        + (f"; dot products: {dots}" if dots else "")
        + f"; widest vector {widest} bits"
    )


def ir_table(levels: list[IrLevel], job_id: str) -> Table:
    """A job's lowering: one row per level (``kiln ir JOB LEVEL`` prints a level's program)."""
    table = Table(title=f"lowering of job {job_id} (kiln ir {job_id} LEVEL prints one)")
    for col in ("#", "pass", "change", "kernels", "TIR funcs", "s"):
        table.add_column(col, justify="left" if col in ("pass", "change") else "right")
    for level in levels:
        table.add_row(
            str(level.position),
            level.name,
            escape(ir_change(level)),
            str(level.kernels),
            str(level.prim_funcs),
            f"{level.seconds:.2f}",
        )
    return table


def limits_line(limits: MachineLimits) -> str:
    """A machine's roofs in one line."""
    return (
        f"fp32 FMA peak {limits.peak_gflops:.1f} GFLOP/s ({limits.threads} thread(s); "
        f"{limits.peak_gflops_one_thread:.1f} on one), STREAM triad {limits.bandwidth_gbs:.1f} GB/s, "
        f"ridge at {limits.ridge_intensity:.1f} FLOP/byte"
        + (
            f"; int8 peak {limits.int8_gops:.1f} GOP/s ({limits.int8_instruction})"
            if limits.int8_gops
            else ""
        )
        + (
            f"; bf16 peak {limits.bf16_gflops:.1f} GFLOP/s ({limits.bf16_instruction})"
            if limits.bf16_gflops
            else ""
        )
    )


def profile_table(profile: ModelProfile, job_id: str) -> Table:
    """A job's profile: one row per kernel (and one for the VM's builtins), largest time first."""
    table = Table(title=f"profile of job {job_id}'s tuned model ({profile.runs} runs, median per call)")
    columns = ("kernel", "calls", "µs", "share", "GFLOP/s", "GB/s", "FLOP/B", "of roof", "bound")
    for col in columns + ("onnxruntime µs", "ort / kiln"):
        table.add_column(col, justify="left" if col == "kernel" else "right")
    limits = profile.limits
    for k in profile.kernels:
        attainable = k.attainable_gflops(limits)
        gflops = k.gflops
        roof = f"{100 * gflops / attainable:.0f} %" if gflops and attainable else "-"
        ratio = fmt(k.onnxruntime_us / k.total_us, ".2f") if k.compared and k.total_us > 0 else "-"
        ort = fmt(k.onnxruntime_us) if k.onnxruntime_us is not None else "-"
        if k.onnxruntime_us is not None and not k.compared:
            ort += f" ({k.matched_calls}/{k.calls} calls)"
        table.add_row(
            escape(k.name),
            str(k.calls),
            fmt(k.total_us),
            f"{100 * k.share:.1f} %",
            fmt(gflops),
            fmt(k.gbs),
            fmt(k.intensity, ".2f"),
            roof,
            k.bound(limits) or "-",
            ort,
            ratio,
        )
    return table


def print_profile(profile: ModelProfile, job_id: str, warnings: list[str] | None = None) -> None:
    """A job's profile: the machine's roofs, the kernels, and how it compares with the measured latency
    and with onnxruntime; then what in it disagrees (a busy machine), if anything."""
    if profile.limits:
        console.print(f"this machine: {limits_line(profile.limits)}", highlight=False)
    console.print(profile_table(profile, job_id))
    beside = (
        f"; the kernels {profile.kernels_us:.1f} µs, {100 * profile.kernels_us / profile.run_us:.0f} % of the "
        f"run timed beside them ({profile.run_us:.1f} µs)"
        if profile.run_us
        else ""
    )
    latency = f"; the job measured {profile.latency_ms * 1e3:.1f} µs" if profile.latency_ms else ""
    console.print(f"profiled total {profile.total_us:.1f} µs{beside}{latency}", highlight=False)
    if profile.onnxruntime_total_us is not None:
        unprofiled = (
            f" ({profile.onnxruntime_latency_ms * 1e3:.1f} µs unprofiled: its profiler adds a cost per node)"
            if profile.onnxruntime_latency_ms
            else ""
        )
        console.print(
            f"onnxruntime: {profile.onnxruntime_total_us:.1f} µs per run by its profiler{unprofiled}; "
            f"{profile.onnxruntime_unmatched_us:.1f} µs in nodes no Kiln kernel matched "
            "(ort / kiln > 1: Kiln's kernel is faster)",
            highlight=False,
        )
    elif profile.onnxruntime_note:
        console.print(f"onnxruntime: {profile.onnxruntime_note}", highlight=False)
    for warning in warnings or []:
        console.print(f"[bold red]disturbed:[/] {escape(warning)}", highlight=False)


def fusion_line(fusion: FusionSummary) -> str:
    """What fusion did to the graph, and for a quantized model what runs in integers: a line, and one more
    per quantized operator left in float."""
    line = (
        f"graph: {fusion.operators_before} Relax operators -> {fusion.kernels_after} fused kernels "
        f"({fusion.distinct_tasks} distinct tuning tasks)"
    )
    if fusion.integer_ops or fusion.kept_float:
        line += (
            f"\nquantized: {len(fusion.integer_ops)} convolutions/matmuls in integers (u8 x s8 -> int32), "
            f"{len(fusion.kept_float)} kept in float"
        )
        line += "".join(f"\n  float: {k.op} {k.shapes}: {k.reason}" for k in fusion.kept_float)
    forms = {
        "vnni": "VNNI (vpdpbusd",
        "amx": "VNNI (vpdpbusd",
        "avx-vnni": "VNNI (vpdpbusd ymm, AVX-VNNI",
        "avx512": "vpmaddubsw/vpmaddwd zmm (no VNNI",
        "avx2": "vpmaddubsw/vpmaddwd ymm (no VNNI",
    }
    if fusion.integer_kernels in forms:
        line += (
            f"\n  on {forms[fusion.integer_kernels]}, packed weights): {len(fusion.vnni_packed)} of "
            f"{len(fusion.integer_ops)}"
        )
        if fusion.integer_kernels == "amx":
            line += f", of which on AMX tiles (tdpbusd): {len(fusion.amx_matmuls)} matmuls"
        if fusion.integer_kernels in ("avx2", "avx512"):
            seven = len(fusion.seven_bit_packed)
            line += (
                f", of which {seven} over 7-bit weights on vpmaddubsw, {len(fusion.vnni_packed) - seven} on "
                "exact int16 products (vpmaddwd)"
            )
        line += "".join(f"\n  plain integer kernel: {why}" for why in fusion.vnni_unpacked)
    elif fusion.integer_kernels == "plain":
        line += "\n  integer kernels: plain tiled loops (this CPU has no vector integer dot product)"
    if fusion.reduced_ops:
        # Under as-is and int8, the bf16 operands are the model's own rounding (operators returned to bf16).
        low = fusion.precision if fusion.precision in ("bf16", "fp16") else "bf16"
        line += (
            f"\nprecision {fusion.precision}: {len(fusion.reduced_ops)} matmuls/convolutions on "
            f"{low} operands (fp32 accumulation), {fusion.precision_compute}: {fusion.precision_note}"
        )
    elif fusion.precision != "as-is":
        line += f"\nprecision {fusion.precision}: no float matmul or convolution to reduce"
    if fusion.precision_choice:
        line += f"\n  {fusion.precision_choice}"
    line += "".join(f"\n  pass left out: {note}" for note in fusion.skipped_passes)
    return line


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
            _log(name)

    def planned(self, tasks: list[Task], fusion: FusionSummary, trials_total: int) -> None:
        _log(fusion_line(fusion))
        warm = sum(1 for t in tasks if t.best_latency_us is not None)
        if warm:
            _log(f"{warm}/{len(tasks)} tasks start warm from records of earlier runs on this target")
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


def _log(message: str) -> None:
    """A timestamped progress line: rich's log on a terminal; a plain line elsewhere (rich pads a log line
    to the console's width)."""
    if console.is_terminal:
        console.log(message)
    else:
        console.print(f"[{datetime.now().strftime('%H:%M:%S')}] {message}", highlight=False, markup=False)


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


def print_accuracy(report: AccuracyReport | None) -> None:
    """A quantized or reduced-precision job's outputs against the reference: per output, steps off (or the
    largest difference), share beyond one step, norm-wise relative error, cosine."""
    if report is None:
        return
    allowed = (
        f" (relative error allowed: {report.tolerance:.3g})"
        if report.tolerance is not None
        else f" (steps allowed: {report.allowed_steps:g}, one per quantized layer in a chain)"
    )
    console.print(
        f"accuracy against {report.reference} over {report.inputs} seeded inputs{allowed}:", highlight=False
    )
    for o in report.outputs:
        off = f"up to {o.max_steps:.2f} steps" if o.max_steps is not None else f"max |diff| {o.max_abs:.3g}"
        beyond = f", {o.beyond_one_step:.2%} beyond one step" if o.beyond_one_step is not None else ""
        relative = f", relative error {o.relative_error:.3g}" if o.relative_error is not None else ""
        top1 = (
            f", top-1 agrees with {report.float_model} on {o.top1_agreement:.1%} of rows"
            if o.top1_agreement is not None
            else ""
        )
        console.print(f"  {o.name}: {off}{beyond}{relative}, cosine {o.cosine:.6f}{top1}", highlight=False)
    if report.quantization is not None:
        print_quantization(report.quantization)


def print_quantization(q: QuantizationReport) -> None:
    """How Kiln quantized a float model (precision int8): samples, budget, the metric before and after the
    accuracy control, the operators it returned to float."""
    budget = q.budget
    held = "held" if q.within_budget else "NOT held (every operator returned to float32 and still beyond it)"
    console.print(
        f"int8 quantization ({q.weight_bits}-bit weights{', float core outputs' if q.float_outputs else ''}, "
        f"{q.method} calibration on {q.samples}): budget top-1 changed <= "
        f"{budget.max_top1_changed:.1%}, relative error <= {budget.max_relative_error:.3g}: {held}",
        highlight=False,
    )
    if q.synthetic:
        console.print(
            "  note: no calibration file was given; the ranges and the budget come from seeded synthetic "
            "inputs, which need not resemble the model's real inputs (give --calibration)",
            highlight=False,
        )
    console.print(f"  all int8: {q.before.describe()}", highlight=False)
    ints = sum(1 for p in q.precision.values() if p == "int8")
    console.print(
        f"  as compiled: {q.after.describe()}; {ints} of {len(q.precision)} convolutions/matmuls in int8",
        highlight=False,
    )
    for node in q.returned:
        console.print(f"  returned to {q.returned_precision}: {node}", highlight=False)
    for node in q.returned_for_speed:
        console.print(f"  returned to {q.returned_precision}, no faster in int8: {node}", highlight=False)
    if q.speeds:
        faster = sum(1 for speed in q.speeds if speed.chosen == "int8")
        console.print(
            f"  timed alone: {faster} of {len(q.speeds)} operators faster in int8 than in "
            f"{q.speeds[0].other}",
            highlight=False,
        )
    if q.speed_note:
        console.print(f"  {q.speed_note}", highlight=False)


def print_tuning_time(job: Job) -> None:
    """How long the job has tuned, against its time budget when it has one."""
    now = datetime.now(timezone.utc)
    elapsed = job.tuning_elapsed_s(now)
    if elapsed or job.spec.time_budget_s is not None:
        budget = job.spec.time_budget_s
        of = f" of a {format_duration(budget)} budget" if budget is not None else ""
        console.print(f"{tuning_time_line(elapsed, job.tuning_remaining_s(now))}{of}", highlight=False)


def print_outcome(job: Job, tasks: list[Task] | None = None) -> None:
    """A finished job's tuned latency against the peer it measured (onnxruntime), then untuned TVM; and why
    it measured fewer trials than asked, if it did."""
    if tasks is not None:
        note = trials_shortfall(job, tasks)
        if note:
            console.print(f"note: {note}", highlight=False)
    if job.tuned_latency_ms is None:
        return
    against = []
    if job.peer is not None and job.peer_speedup:
        ms = job.reference_latency_ms[job.peer]
        against.append(f"{_versus(job.peer_speedup)} {job.peer} ({ms:.3f} ms)")
    if job.speedup:
        against.append(f"{_versus(job.speedup)} untuned TVM ({job.baseline_latency_ms:.3f} ms)")
    console.print(f"Kiln tuned {job.tuned_latency_ms:.3f} ms: [bold]{'; '.join(against)}[/]", highlight=False)


def latency_over_time_table(job: Job, estimates: list[tuple[float, float | None]]) -> Table | None:
    """The model's estimated latency after each stretch of measuring (Σ calls x best kernel so far), against
    the peer the job measured; None before the first trial."""
    if not estimates:
        return None
    peer_ms = job.reference_latency_ms.get(job.peer) if job.peer else None
    table = Table(title="latency over tuning time (estimated: Σ calls x best kernel so far)")
    table.add_column("measuring for")
    table.add_column("Kiln ms", justify="right")
    if peer_ms:
        table.add_column(f"{job.peer} ms / Kiln ms", justify="right")
    for seconds, estimate_us in estimates:
        row = [
            format_duration(seconds) if seconds else "first trial",
            fmt(estimate_us / 1e3 if estimate_us else None, ".3f"),
        ]
        if peer_ms:
            row.append(fmt(peer_ms / (estimate_us / 1e3) if estimate_us else None, ".2f"))
        table.add_row(*row)
    return table


def _versus(ratio: float) -> str:
    return f"{ratio:.2f}x faster than" if ratio >= 1 else f"{1 / ratio:.2f}x slower than"


def _kib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


def print_polyhedral(title: str, report: dict[str, Any]) -> None:
    """A task's polyhedral analysis (the JSON of the API's polyhedral routes), as tables."""
    console.rule(f"[bold]{title}")
    if "error" in report:
        console.print(f"[yellow]no polyhedral model: {escape(report['error'])}")
        return
    # isl's notation is full of brackets, which rich would take for markup.
    console.print(f"domain: {escape(report['domain'])}")
    for line in report["inexact"]:
        console.print(f"[yellow]inexact:[/] {escape(line)}")
    if report.get("fallback"):
        console.print(f"[yellow]{escape(report['fallback'])}")
    for s in report["statements"]:
        console.print(f"{escape(s['name'])} ({s['isl_name']}) dependences: {escape(s['dependence_summary'])}")
    loops = Table(title="loops: what the dependences allow", title_justify="left")
    for col in (
        "statement",
        "loop",
        "extent",
        "kind",
        "parallel",
        "band",
        "permutable",
        "reduction",
        "vector",
    ):
        loops.add_column(col, justify="right" if col in ("extent", "band") else "left")
    yes = {True: "yes", False: "-"}
    for loop in report["loops"]:
        loops.add_row(
            escape(loop["statement"]),
            escape(loop["loop"]),
            str(loop["extent"]),
            loop["kind"],
            yes[loop["parallel"]],
            str(loop["band"]),
            yes[loop["permutable"]],
            "rfactor" if loop["reduction"] else "-",
            yes[loop["vectorizable"]],
        )
    console.print(loops)
    deps = Table(title="dependences (memory-based)", title_justify="left")
    for col in ("kind", "source -> sink", "tensor", "distance", "carried by"):
        deps.add_column(col)
    for d in report["dependences"]:
        deps.add_row(
            d["kind"],
            escape(f"{d['source']} -> {d['sink']}"),
            escape(d["tensor"]),
            d["distance"] or "-",
            escape(", ".join(d["carried_by"])) or "textual order",
        )
    console.print(deps)
    for f in report["fusion"]:
        shared = f" (under {', '.join(f['shared_loops'])})" if f["shared_loops"] else ""
        console.print(
            escape(
                f"fusion: {f['producer']} can be computed at depth {f['depth']} of {f['consumer']}{shared}"
            )
        )
    caches = report["caches"]
    sizes = ", ".join(f"{c['name']} {_kib(c['bytes'])}" for c in caches["levels"]) or "unknown: no pruning"
    console.print(f"caches ({caches['source']}): {sizes}")
    best = report.get("best_schedule")
    if best:
        for tiling in best["tilings"]:
            cuts = Table(
                title=f"best schedule's tiles of {tiling['statement']} ({tiling['structure']})",
                title_justify="left",
            )
            for col in ("cut", "tile", "bytes", "held against"):
                cuts.add_column(col)
            for cut in tiling["cuts"]:
                against = f"{cut['cache_level']} {_kib(cut['cache_bytes'])}" if cut["cache_level"] else "-"
                cuts.add_row(cut["cut"], "x".join(map(str, cut["tile"])), _kib(cut["total_bytes"]), against)
            console.print(cuts)
            inside = tiling["inside_feasible_set"]
            console.print(
                f"inside the predicted-feasible set: {'unknown' if inside is None else yes[inside]}"
            )
        if best.get("note"):
            console.print(escape(best["note"]))
    search = report.get("search")
    if search and search.get("examined") is not None:
        console.print(
            f"search ({search['space']}): {search['rejected']} of {search['examined']} candidates rejected, "
            f"{search['passed_through']} passed through, {search['seeds']} seeds measured"
        )
