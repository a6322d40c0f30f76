"""Tuning commands: ``tune`` (here, now), ``submit`` (queue for the workers), ``tasks`` (preview) and
``cancel``."""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from cli.app import app, current_settings, open_store
from cli.durations import parse_duration
from cli.render import (
    RichListener,
    console,
    err_console,
    fusion_line,
    print_accuracy,
    print_code,
    print_latency_report,
    print_outcome,
    print_polyhedral,
    print_tuning_time,
    task_table,
)
from tuner.entities import DEFAULT_TRIALS, MAX_JOB_WORKERS, Job, JobSpec, ModelInfo, RunnerSpec, trial_budget
from tuner.entities.job import check_cost_model, check_precision, check_quantization_fields
from tuner.entities.quantization import AccuracyBudget
from tuner.errors import InvalidSpec, KilnError

if TYPE_CHECKING:
    from tuner.store.sql import Store

TrialsOpt = Annotated[
    int | None,
    typer.Option(
        help=f"Total measured trials over all tasks (0: compile from stored records); default "
        f"{DEFAULT_TRIALS}, or no limit with --time",
        show_default=False,
    ),
]
TimeOpt = Annotated[
    str | None,
    typer.Option(
        "--time",
        help="Tuning time budget, e.g. 20s, 30m, 1h30m (then compile and verify); alone or with --trials",
    ),
]
TargetOpt = Annotated[str, typer.Option("--target", help="'host' (this CPU) or a TVM target as JSON")]
PerTaskOpt = Annotated[
    int | None,
    typer.Option(
        "--per-task",
        help="At most this many searched trials per task (a task that a default schedule serves "
        "measures that schedule once more, before the search)",
    ),
]
SeedOpt = Annotated[int, typer.Option(help="Search seed")]
CostModelOpt = Annotated[str, typer.Option(help="xgb or random")]
NameOpt = Annotated[str | None, typer.Option(help="Model name (default: file name)")]
OwnerOpt = Annotated[
    str,
    typer.Option(
        "--owner",
        help="API token name that owns the model and the job, so that token's user sees them over the API "
        "(default: no owner; seen over the API only while it has no tokens)",
    ),
]
SpaceOpt = Annotated[
    str | None,
    typer.Option(
        "--space",
        help="Schedule space: cpu (MetaSchedule's rules) or cpu-poly (shaped by the polyhedral analysis) "
        "on CPUs, gpu on CUDA (default: the target's)",
    ),
]
PrecisionOpt = Annotated[
    str,
    typer.Option(
        "--precision",
        help="Float models: as-is, auto, bf16, fp16 or int8. bf16/fp16: matmuls and convolutions on "
        "low-precision operands, fp32 accumulation, verified against the float32 model; auto: bf16 where "
        "the CPU has bf16 instructions and the outputs stay within the bf16 tolerance, else as-is; int8: the "
        "float ONNX model quantized (per-channel weights, activations calibrated on --calibration) within "
        "the accuracy budget, the operators that break it returned to bf16 where the CPU multiplies it "
        "natively, else float32. Default auto: with --calibration, int8 for each operator that runs "
        "faster in it (each timed alone on this CPU), else bf16 or as-is as above",
    ),
]
CalibrationOpt = Annotated[
    Path | None,
    typer.Option(
        "--calibration",
        help="precision int8: an .npz of the model's inputs, one array per input named after it, samples "
        "stacked along the first axis ([N, 3, 224, 224] for an input [1, 3, 224, 224]); split into "
        "calibration and validation samples (default: seeded synthetic inputs)",
        exists=True,
        dir_okay=False,
    ),
]
CalibrationMethodOpt = Annotated[
    str, typer.Option("--calibration-method", help="precision int8: minmax, percentile or entropy")
]
Top1Opt = Annotated[
    float | None,
    typer.Option(
        "--max-top1-changed",
        help="precision int8/auto: share of validation samples whose top-1 class (over steps: any step's) may "
        "change on class scores (default 0.01)",
    ),
]
RelativeErrorOpt = Annotated[
    float | None,
    typer.Option(
        "--max-relative-error",
        help="precision int8: norm-wise relative error allowed on any other output (default 0.05)",
    ),
]
FloatModelOpt = Annotated[
    Path | None,
    typer.Option(
        "--float-model",
        help="The float model a quantized (or reduced-precision) one came from: the accuracy report adds "
        "the share of rows whose top-1 agrees with it",
        exists=True,
        dir_okay=False,
    ),
]
ModelArg = Annotated[
    Path, typer.Argument(help="ONNX file or torch.export program (.pt2)", exists=True, dir_okay=False)
]
ShapeOpt = Annotated[
    list[str] | None,
    typer.Option("--input-shape", help="Shape of an input, e.g. x=1x3x224x224 (repeatable)"),
]
ValueOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--input-value",
        help="Bind an ONNX input to a value (JSON), a constant of the compiled model: the axes, sizes, "
        "scales, shape or k a graph takes as an input, e.g. axes=[0,1] (repeatable)",
    ),
]


@app.command()
def tune(
    model: ModelArg,
    target: TargetOpt = "host",
    trials: TrialsOpt = None,
    time: TimeOpt = None,
    per_task: PerTaskOpt = None,
    input_shape: ShapeOpt = None,
    input_value: ValueOpt = None,
    seed: SeedOpt = 0,
    cost_model: CostModelOpt = "xgb",
    space: SpaceOpt = None,
    precision: PrecisionOpt = "auto",
    float_model: FloatModelOpt = None,
    calibration: CalibrationOpt = None,
    calibration_method: CalibrationMethodOpt = "minmax",
    max_top1_changed: Top1Opt = None,
    max_relative_error: RelativeErrorOpt = None,
    name: NameOpt = None,
    owner: OwnerOpt = "",
    out: Annotated[Path | None, typer.Option(help="Directory to copy the artifact (.tar.gz) into")] = None,
) -> None:
    """Tune a model and write a compiled, verified artifact."""
    settings = current_settings()
    spec = _job_spec(
        target,
        trials=trials,
        time=time,
        per_task=per_task,
        seed=seed,
        input_shape=input_shape,
        cost_model=cost_model,
        runner=RunnerSpec(),
        space=space,
        precision=precision,
        quantization=(calibration_method, max_top1_changed, max_relative_error),
    )
    store = open_store()
    info, job = _queue(
        store,
        model,
        spec,
        name=name,
        owner=owner,
        float_model=float_model,
        input_value=input_value,
        calibration=calibration,
    )
    from tuner.isolation.fatal_signals import report_fatal_signals
    from tuner.jobs.pipeline import run_job
    from tuner.model_registry import artifact_file_name

    console.print(
        f"model [bold]{info.name}[/] ({info.sha256[:12]}), job [bold]{job.id}[/] on {job.target_key}"
    )
    report_fatal_signals(sys.stderr)  # a crashing kernel ends `kiln tune` instead of hanging it
    with RichListener() as listener:

        def aborted(reason: str) -> None:  # from the job's guard, just before this process ends
            listener.progress.stop()
            err_console.print(f"[bold red]job {job.id} stopped:[/] {reason}")

        result = run_job(store, settings, job.id, listener=listener, on_abort=aborted)
    console.print(task_table(result.tasks, "tasks"))
    print_tuning_time(result.job)
    print_outcome(result.job, result.tasks)
    print_latency_report(result.latency.report)
    print_accuracy(result.job.accuracy)
    if result.artifact is not None:
        path = Path(result.artifact.path)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            dest = out / artifact_file_name(info.name, result.job.id)
            shutil.copyfile(path, dest)
            path = dest
        console.print(f"artifact: [bold]{path}[/] (sha256 {result.artifact.sha256[:12]})")
        for check in result.comparisons:
            console.print(f"verified vs {check.reference}: max abs error {check.max_abs_error:.2e}")


@app.command()
def tasks(
    model: Annotated[Path, typer.Argument(help="ONNX file or .pt2 program", exists=True, dir_okay=False)],
    target: TargetOpt = "host",
    input_shape: ShapeOpt = None,
    input_value: ValueOpt = None,
    show_tir: Annotated[
        str | None, typer.Option(help="Print the unscheduled TIR of this task (name or #)")
    ] = None,
    poly: Annotated[
        bool,
        typer.Option(
            "--poly",
            help="Print each task's polyhedral analysis: domain, dependences, loop legality, fusion depths",
        ),
    ] = False,
) -> None:
    """Show the fused kernels (tuning tasks) of a model without tuning it."""
    from tuner.frontend import load_model, parse_input_shapes, parse_input_values
    from tuner.passes.plan import plan_graph
    from tuner.targets import resolve_target, to_tvm_target

    imported = load_model(
        model, parse_input_shapes(input_shape or []), input_values=parse_input_values(input_value or [])
    )
    settings = current_settings()
    plan = plan_graph(
        imported.mod,
        to_tvm_target(resolve_target(target)),
        settings.planning_options(),
    )
    table = Table(title=f"{model.name}: tuning tasks")
    for col in ("#", "task", "weight", "MFLOP", "workload hash"):
        table.add_column(col, justify="left" if col in ("task", "workload hash") else "right")
    for i, info in enumerate(plan.infos):
        table.add_row(str(i), info.name, str(info.weight), f"{info.flops / 1e6:.3f}", info.workload_hash)
    console.print(table)
    console.print(fusion_line(plan.fusion))
    if show_tir is not None:
        chosen = [i for i in plan.infos if i.name == show_tir or str(plan.infos.index(i)) == show_tir]
        if not chosen:
            raise KilnError(f"no task {show_tir!r}; tasks: {', '.join(i.name for i in plan.infos)}")
        print_code(chosen[0].tir)
    if poly:
        from schedules.poly.analysis import analyse_prim_func
        from tuner.jobs.measuring import measuring_caches
        from tuner.targets import is_host_cpu

        caches = measuring_caches(settings, is_host_cpu(resolve_target(target)))
        for i, (task, info) in enumerate(zip(plan.tasks, plan.infos, strict=True)):
            print_polyhedral(
                f"#{i} {info.name}", analyse_prim_func(task.dispatched[0]["main"], caches).to_json()
            )


@app.command()
def submit(
    model: ModelArg,
    target: TargetOpt = "host",
    trials: TrialsOpt = None,
    time: TimeOpt = None,
    per_task: PerTaskOpt = None,
    input_shape: ShapeOpt = None,
    input_value: ValueOpt = None,
    seed: SeedOpt = 0,
    cost_model: CostModelOpt = "xgb",
    space: SpaceOpt = None,
    precision: PrecisionOpt = "auto",
    float_model: FloatModelOpt = None,
    calibration: CalibrationOpt = None,
    calibration_method: CalibrationMethodOpt = "minmax",
    max_top1_changed: Top1Opt = None,
    max_relative_error: RelativeErrorOpt = None,
    rpc_tracker: Annotated[str | None, typer.Option(help="Measure on RPC devices: tracker host:port")] = None,
    rpc_key: Annotated[str | None, typer.Option(help="Device key at the RPC tracker")] = None,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            max=MAX_JOB_WORKERS,
            help="Split the job's tasks over this many workers (idle workers tune a group each)",
        ),
    ] = 1,
    name: NameOpt = None,
    owner: OwnerOpt = "",
) -> None:
    """Queue a tuning job for the workers (`kiln serve` or `kiln worker`) and print its id."""
    runner = RunnerSpec()
    if rpc_tracker or rpc_key:
        runner = RunnerSpec("rpc", rpc_tracker or current_settings().rpc_tracker or "", rpc_key or "")
    spec = _job_spec(
        target,
        trials=trials,
        time=time,
        per_task=per_task,
        seed=seed,
        input_shape=input_shape,
        cost_model=cost_model,
        runner=runner,
        space=space,
        precision=precision,
        quantization=(calibration_method, max_top1_changed, max_relative_error),
    )
    spec = dataclasses.replace(spec, workers=workers)
    info, job = _queue(
        open_store(),
        model,
        spec,
        name=name,
        owner=owner,
        float_model=float_model,
        input_value=input_value,
        calibration=calibration,
    )
    console.print(f"queued job [bold]{job.id}[/] for model {info.name} on {job.target_key}")


def _job_spec(
    target: str,
    *,
    trials: int | None,
    time: str | None,
    per_task: int | None,
    seed: int,
    input_shape: list[str] | None,
    cost_model: str,
    runner: RunnerSpec,
    space: str | None = None,
    precision: str = "as-is",
    quantization: tuple[str, float | None, float | None] = ("minmax", None, None),
) -> JobSpec:
    """The job the tune and submit options ask for, on a model not yet stored; a cost model or precision
    Kiln does not have is refused here, before TVM loads (the rest is checked by ``_queue``).
    ``quantization``: the int8 policy's calibration method and budget (None: the default's)."""
    from tuner.frontend import parse_input_shapes

    check_cost_model(cost_model)
    check_precision(precision)
    method, top1, relative = quantization
    budget = AccuracyBudget()
    budget = AccuracyBudget(
        budget.max_top1_changed if top1 is None else top1,
        budget.max_relative_error if relative is None else relative,
    )
    check_quantization_fields(method, budget)
    time_budget_s = None if time is None else parse_duration(time)
    return JobSpec(
        model_id="",
        target=target,  # type: ignore[arg-type]  # resolved by _queue
        trials=trial_budget(trials, time_budget_s),
        time_budget_s=time_budget_s,
        max_trials_per_task=per_task,
        seed=seed,
        input_shapes=parse_input_shapes(input_shape or []),
        runner=runner,
        cost_model=cost_model,
        space=space,
        precision=precision,
        calibration_method=method,
        accuracy_budget=budget,
    )


def _queue(
    store: Store,
    model: Path,
    spec: JobSpec,
    *,
    name: str | None,
    owner: str,
    float_model: Path | None = None,
    input_value: list[str] | None = None,
    calibration: Path | None = None,
) -> tuple[ModelInfo, Job]:
    """Check ``spec`` (all but its model), import and store ``model`` (and the ``float_model`` it came
    from, whose top-1 the accuracy report compares with) with the ``--input-value`` bindings, and queue
    the job on it.

    A bad spec fails before the model is imported, so nothing is stored for it; an unknown owner before
    TVM loads (seconds), as :func:`_job_spec` refuses a bad cost model or precision. TVM loads only for
    what this machine has not seen: a target not checked here before (:class:`KnownTargets`), a model
    not stored as it is (:func:`~tuner.model_registry.stored_as_is`).
    """
    _check_owner(store, owner)
    from tuner.frontend import parse_input_values
    from tuner.jobs.known_targets import KnownTargets
    from tuner.jobs.spec_fields import check_spec_fields
    from tuner.jobs.submission import submit_job
    from tuner.model_registry import register_model

    settings = current_settings()
    check_spec_fields(spec)
    known = KnownTargets(settings.data_dir)
    checked = known.get(spec)
    if checked is None:
        from tuner.jobs.target_check import check_target

        checked = check_target(spec)
        known.put(spec, checked)
    shapes = dict(spec.input_shapes)
    values = parse_input_values(input_value or [])
    info, _ = register_model(
        store, settings, model, name=name, input_shapes=shapes, owner=owner, input_values=values
    )
    if float_model is not None:
        floats, _ = register_model(
            store, settings, float_model, input_shapes=shapes, owner=owner, input_values=values
        )
        spec = dataclasses.replace(spec, float_model_id=floats.id)
    if calibration is not None:
        from tuner.quantization.calibration_files import save_calibration

        stored = save_calibration(settings, calibration.read_bytes())
        spec = dataclasses.replace(spec, calibration_id=stored.id)
    return info, submit_job(
        store, dataclasses.replace(spec, model_id=info.id), owner, settings, checked=checked
    )


def _check_owner(store: Store, owner: str) -> None:
    """An owner must be the name of an API token (in the database or KILN_API_TOKENS), or nobody."""
    from tuner.tokens import parse_tokens

    if not owner:
        return
    known = {token.name for token in store.list_tokens()} | set(
        parse_tokens(current_settings().api_tokens).values()
    )
    if owner not in known:
        raise InvalidSpec(
            f"no API token is named {owner!r}; create one with `kiln token create {owner}` "
            "(or list them with `kiln token list`)"
        )


@app.command()
def cancel(job_id: Annotated[str, typer.Argument(help="Job id")]) -> None:
    """Cancel a job: a queued one at once; a running one stops within seconds, keeping its records."""
    job = open_store().request_cancel(job_id)
    console.print(
        f"job {job.id}: {'cancel requested' if job.status.value == 'running' else job.status.value}"
    )
