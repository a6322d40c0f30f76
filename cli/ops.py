"""Operations commands: ``serve`` and ``worker``, ``machine``, ``db``, ``rpc`` (tracker, server, devices),
``token``."""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

import typer
from rich.table import Table

from cli.app import app, current_settings, db_app, open_store, open_store_for, rpc_app, token_app
from cli.render import console
from tuner.errors import InvalidSpec


def log_to_console() -> None:
    """Long-running commands (serve, worker) say what they do at INFO level."""
    for name in ("tuner", "service"):
        logging.getLogger(name).setLevel(logging.INFO)


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
    from tuner.jobs.target_check import keep_host_target

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
    settings = current_settings().model_copy(update=overrides)
    store = open_store_for(settings)
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
    log_to_console()
    keep_host_target(settings.data_dir)
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
    from tuner.jobs.target_check import keep_host_target
    from tuner.jobs.worker import Worker, stop_on_signals

    settings = current_settings()
    log_to_console()
    keep_host_target(settings.data_dir)
    runner = Worker(settings, name, open_store_for(settings))
    stop_on_signals(runner.stop)
    console.print(f"worker [bold]{runner.name}[/] serving jobs from {runner.store}")
    if once:
        runner.run_once()
    else:
        runner.run_forever()


@app.command()
def machine(
    target: Annotated[
        str, typer.Option("--target", help="'host' (this CPU) or a TVM CPU target as JSON")
    ] = "host",
    measure: Annotated[
        bool, typer.Option("--measure", help="Measure again, replacing the figures kept for this host")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")] = False,
) -> None:
    """This machine's roofs: its fp32 FMA peak (one thread and all) and its memory bandwidth, measured once
    per host and target and kept in the database (the profiles' roofline)."""
    from tuner.targets import is_host_cpu, resolve_target
    from tuner.timing.profile import host_key, host_limits, measure_host_limits

    resolved = resolve_target(target)
    if not is_host_cpu(resolved):
        raise InvalidSpec(
            f"target {target!r} does not run on this machine: its limits cannot be measured here"
        )
    store = open_store()
    if measure:
        limits = store.save_machine_limits(host_key(resolved), measure_host_limits(resolved))
    else:
        limits = host_limits(store, resolved)
    if as_json:
        print(json.dumps(limits.as_dict(), indent=2))
        return
    table = Table(title=f"Measured limits of this machine ({resolved.get('mcpu', 'llvm')})")
    table.add_column("limit")
    table.add_column("value", justify="right")
    table.add_row(f"fp32 FMA peak, {limits.threads} thread(s)", f"{limits.peak_gflops:.1f} GFLOP/s")
    table.add_row("fp32 FMA peak, 1 thread", f"{limits.peak_gflops_one_thread:.1f} GFLOP/s")
    table.add_row(
        f"memory bandwidth (STREAM triad), {limits.threads} thread(s)", f"{limits.bandwidth_gbs:.1f} GB/s"
    )
    table.add_row("ridge point", f"{limits.ridge_intensity:.1f} FLOP/byte")
    if limits.int8_gops is not None:
        table.add_row(
            f"int8 peak ({limits.int8_instruction}), {limits.threads} thread(s)",
            f"{limits.int8_gops:.1f} GOP/s",
        )
    if limits.bf16_gflops is not None:
        table.add_row(
            f"bf16 peak ({limits.bf16_instruction}), {limits.threads} thread(s)",
            f"{limits.bf16_gflops:.1f} GFLOP/s",
        )
    console.print(table)
    measured = limits.measured_at.isoformat(timespec="seconds") if limits.measured_at else "now"
    console.print(f"{limits.how}; measured {measured} on {limits.host} (--measure: again)", highlight=False)
    if limits.disturbed:
        console.print(
            f"[yellow]other processes used {100 * (limits.other_cpu_share or 0):.0f} % of the CPUs through every "
            f"try: these figures may be low (best of {limits.measurements} measurement(s); the next jobs "
            "measure them again)[/yellow]",
            highlight=False,
        )


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Upgrade the database schema to this version of Kiln."""
    from tuner.store.sql import Store

    store = Store.from_settings(current_settings())
    before = store.current_revision()
    store.upgrade()
    console.print(f"database {store}: {before or 'empty'} -> {store.current_revision()}")


@db_app.command("current")
def db_current() -> None:
    """Print the schema revision of the database and the one this Kiln needs."""
    from tuner.store.sql import Store

    store = Store.from_settings(current_settings())
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
    tracker_wait: Annotated[
        float, typer.Option(help="Seconds to keep trying a tracker that does not answer yet")
    ] = 60.0,
) -> None:
    """Run a TVM RPC server (a measurement device) registered at a tracker, until Ctrl-C or SIGTERM."""
    from tuner.rpc.processes import run_until_stopped, start_server, stop_on_sigterm

    timeout = current_settings().rpc_timeout_s
    stop = stop_on_sigterm()
    server = start_server(
        tracker,
        key,
        host,
        port,
        silent=not logging.getLogger().isEnabledFor(logging.INFO),
        timeout_s=timeout,
        tracker_wait_s=tracker_wait,
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

    address = tracker or current_settings().rpc_tracker
    if not address:
        raise InvalidSpec("no tracker given: pass --tracker HOST:PORT or set KILN_RPC_TRACKER")
    queues = tracker_summary(address, current_settings().rpc_timeout_s)
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


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Argument(help="Who the token is for; owns what it creates")],
) -> None:
    """Create an API token (printed once; only its hash is stored). The API then requires tokens."""
    from tuner.tokens import new_token, token_sha256

    if not name.strip() or len(name) > 64:
        raise InvalidSpec("a token name must be 1 to 64 characters")
    token = new_token()
    open_store().add_token(name.strip(), token_sha256(token))
    console.print(f"token for [bold]{name}[/] (shown only now): ")
    print(token)


@token_app.command("list")
def token_list() -> None:
    """List token names (tokens themselves are not stored)."""
    table = Table(title="API tokens")
    table.add_column("name")
    table.add_column("created")
    for token in open_store().list_tokens():
        table.add_row(token.name, token.created_at.strftime("%Y-%m-%d %H:%M"))
    console.print(table)


@token_app.command("revoke")
def token_revoke(name: Annotated[str, typer.Argument(help="Token name")]) -> None:
    """Revoke a token."""
    open_store().delete_token(name)
    console.print(f"token {name} revoked")
