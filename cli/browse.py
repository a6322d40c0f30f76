"""Browsing commands: ``jobs``, ``status``, ``ir``, ``profile``, ``models`` and ``export`` read what the store holds."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from cli.app import app, current_settings, open_store
from cli.render import (
    console,
    fmt,
    ir_change,
    ir_table,
    latency_over_time_table,
    mix_line,
    print_accuracy,
    print_code,
    print_latency_report,
    print_outcome,
    print_profile,
    print_tuning_time,
    task_table,
)
from tuner.errors import KilnError, NotFound
from tuner.views.curves import estimates_at, job_curve


@app.command()
def jobs(limit: Annotated[int, typer.Option(help="How many, newest first")] = 20) -> None:
    """List tuning jobs."""
    store = open_store()
    table = Table(title="jobs")
    for col in ("id", "model", "target", "status", "trials", "untuned ms", "tuned ms", "speedup", "created"):
        table.add_column(col)
    for job in store.list_jobs(limit=limit):
        model = store.get_model(job.spec.model_id)
        progress = store.job_progress(job.id)
        table.add_row(
            job.id,
            model.name,
            job.target_key,
            job.status.value,
            f"{progress['trials_done']}/{'-' if job.spec.trials is None else job.spec.trials}",
            fmt(job.baseline_latency_ms, ".3f"),
            fmt(job.tuned_latency_ms, ".3f"),
            fmt(job.speedup, ".1f"),
            job.created_at.strftime("%Y-%m-%d %H:%M"),
        )
    console.print(table)


@app.command()
def status(job_id: Annotated[str, typer.Argument(help="Job id")]) -> None:
    """Show one job: status, per-task results, latency."""
    store = open_store()
    job = store.get_job(job_id)
    console.print(f"job {job.id}: [bold]{job.status.value}[/] on {job.target_key}")
    if job.error:
        console.print(f"[red]error:[/] {job.error}")
    print_tuning_time(job)
    tasks = store.list_tasks(job.id)
    console.print(task_table(tasks, "tasks"))
    curve = latency_over_time_table(
        job, estimates_at(job_curve(store, job, current_settings().record_scope(job.owner)))
    )
    if curve is not None:
        console.print(curve)
    print_outcome(job, tasks)
    print_latency_report(job.latency_report)
    print_accuracy(job.accuracy)


@app.command()
def ir(
    job_id: Annotated[str, typer.Argument(help="Job id")],
    level: Annotated[
        str | None,
        typer.Argument(help="A level's position or pass name: print its program (default: list them)"),
    ] = None,
    asm: Annotated[
        str | None,
        typer.Option(help="A task (its # in `kiln status`, or its name): print its kernel's assembly"),
    ] = None,
) -> None:
    """Show a job's lowering: the program as imported, then after each graph pass with what it changed; or
    one level's program as TVMScript; or one kernel's assembly with its instruction mix."""
    from tuner.views.lowering import ir_level, ir_levels

    store = open_store()
    job = store.get_job(job_id)
    if asm is not None:
        tasks = store.list_tasks(job.id)
        task = next((t for i, t in enumerate(tasks) if asm in (str(i), t.name)), None)
        if task is None:
            raise NotFound(f"job '{job.id}' has no task {asm!r} (give its # in `kiln status` or its name)")
        kernel = store.get_task_assembly(task.id)
        console.print(f"# {kernel.name}: {mix_line(kernel.mix)}", markup=False, highlight=False)
        print_code(kernel.text)
        return
    if level is None:
        console.print(ir_table(ir_levels(store, job), job.id))
        return
    found = ir_level(store, job, level)
    console.print(
        f"# level {found.position}: {found.name}: {ir_change(found)}", markup=False, highlight=False
    )
    print_code(found.text)


_PROFILE_ORDER = {
    "time": lambda k: -k.total_us,
    "name": lambda k: k.name,
    "gflops": lambda k: -(k.gflops or 0.0),
    "onnxruntime": lambda k: -(k.onnxruntime_us or 0.0),
}


@app.command()
def profile(
    job_id: Annotated[str, typer.Argument(help="Job id")],
    sort: Annotated[str, typer.Option(help=f"Order of the kernels: {', '.join(_PROFILE_ORDER)}")] = "time",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")] = False,
) -> None:
    """Show where a job's tuned model spends its time, kernel by kernel: calls, time, share, GFLOP/s,
    bytes moved, its place under this machine's roofline, and onnxruntime's matched nodes beside it."""
    if sort not in _PROFILE_ORDER:
        raise typer.BadParameter(f"--sort must be one of {', '.join(_PROFILE_ORDER)}, not {sort!r}")
    from tuner.timing.profile_check import job_profile

    store = open_store()
    job = store.get_job(job_id)
    found, check = job_profile(store, job)
    if as_json:
        print(json.dumps({**found.as_dict(), "warnings": check.warnings}, indent=2))
        return
    ordered = dataclasses.replace(found, kernels=tuple(sorted(found.kernels, key=_PROFILE_ORDER[sort])))
    print_profile(ordered, job.id, check.warnings)


@app.command()
def models() -> None:
    """List stored models."""
    store = open_store()
    table = Table(title="models")
    for col in ("id", "name", "format", "sha256", "MB", "inputs"):
        table.add_column(col)
    for m in store.list_models():
        inputs = ", ".join(f"{t.name}{list(t.shape)}:{t.dtype}" for t in m.signature.inputs)
        table.add_row(m.id, m.name, m.format.value, m.sha256[:12], f"{m.size_bytes / 1e6:.2f}", inputs)
    console.print(table)


@app.command()
def export(
    job_id: Annotated[str, typer.Argument(help="Job id")],
    out: Annotated[Path, typer.Option(help="Destination directory")] = Path("."),
    what: Annotated[
        str, typer.Option(help="artifact (the .tar.gz) or records (MetaSchedule JSON database)")
    ] = "artifact",
) -> None:
    """Export a past job's artifact, or its tuning records as a MetaSchedule JSON database."""
    store = open_store()
    job = store.get_job(job_id)
    out.mkdir(parents=True, exist_ok=True)
    if what == "artifact":
        from tuner.model_registry import artifact_file_name

        src = Path(store.get_artifact(job.id).path)
        dest = out / artifact_file_name(store.get_model(job.spec.model_id).name, job.id)
        shutil.copyfile(src, dest)
        console.print(f"artifact: {dest}")
    elif what == "records":
        from tuner.jobs.artifact import write_records, write_records_intrinsics

        rows = store.job_records(job, current_settings().record_scope(job.owner))
        count = write_records(rows, out, per_workload=sys.maxsize)
        console.print(f"{count} records -> {out}/database_workload.json, {out}/database_tuning_record.json")
        used = write_records_intrinsics(out, out)
        if used:
            console.print(
                f"{out}/kiln_intrinsics/ registers the tensor intrinsics they use ({', '.join(sorted(used))}): "
                "import it before reading them with plain TVM"
            )
    else:
        raise KilnError(f"--what must be 'artifact' or 'records', got {what!r}")
