"""The ``kiln`` command line: tune a model, inspect its tasks, list jobs, export results, manage the DB."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tuner.entities import FusionSummary, Job, JobSpec, ModelInfo, Task
from tuner.errors import InvalidSpec, KilnError, TuningFailed
from tuner.settings import Settings

if TYPE_CHECKING:
    from tuner.store.sql import Store

app = typer.Typer(
    name="kiln",
    help="Kiln: auto-tune deep-learning models with Apache TVM MetaSchedule.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
db_app = typer.Typer(help="Database schema management.", no_args_is_help=True)
app.add_typer(db_app, name="db")
rpc_app = typer.Typer(
    help="Remote measurement through TVM's RPC tracker: run a tracker or a device server, list devices.",
    no_args_is_help=True,
)
app.add_typer(rpc_app, name="rpc")
token_app = typer.Typer(help="API tokens for the REST API (multi-user).", no_args_is_help=True)
app.add_typer(token_app, name="token")

console = Console()
err_console = Console(stderr=True)

TargetOpt = Annotated[str, typer.Option("--target", help="'host' (this CPU) or a TVM target as JSON")]
PerTaskOpt = Annotated[int | None, typer.Option("--per-task", help="At most this many trials per task")]
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
ModelArg = Annotated[
    Path, typer.Argument(help="ONNX file or torch.export program (.pt2)", exists=True, dir_okay=False)
]
ShapeOpt = Annotated[
    list[str] | None,
    typer.Option("--input-shape", help="Shape of an input, e.g. x=1x3x224x224 (repeatable)"),
]


class _State:
    settings: Settings = Settings()


def _store() -> Any:
    return _store_for(_State.settings)


def _store_for(settings: Settings) -> Any:
    from tuner.store.sql import Store

    store = Store.from_settings(settings)
    store.ensure_schema(auto_create=True)
    return store


@app.callback()
def _global(
    data_dir: Annotated[Path | None, typer.Option(help="Data directory (env KILN_DATA_DIR)")] = None,
    database_url: Annotated[str | None, typer.Option(help="SQLAlchemy URL (env KILN_DATABASE_URL)")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log what Kiln does")] = False,
) -> None:
    """Global options; every one also reads its KILN_* environment variable."""
    overrides: dict[str, Any] = {}
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    if database_url is not None:
        overrides["database_url"] = database_url
    _State.settings = Settings(**overrides)
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _fmt(value: float | None, spec: str = ".1f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _task_table(tasks: list[Task], title: str) -> Table:
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
            _fmt(t.best_latency_us),
            _fmt(gflops(t.flops, t.best_latency_us)),
        )
    return table


def _fusion_line(fusion: FusionSummary) -> str:
    return (
        f"graph: {fusion.operators_before} Relax operators -> {fusion.kernels_after} fused kernels "
        f"({fusion.distinct_tasks} distinct tuning tasks)"
    )


class _RichListener:
    """Draws a job's progress: a stage line and a trials bar with the current best per task."""

    def __init__(self) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[detail]}"),
            console=console,
            transient=False,
        )
        self.bar: Any = None

    def __enter__(self) -> _RichListener:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def stage(self, name: str) -> None:
        if name != "tuning":
            console.log(name)

    def planned(self, tasks: list[Task], fusion: FusionSummary, trials_total: int) -> None:
        console.log(_fusion_line(fusion))
        warm = sum(1 for t in tasks if t.best_latency_us is not None)
        if warm:
            console.log(f"{warm}/{len(tasks)} tasks start warm from records of earlier runs on this target")
        if trials_total:
            self.bar = self.progress.add_task("tuning", total=trials_total, detail="")

    def measured(self, task: Task, trials_done: int, trials_total: int) -> None:
        if self.bar is not None:
            detail = f"{task.name[:40]}: best {_fmt(task.best_latency_us)} µs"
            self.progress.update(self.bar, completed=min(trials_done, trials_total), detail=detail)


@app.command()
def tune(
    model: ModelArg,
    target: TargetOpt = "host",
    trials: Annotated[
        int, typer.Option(help="Total measured trials over all tasks (0: compile from stored records)")
    ] = 64,
    per_task: PerTaskOpt = None,
    input_shape: ShapeOpt = None,
    seed: SeedOpt = 0,
    cost_model: CostModelOpt = "xgb",
    name: NameOpt = None,
    owner: OwnerOpt = "",
    out: Annotated[Path | None, typer.Option(help="Directory to copy the artifact (.tar.gz) into")] = None,
) -> None:
    """Tune a model and write a compiled, verified artifact."""
    from tuner.fatal_signals import report_fatal_signals
    from tuner.job import run_job

    settings = _State.settings
    spec = _job_spec(target, trials, per_task, seed, input_shape, cost_model, {"kind": "local"})
    store = _store()
    info, job = _queue(store, model, spec, name, owner)
    console.print(
        f"model [bold]{info.name}[/] ({info.sha256[:12]}), job [bold]{job.id}[/] on {job.target_key}"
    )
    report_fatal_signals(sys.stderr)  # a crashing kernel ends `kiln tune` instead of hanging it
    with _RichListener() as listener:
        result = run_job(store, settings, job.id, listener=listener)
    console.print(_task_table(result.tasks, "tasks"))
    _print_outcome(result.job)
    for peer, ms in result.latency.references_ms.items():
        if result.job.tuned_latency_ms:
            ratio = ms / result.job.tuned_latency_ms
            console.print(f"{peer} {ms:.3f} ms (Kiln is {ratio:.2f}x as fast)")
    if result.artifact is not None:
        path = Path(result.artifact.path)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            dest = out / f"{info.name}.tar.gz"
            shutil.copyfile(path, dest)
            path = dest
        console.print(f"artifact: [bold]{path}[/] (sha256 {result.artifact.sha256[:12]})")
        for check in result.comparisons:
            console.print(f"verified vs {check.reference}: max abs error {check.max_abs_error:.2e}")


def _print_outcome(job: Job) -> None:
    if job.baseline_latency_ms is not None and job.tuned_latency_ms is not None:
        console.print(
            f"untuned TVM {job.baseline_latency_ms:.3f} ms -> tuned {job.tuned_latency_ms:.3f} ms: "
            f"[bold green]{job.speedup:.1f}x faster[/]"
        )


@app.command()
def tasks(
    model: Annotated[Path, typer.Argument(help="ONNX file or .pt2 program", exists=True, dir_okay=False)],
    target: TargetOpt = "host",
    input_shape: ShapeOpt = None,
    show_tir: Annotated[
        str | None, typer.Option(help="Print the unscheduled TIR of this task (name or #)")
    ] = None,
) -> None:
    """Show the fused kernels (tuning tasks) of a model without tuning it."""
    from tuner.frontend import load_model, parse_input_shapes
    from tuner.targets import resolve_target, to_tvm_target
    from tuner.tasks import plan_graph

    imported = load_model(model, parse_input_shapes(input_shape or []))
    settings = _State.settings
    plan = plan_graph(
        imported.mod, to_tvm_target(resolve_target(target)), settings.weight_prepack, settings.cpu_conv_layout
    )
    table = Table(title=f"{model.name}: tuning tasks")
    for col in ("#", "task", "weight", "MFLOP", "workload hash"):
        table.add_column(col, justify="left" if col in ("task", "workload hash") else "right")
    for i, info in enumerate(plan.infos):
        table.add_row(str(i), info.name, str(info.weight), f"{info.flops / 1e6:.3f}", info.workload_hash)
    console.print(table)
    console.print(_fusion_line(plan.fusion))
    if show_tir is not None:
        chosen = [i for i in plan.infos if i.name == show_tir or str(plan.infos.index(i)) == show_tir]
        if not chosen:
            raise KilnError(f"no task {show_tir!r}; tasks: {', '.join(i.name for i in plan.infos)}")
        console.print(chosen[0].tir)


@app.command()
def jobs(limit: Annotated[int, typer.Option(help="How many, newest first")] = 20) -> None:
    """List tuning jobs."""
    store = _store()
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
            f"{progress['trials_done']}/{job.spec.trials}",
            _fmt(job.baseline_latency_ms, ".3f"),
            _fmt(job.tuned_latency_ms, ".3f"),
            _fmt(job.speedup, ".1f"),
            job.created_at.strftime("%Y-%m-%d %H:%M"),
        )
    console.print(table)


@app.command()
def status(job_id: Annotated[str, typer.Argument(help="Job id")]) -> None:
    """Show one job: status, per-task results, latency."""
    store = _store()
    job = store.get_job(job_id)
    console.print(f"job {job.id}: [bold]{job.status.value}[/] on {job.target_key}")
    if job.error:
        console.print(f"[red]error:[/] {job.error}")
    console.print(_task_table(store.list_tasks(job.id), "tasks"))
    _print_outcome(job)


@app.command()
def models() -> None:
    """List stored models."""
    store = _store()
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
    store = _store()
    job = store.get_job(job_id)
    out.mkdir(parents=True, exist_ok=True)
    if what == "artifact":
        from tuner.job import artifact_path

        src = artifact_path(store, job.id)
        dest = out / src.name
        shutil.copyfile(src, dest)
        console.print(f"artifact: {dest}")
    elif what == "records":
        from tuner.artifact import write_records

        rows = store.job_records(job, _State.settings.record_scope(job.owner))
        count = write_records(rows, out, per_workload=sys.maxsize)
        console.print(f"{count} records -> {out}/database_workload.json, {out}/database_tuning_record.json")
    else:
        raise KilnError(f"--what must be 'artifact' or 'records', got {what!r}")


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Upgrade the database schema to this version of Kiln."""
    from tuner.store.sql import Store

    store = Store.from_settings(_State.settings)
    before = store.current_revision()
    store.upgrade()
    console.print(f"database {store}: {before or 'empty'} -> {store.current_revision()}")


@db_app.command("current")
def db_current() -> None:
    """Print the schema revision of the database and the one this Kiln needs."""
    from tuner.store.sql import Store

    store = Store.from_settings(_State.settings)
    console.print(json.dumps({"current": store.current_revision(), "head": store.head_revision()}))


RPCHostOpt = Annotated[
    str, typer.Option(help="Address to listen on (0.0.0.0: reachable from other machines)")
]


@rpc_app.command("tracker")
def rpc_tracker(
    host: RPCHostOpt = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port)")] = 9190,
) -> None:
    """Run a TVM RPC tracker in the foreground until Ctrl-C or SIGTERM."""
    from tuner.rpc.processes import run_until_stopped, start_tracker, stop_on_sigterm

    stop = stop_on_sigterm()
    tracker = start_tracker(host, port, silent=not logging.getLogger().isEnabledFor(logging.INFO))
    console.print(f"RPC tracker listening on [bold]{tracker.address}[/]; Ctrl-C stops it", highlight=False)
    run_until_stopped(tracker, stop=stop)
    console.print("RPC tracker stopped")


@rpc_app.command("server")
def rpc_server(
    tracker: Annotated[str, typer.Option(help="Tracker to register at, host:port")],
    key: Annotated[str, typer.Option(help="Device key that jobs' rpc runners ask for")],
    host: RPCHostOpt = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port)")] = 9090,
) -> None:
    """Run a TVM RPC server (a measurement device) registered at a tracker, until Ctrl-C or SIGTERM."""
    from tuner.rpc.processes import run_until_stopped, start_server, stop_on_sigterm

    timeout = _State.settings.rpc_timeout_s
    stop = stop_on_sigterm()
    server = start_server(
        tracker, key, host, port, silent=not logging.getLogger().isEnabledFor(logging.INFO), timeout_s=timeout
    )
    console.print(
        f"RPC server [bold]{key}[/] listening on {server.address}, registered at tracker {tracker}; "
        "Ctrl-C stops it",
        highlight=False,
    )
    run_until_stopped(server, tracker=tracker, key=key, timeout_s=timeout, stop=stop)
    console.print("RPC server stopped")


@rpc_app.command("devices")
def rpc_devices(
    tracker: Annotated[str | None, typer.Option(help="Tracker host:port (default: KILN_RPC_TRACKER)")] = None,
) -> None:
    """List the devices registered at an RPC tracker, by key."""
    from tuner.rpc.tracker import tracker_summary

    address = tracker or _State.settings.rpc_tracker
    if not address:
        raise InvalidSpec("no tracker given: pass --tracker HOST:PORT or set KILN_RPC_TRACKER")
    queues = tracker_summary(address, _State.settings.rpc_timeout_s)
    table = Table(title=f"RPC devices at {address}")
    for col in ("key", "servers", "free", "pending"):
        table.add_column(col, justify="left" if col == "key" else "right")
    for q in queues:
        table.add_row(q.key, str(q.total), str(q.free), str(q.pending))
    console.print(table)
    if not queues:
        console.print(
            f"no servers registered; start one with `kiln rpc server --tracker {address} --key KEY`"
        )


def _log_to_console() -> None:
    """Long-running commands (serve, worker) say what they do at INFO level."""
    for name in ("tuner", "service"):
        logging.getLogger(name).setLevel(logging.INFO)


@app.command()
def submit(
    model: ModelArg,
    target: TargetOpt = "host",
    trials: Annotated[int, typer.Option(help="Total measured trials over all tasks")] = 64,
    per_task: PerTaskOpt = None,
    input_shape: ShapeOpt = None,
    seed: SeedOpt = 0,
    cost_model: CostModelOpt = "xgb",
    rpc_tracker: Annotated[str | None, typer.Option(help="Measure on RPC devices: tracker host:port")] = None,
    rpc_key: Annotated[str | None, typer.Option(help="Device key at the RPC tracker")] = None,
    name: NameOpt = None,
    owner: OwnerOpt = "",
) -> None:
    """Queue a tuning job for the workers (`kiln serve` or `kiln worker`) and print its id."""
    runner: dict[str, Any] = {"kind": "local"}
    if rpc_tracker or rpc_key:
        runner = {"kind": "rpc", "tracker": rpc_tracker or _State.settings.rpc_tracker, "key": rpc_key}
    spec = _job_spec(target, trials, per_task, seed, input_shape, cost_model, runner)
    info, job = _queue(_store(), model, spec, name, owner)
    console.print(f"queued job [bold]{job.id}[/] for model {info.name} on {job.target_key}")


def _job_spec(
    target: str,
    trials: int,
    per_task: int | None,
    seed: int,
    input_shape: list[str] | None,
    cost_model: str,
    runner: dict[str, Any],
) -> JobSpec:
    """The job the tune and submit options ask for, on a model not yet stored."""
    from tuner.frontend import parse_input_shapes

    return JobSpec(
        model_id="",
        target=target,  # type: ignore[arg-type]  # resolved by _queue
        trials=trials,
        max_trials_per_task=per_task,
        seed=seed,
        input_shapes=parse_input_shapes(input_shape or []),
        runner=runner,
        cost_model=cost_model,
    )


def _queue(store: Store, model: Path, spec: JobSpec, name: str | None, owner: str) -> tuple[ModelInfo, Job]:
    """Check ``spec`` (all but its model), import and store ``model``, and queue the job on it.

    A bad spec fails before the model is imported, so nothing is stored for it.
    """
    from tuner.job import submit_job, validate_spec
    from tuner.models import register_model

    validate_spec(spec)
    _check_owner(store, owner)
    info, _ = register_model(
        store, _State.settings, model, name=name, input_shapes=dict(spec.input_shapes), owner=owner
    )
    return info, submit_job(store, dataclasses.replace(spec, model_id=info.id), owner)


def _check_owner(store: Store, owner: str) -> None:
    """An owner must be the name of an API token (in the database or KILN_API_TOKENS), or nobody."""
    from tuner.tokens import parse_tokens

    if not owner:
        return
    known = {name for name, _ in store.list_tokens()} | set(parse_tokens(_State.settings.api_tokens).values())
    if owner not in known:
        raise InvalidSpec(
            f"no API token is named {owner!r}; create one with `kiln token create {owner}` "
            "(or list them with `kiln token list`)"
        )


@app.command()
def cancel(job_id: Annotated[str, typer.Argument(help="Job id")]) -> None:
    """Cancel a job: a queued one at once; a running one stops within seconds, keeping its records."""
    job = _store().request_cancel(job_id)
    console.print(
        f"job {job.id}: {'cancel requested' if job.status.value == 'running' else job.status.value}"
    )


@app.command()
def serve(
    host: Annotated[
        str | None, typer.Option(help="Address to bind (env KILN_HOST; default 127.0.0.1)")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port (env KILN_PORT; default 8000)")] = None,
    workers: Annotated[
        int | None, typer.Option("--workers", help="Embedded workers (env KILN_EMBEDDED_WORKERS; default 1)")
    ] = None,
    insecure: Annotated[
        bool, typer.Option("--insecure", help="Allow a non-loopback address without API tokens")
    ] = False,
    max_upload_mb: Annotated[int | None, typer.Option(help="Largest upload (env KILN_MAX_UPLOAD_MB)")] = None,
) -> None:
    """Serve the REST API (docs at /docs) with embedded workers; SQLite by default."""
    import uvicorn

    # The web layer sits on top of the core; only this command reaches up to it.
    from service.app import create_app

    overrides: dict[str, Any] = {
        k: v
        for k, v in {
            "host": host,
            "port": port,
            "embedded_workers": workers,
            "max_upload_mb": max_upload_mb,
        }.items()
        if v is not None
    }
    if insecure:
        overrides["insecure"] = True
    settings = _State.settings.model_copy(update=overrides)
    store = _store_for(settings)
    from service.auth import is_loopback

    public = not is_loopback(settings.host)
    has_tokens = bool(settings.api_tokens or store.has_tokens())
    if public and not settings.insecure:
        if not has_tokens:
            raise InvalidSpec(
                f"refusing to serve on {settings.host} without API tokens: anyone on the network could "
                "upload and run code. Set KILN_API_TOKENS=name:token, create one with `kiln token create "
                "NAME`, or pass --insecure"
            )
        if settings.auth == "off":
            raise InvalidSpec(
                f"refusing to serve on {settings.host} with KILN_AUTH=off: anyone on the network could "
                "upload and run code; pass --insecure to do it anyway"
            )
    if settings.insecure and settings.auth is None and not has_tokens:
        settings = settings.model_copy(update={"auth": "off"})
    _log_to_console()
    app_ = create_app(settings, store=store)
    required = app_.state.kiln.auth.required
    shown = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    console.print(
        f"Kiln serving on [bold]http://{shown}:{settings.port}/[/] (API docs at /docs) with "
        f"{settings.embedded_workers} embedded worker(s); database {store}; API tokens "
        f"{'required' if required else 'not required (KILN_AUTH=off or no token at start-up)'}"
    )
    uvicorn.run(app_, host=settings.host, port=settings.port, log_level="info", timeout_graceful_shutdown=10)


@app.command()
def worker(
    name: Annotated[str | None, typer.Option(help="Worker name (default host:pid)")] = None,
    once: Annotated[bool, typer.Option("--once", help="Run at most one job, then exit")] = False,
) -> None:
    """Run a standalone worker against the database (many of them, on many machines, with PostgreSQL)."""
    from tuner.worker import Worker, stop_on_signals

    settings = _State.settings
    _log_to_console()
    runner = Worker(settings, name, _store_for(settings))
    stop_on_signals(runner.stop)
    console.print(f"worker [bold]{runner.name}[/] serving jobs from {runner.store}")
    if once:
        runner.run_once()
    else:
        runner.run_forever()


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Argument(help="Who the token is for; owns what it creates")],
) -> None:
    """Create an API token (printed once; only its hash is stored). The API then requires tokens."""
    from tuner.tokens import new_token, token_sha256

    if not name.strip() or len(name) > 64:
        raise InvalidSpec("a token name must be 1 to 64 characters")
    token = new_token()
    _store().add_token(name.strip(), token_sha256(token))
    console.print(f"token for [bold]{name}[/] (shown only now): ")
    print(token)


@token_app.command("list")
def token_list() -> None:
    """List token names (tokens themselves are not stored)."""
    table = Table(title="API tokens")
    table.add_column("name")
    table.add_column("created")
    for name, created in _store().list_tokens():
        table.add_row(name, created.strftime("%Y-%m-%d %H:%M"))
    console.print(table)


@token_app.command("revoke")
def token_revoke(name: Annotated[str, typer.Argument(help="Token name")]) -> None:
    """Revoke a token."""
    _store().delete_token(name)
    console.print(f"token {name} revoked")


def main() -> None:
    """Entry point of the ``kiln`` console script: typed errors become one readable line."""
    try:
        app()
    except TuningFailed as exc:
        err_console.print(f"[bold red]job failed:[/] {exc.message}")
        sys.exit(1)
    except KilnError as exc:
        err_console.print(f"[bold red]error ({exc.kind}):[/] {exc.message}")
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("interrupted; records measured so far are kept")
        sys.exit(130)


if __name__ == "__main__":
    main()
